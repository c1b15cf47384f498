"""The GitOps review of a change: preview the stacks it touches with the policy pack, lint the
runbook, dry-run it in check mode, and write the verdict as a pull-request comment (Markdown).

`python -m review --help`; `make review` and scripts/review.sh call it. It sits beside
`components/` and `policy/` (it imports those and the core, never the lab): whatever needs the
lab (its kubeconfig, its Pulumi state) is passed in by the caller.
"""

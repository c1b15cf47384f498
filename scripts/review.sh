#!/usr/bin/env bash
# What a reviewer needs for a pull request, in one command:
#   1. pulumi preview --diff of the lab stack, with the autoheal policy pack (policy/)
#   2. ansible-lint of playbooks/ and roles/
#   3. promtool / amtool checks of the shipped monitoring files (monitoring/)
#   4. an ansible-playbook --check dry run of the XID runbook (syntax check without a lab)
# Each section says SKIPPED and why when its tool or files are absent, and never fails silently:
# the exit status is non-zero if any section that ran failed.
#
# Environment: STACK (default lab), AUTOHEAL_PULUMI_STATE (default .pulumi/review: the file
# backend holding the stack's state), LAB_DIR (default .lab/default: its kubeconfig and
# slurm/slurm.conf are the lab the preview and the dry run talk to),
# REVIEW_SKIP (space-separated section names to skip: preview lint monitoring dryrun).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${AUTOHEAL_VENV:-$ROOT/.venv}
PY=$VENV/bin/python
STACK=${STACK:-lab}
STATE=${AUTOHEAL_PULUMI_STATE:-$ROOT/.pulumi/review}
LAB_DIR=${LAB_DIR:-$ROOT/.lab/default}
LAB_KUBECONFIG=${LAB_KUBECONFIG:-$LAB_DIR/kubeconfig}
LAB_SLURM_CONF=${LAB_SLURM_CONF:-$LAB_DIR/slurm/slurm.conf}
SKIP=" ${REVIEW_SKIP:-} "
PATH=$VENV/bin:$HOME/.cache/autoheal/bin:$PATH

failed=()
ran=0
section() { printf '\n\033[1m=== %s ===\033[0m\n' "$*"; }
skipped() { printf 'SKIPPED: %s\n' "$*"; }
result() { # name rc
  ran=$((ran + 1))
  if [[ $2 -eq 0 ]]; then printf 'OK: %s\n' "$1"; else printf 'FAILED: %s (exit %s)\n' "$1" "$2"; failed+=("$1"); fi
}
wanted() { [[ $SKIP != *" $1 "* ]]; }

slurm_reachable() {
  [[ -f $LAB_SLURM_CONF ]] && command -v scontrol >/dev/null &&
    SLURM_CONF=$LAB_SLURM_CONF timeout 10 scontrol ping >/dev/null 2>&1
}

lab_reachable() {
  [[ -f $LAB_KUBECONFIG ]] && command -v kubectl >/dev/null &&
    kubectl --kubeconfig "$LAB_KUBECONFIG" --request-timeout=5s get --raw /readyz >/dev/null 2>&1
}

# --- 1. pulumi preview --------------------------------------------------------------------------
section "pulumi preview --diff --policy-pack policy (stack $STACK)"
if ! wanted preview; then
  skipped "REVIEW_SKIP has preview"
elif ! command -v pulumi >/dev/null; then
  skipped "no pulumi CLI on PATH or in ~/.cache/autoheal/bin (scripts/build-tools.sh builds it)"
elif [[ ! -f Pulumi.$STACK.yaml ]]; then
  skipped "no Pulumi.$STACK.yaml"
elif [[ $STACK == lab ]] && ! lab_reachable; then
  skipped "the lab's Kubernetes API is not reachable at $LAB_KUBECONFIG (start it: autoheal lab up)"
else
  # Offline, local state, no plugin downloads: the same environment the lab uses.
  eval "$("$PY" - "$STATE" <<'PY'
import shlex, sys
from pathlib import Path
from lab.pulumi_env import pulumi_env
env = pulumi_env(Path(sys.argv[1]))
for k in ("PATH", "PULUMI_BACKEND_URL", "PULUMI_HOME", "PULUMI_CONFIG_PASSPHRASE",
          "PULUMI_SKIP_UPDATE_CHECK", "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION",
          "PULUMI_PYTHON_CMD"):
    print(f"export {k}={shlex.quote(env[k])}")
PY
  )"
  pulumi stack select "$STACK" --create --non-interactive >/dev/null 2>&1 ||
    pulumi stack init "$STACK" --non-interactive
  # The lab stack previews against the lab whose API was found reachable above ($LAB_KUBECONFIG),
  # whatever Pulumi.lab.yaml says: a copy of its config with the kubeconfig replaced.
  cfg_args=()
  cfg=""
  if [[ $STACK == lab ]]; then
    cfg=$(mktemp --suffix=.yaml)
    "$PY" - "Pulumi.$STACK.yaml" "$LAB_KUBECONFIG" "$cfg" <<'PY'
import sys
from pathlib import Path
import yaml
src, kubeconfig, dst = sys.argv[1:]
doc = yaml.safe_load(Path(src).read_text())
doc["config"]["autoheal:cluster"]["kubeconfig"] = str(Path(kubeconfig).resolve())
Path(dst).write_text(yaml.safe_dump(doc, sort_keys=False))
PY
    cfg_args=(--config-file "$cfg")
  fi
  # The engine runs the pack (PulumiPolicy.yaml, runtime python) through the language host's
  # RunPlugin; a mandatory violation fails the preview and is listed under "Policies:".
  out=$(mktemp)
  pulumi preview --stack "$STACK" "${cfg_args[@]}" --diff --policy-pack policy --non-interactive 2>&1 |
    tee "$out"
  rc=${PIPESTATUS[0]}
  if [[ $rc -ne 0 ]] && grep -q "RunPlugin not implemented" "$out"; then
    # Only for a language host built before it could start policy packs (rebuild it:
    # scripts/build-tools.sh --only pulumi): preview without the pack and judge the previewed
    # resources with the same rules (policy/preview_check.py).
    echo "NOTE: this Pulumi language host cannot run policy packs (rebuild it: scripts/build-tools.sh --only pulumi); applying policy/rules.py to the preview"
    pulumi preview --stack "$STACK" "${cfg_args[@]}" --diff --non-interactive
    result "pulumi preview --diff" $?
    pulumi preview --stack "$STACK" "${cfg_args[@]}" --json --show-sames --non-interactive |
      "$PY" -m policy.preview_check
    result "policy rules on the preview" $?
  else
    result "pulumi preview --diff + policy pack" "$rc"
  fi
  rm -f "$out" ${cfg:+"$cfg"}
fi

# --- 2. ansible-lint ----------------------------------------------------------------------------
section "ansible-lint"
if ! wanted lint; then
  skipped "REVIEW_SKIP has lint"
elif [[ ! -d playbooks ]]; then
  skipped "no playbooks/ folder"
elif ! command -v ansible-lint >/dev/null; then
  skipped "ansible-lint is not installed (pip install -e '.[dev]')"
else
  targets=(playbooks)
  [[ -d roles ]] && targets+=(roles)
  ansible-lint --offline "${targets[@]}"
  result "ansible-lint ${targets[*]}" $?
fi

# --- 3. monitoring files ------------------------------------------------------------------------
section "promtool / amtool on monitoring/"
if ! wanted monitoring; then
  skipped "REVIEW_SKIP has monitoring"
elif [[ ! -d monitoring ]]; then
  skipped "no monitoring/ folder"
else
  shopt -s nullglob
  rules=(monitoring/*.rules.yml monitoring/*.rules.yaml)
  rule_tests=(monitoring/tests/*.yml monitoring/tests/*.yaml)
  if ! command -v promtool >/dev/null; then
    skipped "promtool is not installed (Debian: prometheus)"
  elif ((${#rules[@]} == 0)); then
    skipped "no monitoring/*.rules.yml"
  else
    promtool check rules "${rules[@]}"
    result "promtool check rules" $?
    if ((${#rule_tests[@]})); then
      (cd monitoring && promtool test rules "${rule_tests[@]#monitoring/}")
      result "promtool test rules" $?
    fi
    if [[ -f monitoring/prometheus.yml ]]; then
      promtool check config --syntax-only monitoring/prometheus.yml
      result "promtool check config" $?
    fi
  fi
  if ! command -v amtool >/dev/null; then
    skipped "amtool is not installed (Debian: prometheus-alertmanager)"
  elif [[ ! -f monitoring/alertmanager.yml ]]; then
    skipped "no monitoring/alertmanager.yml"
  else
    amtool check-config monitoring/alertmanager.yml
    result "amtool check-config" $?
  fi
  shopt -u nullglob
fi

# --- 4. runbook dry run -------------------------------------------------------------------------
section "ansible-playbook --check (XID runbook)"
RUNBOOK=playbooks/gpu_fatal_xid.yml
if ! wanted dryrun; then
  skipped "REVIEW_SKIP has dryrun"
elif [[ ! -f $RUNBOOK ]]; then
  skipped "no $RUNBOOK"
elif ! command -v ansible-playbook >/dev/null; then
  skipped "ansible-playbook is not installed"
else
  vars=$(mktemp)
  trap 'rm -f "$vars"' EXIT
  cat >"$vars" <<JSON
{"autoheal_nodes": ["gpu-1"], "autoheal_incident_ids": ["review-dry-run"], "autoheal_xid": 79,
 "autoheal_gpu": 0, "autoheal_tier": "replace", "autoheal_backend": "none"}
JSON
  ansible-playbook --syntax-check "$RUNBOOK"
  result "ansible-playbook --syntax-check" $?
  if lab_reachable && slurm_reachable; then
    SLURM_CONF=$LAB_SLURM_CONF ansible-playbook --check --diff "$RUNBOOK" -e "@$vars" \
      -e "autoheal_kubeconfig=$LAB_KUBECONFIG" -e "autoheal_slurm_conf=$LAB_SLURM_CONF"
    result "ansible-playbook --check against the lab" $?
  else
    skipped "check-mode run: the lab's Kubernetes API and slurmctld ($LAB_DIR) are not both reachable; only the syntax was checked"
  fi
fi

section "summary"
if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
printf '%d checks passed\n' "$ran"

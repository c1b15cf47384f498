"""The autoheal remediation runner: Alertmanager webhook -> incident -> policy -> playbook.

Modules, one job each:
  models     Alertmanager's v4 webhook payload (pydantic, bounded)
  auth       bearer token from a file, compared in constant time
  rules      EDA-rulebook-shaped routing rules (alert -> playbook, extra vars, throttle, dry run)
  incidents  alert -> typed Incident (validated node, XID, GPU, tier) and dedup into the journal
  committer  group commit: many deliveries share one durable SQLite commit
  journal    SQLite (WAL): alerts, incidents (the queue), runs, steps, timeline, settings
  policy     opt-out, budgets, latching circuit breaker, per-node cap, escalation, dry run
  kube       node/pod label reads for opt-out and pools (real client, fake, null)
  executor   ansible-runner with validated extra vars, per-node locks, timeouts, cancel
  worker     the queue consumer: the loop, the runner lock, leadership; its rooms below
  rounds     one tick: cancels, the policy's decisions once a batch window closes, then batches
  batches    admitted incidents into batches and runs; fence first in a storm
  runs       a run's launch and run: its journal row, its thread, the play under node locks
  finish     a run's end: record it and close its incidents from the play's phase reports
  recovery   resume the runs a dead runner (or a former leader) left "running"
  inflight   what the worker has under way: runs, their nodes, fence-first marks (with a table)
  ingest     a run's phase reports into the journal's timeline and the phase metrics
  closing    tell that an incident closed: metrics, sinks, one page per pool out of spares
  notify     JSON webhook and Slack sinks, retried on a background thread
  metrics    Prometheus metrics in the runner's own registry
  app        the starlette app: POST /webhook, /healthz, /readyz, /metrics
  runtime    wiring from a RunnerConfig; config: the runner's YAML/env config
  manual     on-call verbs (pause, resume, breaker reset, cancel, run by hand); cli: typer

Playbook contract (extra vars the runner passes to playbooks/<name>.yml):
  autoheal_nodes (list[str], a batch), autoheal_incident_ids (list[str], parallel),
  autoheal_xid (int), autoheal_gpu (int|null), autoheal_tier ("reset"|"replace"),
  autoheal_opt_out (bool: fence + notify only), autoheal_dry_run (bool; the run uses --check),
  autoheal_grace_seconds (int), autoheal_journal_events (path: append JSON lines
  {"incident", "node", "phase", "status": "start|ok|failed", "ts"}), and
  autoheal_done_phases ({node: [phase, ...]}: phases already reported ok, e.g. before a crash; the
  shipped runbook's steps are idempotent, so a rerun re-checks them and changes nothing), and
  autoheal_stop_after ("" or "fenced": the worker's fence lane asks the play to fence, report
  `fenced` and end; the rest of the runbook follows in a run of its own), autoheal_fault_time
  (float: when the batch's first incident opened; restart_app requeues only jobs started by then),
  autoheal_version (the release that acts; the audit role labels its Events with it),
  autoheal_signal_ledger (path, one per run: the jobs the warm fence or the play's fence step
  signalled, so neither signals a job twice and a job already gone is still requeued).
"""

"""Stand-in for a runbook phase: reports start/ok to the journal-events file, records a visible
side effect per node (so tests can count destructive steps), can sleep and can fail on demand.

argv: PHASES EVENTS_PATH JSON({"nodes", "ids", "done", "dry"}); PHASES is comma-separated and run
in order (one process for the whole play keeps the stub cheap on a loaded machine).
env:  AUTOHEAL_STUB_EFFECTS (file to append "phase node" lines), AUTOHEAL_STUB_SLEEP_PHASE +
      AUTOHEAL_STUB_SLEEP (seconds to sleep in that phase), AUTOHEAL_STUB_SLEEP_ONCE (marker
      file: sleep only once), AUTOHEAL_STUB_FAIL_PHASE, AUTOHEAL_STUB_IGNORE_DONE (redo done phases,
      like the real runbook's idempotent steps do), AUTOHEAL_STUB_DETAIL_<PHASE> (the detail the
      phase reports, e.g. the pool of a `no_spare`), AUTOHEAL_STUB_REPORT_FAILED (comma-separated
      phases that report `failed` and go on, as the ladder's reset does before it climbs).
"""

import json
import os
import sys
import time


def main() -> int:
    phases, events_path, raw = sys.argv[1], sys.argv[2], sys.argv[3]
    if phases != "fenced":  # AUTOHEAL_STUB_PHASES: the real runbook's phases (a fence-only run keeps its one)
        phases = os.environ.get("AUTOHEAL_STUB_PHASES", phases)
    spec = json.loads(raw)
    for phase in phases.split(","):
        if run_phase(phase, events_path, spec):
            return 1
    return 0


def run_phase(phase: str, events_path: str, spec: dict) -> bool:
    """Run one phase for the batch; True when it failed."""
    done = {} if os.environ.get("AUTOHEAL_STUB_IGNORE_DONE") else spec.get("done", {})
    todo = [(n, i) for n, i in zip(spec["nodes"], spec["ids"], strict=True) if phase not in done.get(n, [])]
    if not todo:
        return False

    detail = os.environ.get(f"AUTOHEAL_STUB_DETAIL_{phase.upper()}")

    def emit(node: str, iid: str, status: str) -> None:
        ev = {"incident": iid, "node": node, "phase": phase, "status": status, "ts": time.time()}
        if detail and status != "start":
            ev["detail"] = detail
        with open(events_path, "a") as fh:
            fh.write(json.dumps(ev) + "\n")

    for node, iid in todo:
        emit(node, iid, "start")
    effects = os.environ.get("AUTOHEAL_STUB_EFFECTS")
    if effects:
        with open(effects, "a") as fh:
            for node, _ in todo:
                fh.write(f"{'dry ' if spec.get('dry') else ''}{phase} {node}\n")
    once = os.environ.get("AUTOHEAL_STUB_SLEEP_ONCE")  # a marker file: sleep the first time only
    if os.environ.get("AUTOHEAL_STUB_SLEEP_PHASE") == phase and not (once and os.path.exists(once)):
        if once:
            open(once, "w").close()
        time.sleep(float(os.environ.get("AUTOHEAL_STUB_SLEEP", "5")))
    failed = os.environ.get("AUTOHEAL_STUB_FAIL_PHASE") == phase
    reported = phase in os.environ.get("AUTOHEAL_STUB_REPORT_FAILED", "").split(",")
    for node, iid in todo:
        emit(node, iid, "failed" if failed or reported else "ok")
    return failed


if __name__ == "__main__":
    sys.exit(main())

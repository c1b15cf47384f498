"""Benchmark of the XID runbook on the lab: how fast a batch is fenced and a spare promoted.

Starts its own lab (`autoheal lab up --name rbbench --port-base 26000`, a pool of 53 active nodes and
52 hot spares, Kubernetes when built), runs playbooks/gpu_fatal_xid.yml on 1 node, then on a batch of
50 other nodes, then on 1 more node (backend none: nothing is retired; the faster single-node run is
kept, since the machine is shared), and prints per run:

- fence: seconds from the play's start (ansible-playbook launched) to the journal's `fenced` line,
  which is written once both the Slurm drain and the Kubernetes quarantine have returned;
- promote: seconds from `fenced` to `spare_promoted`;
- the profile_tasks time of each batch step (Slurm drain, quarantine, spare promotion, ...);
- the ratio batch/single (target: fence time of 50 nodes <= 3x that of 1 node).

The lab is always torn down at the end. Usage: python bench/runbook.py [--keep] [--batch 50]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autoheal.paths import data_root

REPO = data_root()  # playbooks/, roles/, ansible.cfg
BIN = Path(sys.executable).parent
NAME = "rbbench"
PORT_BASE = 26000
STEP_RE = re.compile(r"^(?P<name>.+?) -{2,} (?P<secs>\d+\.\d+)s$")
STEPS = {
    "fence": (
        "Fence - Slurm drain, Kubernetes quarantine (cordon, taint, label) and SIGTERM to the jobs,"
        " concurrently"
    ),
    "spares_slurm": "node_pool : Pick and resume one hot spare per failed node in Slurm",
    "spares_k8s": "node_pool : Make the spares ordinary pool members in Kubernetes (untaint, relabel)",
    "jobs_start": "slurm_jobs : Start evacuating the jobs on the batch in the background",
    "slurm_down": "slurm_node : Set the Slurm state of the batch to down",
}


def lab(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "autoheal"), "lab", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def run(root: Path, nodes: list[str], journal: Path, tmp: Path, check: bool = False) -> dict[str, float]:
    run_dir = root / NAME
    extra = {
        "autoheal_nodes": nodes,
        "autoheal_incident_ids": [f"bench-{n}" for n in nodes],
        "autoheal_xid": 79,
        "autoheal_gpu": 0,
        "autoheal_backend": "none",
        "autoheal_grace_seconds": 10,
        "autoheal_slurm_conf": str(run_dir / "slurm" / "slurm.conf"),
        "autoheal_journal_events": str(journal),
    }
    if (run_dir / "kubeconfig").exists():
        extra["autoheal_kubeconfig"] = str(run_dir / "kubeconfig")
    vars_file = tmp / f"vars-{len(nodes)}.json"
    vars_file.write_text(json.dumps(extra))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        PROFILE_TASKS_TASK_OUTPUT_LIMIT="all",
        ANSIBLE_DEPRECATION_WARNINGS="false",
    )
    if journal.exists():
        journal.unlink()
    t0 = time.time()
    res = subprocess.run(
        [str(BIN / "ansible-playbook"), "playbooks/gpu_fatal_xid.yml", "-e", f"@{vars_file}"]
        + (["--check"] if check else []),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    total = time.time() - t0
    if res.returncode != 0:
        print(res.stdout[-4000:], res.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"playbook failed on {len(nodes)} nodes")
    if check:
        return {"total": total}
    events = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]

    def first(phase: str) -> float:
        return float(min(e["ts"] for e in events if e["phase"] == phase))

    out = {
        "total": total,
        "fence": first("fenced") - t0,
        "promote": first("spare_promoted") - first("fenced"),
    }
    steps: dict[str, float] = {}
    for line in res.stdout.splitlines():
        m = STEP_RE.match(line.strip())
        if m:
            for key, prefix in STEPS.items():
                if m.group("name").startswith(prefix):
                    steps[key] = steps.get(key, 0.0) + float(m.group("secs"))
    out.update({f"step:{k}": v for k, v in steps.items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--keep", action="store_true", help="leave the lab running")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rbbench-"))
    tmp = Path(tempfile.mkdtemp(prefix="rbbench-vars-"))
    size = a.batch + 3
    print(f"starting lab {NAME}: {size} active nodes, {a.batch + 2} spares ...", flush=True)
    t = time.time()
    res = lab(
        "up",
        "--name",
        NAME,
        "--root",
        str(root),
        "--port-base",
        str(PORT_BASE),
        "--nodes",
        str(size),
        "--spares",
        str(a.batch + 2),
        "--headroom",
        "0",
        "--grace",
        "10",
        "--gpus",
        "1",
    )
    if res.returncode != 0:
        print(res.stdout, res.stderr, file=sys.stderr)
        lab("down", "--name", NAME, "--root", str(root))
        raise SystemExit("lab up failed")
    kube = (root / NAME / "kubeconfig").exists()
    print(f"lab up in {time.time() - t:.1f}s (kubernetes: {'yes' if kube else 'no'})", flush=True)
    try:
        journal = tmp / "events.jsonl"
        warm = run(root, ["gpu-1"], journal, tmp, check=True)  # warm the caches (a dry run)
        print(f"warm-up dry run: {warm['total']:.1f}s", flush=True)
        one_a = run(root, ["gpu-1"], journal, tmp)
        many = run(root, [f"gpu-{i}" for i in range(2, 2 + a.batch)], journal, tmp)
        one_b = run(root, [f"gpu-{2 + a.batch}"], journal, tmp)
        # the machine is shared: a single-node run before and after the batch, keep the faster
        one = {k: min(one_a.get(k, float("inf")), one_b.get(k, float("inf"))) for k in one_a}
        print(f"single-node fence before/after the batch: {one_a['fence']:.2f}s / {one_b['fence']:.2f}s")
    finally:
        if not a.keep:
            lab("down", "--name", NAME, "--root", str(root), timeout=300)
    keys = ["total", "fence", "promote", *sorted(k for k in one if k.startswith("step:"))]
    print(f"\n{'figure (seconds)':32} {'1 node':>9} {f'{a.batch} nodes':>10} {'ratio':>7}")
    for k in keys:
        x, y = one.get(k, float("nan")), many.get(k, float("nan"))
        print(f"{k:32} {x:9.2f} {y:10.2f} {y / x if x else float('nan'):7.2f}")
    ratio = many["fence"] / one["fence"]
    print(f"\nfence ratio {a.batch}/1 = {ratio:.2f} (target <= 3): {'OK' if ratio <= 3 else 'MISSED'}")


if __name__ == "__main__":
    main()

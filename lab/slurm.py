"""The lab's real Slurm: munged, slurmctld and one slurmd per simulated GPU node on one host.

Debian's slurmd is built with MULTIPLE_SLURMD, so each node is `slurmd -N <node>` on its own port.
GPUs are character devices made with mknod (count-only GRES would leave nodes INVAL).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autoheal import proc
from autoheal.errors import LabError
from autoheal.slurmconf import render_gres_conf, render_slurm_conf
from lab import procs
from lab.config import LabConfig

REQUIRED = {
    "munged": "munge",
    "mungekey": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "scontrol": "slurm-client",
}


def check_installed() -> None:
    for binary, pkg in REQUIRED.items():
        if shutil.which(binary) is None and not Path(f"/usr/sbin/{binary}").exists():
            raise LabError(f"{binary}: not installed (Debian package {pkg}); run scripts/bootstrap.sh")


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def run(cfg: LabConfig, argv: Sequence[str], timeout: float = 30.0) -> str:
    """Run a Slurm client command against this lab and return stdout; raise LabError on failure."""
    env = dict(os.environ, **cfg.slurm_env())
    try:
        res = subprocess.run(
            list(argv), env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{argv[0]}: timed out after {timeout}s") from exc
    if res.returncode != 0:
        raise LabError(f"{' '.join(argv)}: exit {res.returncode}: {res.stderr.strip()}")
    return res.stdout


def write_config(cfg: LabConfig) -> None:
    spec = cfg.slurm_spec()
    for d in (spec.state_dir, spec.spool_dir, spec.run_dir, spec.gres_dev_dir, spec.log_dir):
        Path(d).mkdir(parents=True, exist_ok=True)
    max_gpus = max(p.gpus_per_node for p in cfg.pools)
    for i in range(max_gpus):
        dev = Path(spec.gres_dev_dir) / f"nvidia{i}"
        if not dev.exists():
            os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null twin
    cfg.slurm_conf.write_text(render_slurm_conf(spec))
    (cfg.slurm_conf.parent / "gres.conf").write_text(render_gres_conf(spec))


def start_munge(cfg: LabConfig) -> None:
    d = cfg.run_dir / "munge"
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    key = d / "munge.key"
    if not key.exists():
        subprocess.run([_bin("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
    key.chmod(0o600)
    cfg.socket_dir.mkdir(parents=True, exist_ok=True)
    cfg.socket_dir.chmod(0o700)
    sock = cfg.socket_dir / "munge.socket"
    proc = procs.spawn(
        "munged",
        [
            _bin("munged"),
            "-F",
            "--force",
            f"--key-file={key}",
            f"--socket={sock}",
            f"--pid-file={d / 'munged.pid'}",
            f"--seed-file={d / 'munged.seed'}",
            "--num-threads=4",
        ],
        cfg.run_dir,
    )
    procs.wait_until(sock.exists, 10, "munged", proc)


def start_slurmctld(cfg: LabConfig) -> None:
    procs.start_service(
        "slurmctld",
        [_bin("slurmctld"), "-D", "-i", "-f", str(cfg.slurm_conf)],
        cfg.run_dir,
        port=cfg.port("slurmctld"),
        ready=lambda: "UP" in run(cfg, ["scontrol", "ping"], timeout=5),
        timeout=30,
        env=cfg.slurm_env(),
    )


def slurmd_name(node: str) -> str:
    return f"slurmd-{node}"


def start_slurmd(cfg: LabConfig, nodes: Sequence[str]) -> None:
    spec = cfg.slurm_spec()
    busy = [n for n in nodes if not procs.port_free(spec.slurmd_port(n) or 0)]
    if busy:
        raise LabError(f"slurmd: port of {busy[0]} ({spec.slurmd_port(busy[0])}) is in use")
    for node in nodes:
        procs.spawn(
            slurmd_name(node),
            [_bin("slurmd"), "-D", "-N", node, "-f", str(cfg.slurm_conf)],
            cfg.run_dir,
            env=cfg.slurm_env(),
        )


def node_states(cfg: LabConfig) -> dict[str, dict[str, Any]]:
    """Node name -> {state: [...flags], reason: str} from `sinfo --json` (22.05 parser)."""
    data = json.loads(run(cfg, ["sinfo", "--json"], timeout=10))
    out: dict[str, dict[str, Any]] = {}
    for n in data.get("nodes", []):
        state = n.get("state")
        flags = n.get("state_flags") or []
        states = [state] if isinstance(state, str) else list(state or [])
        out[n["name"]] = {
            "state": [s.upper() for s in states + list(flags)],
            "reason": n.get("reason", ""),
        }
    return out


def wait_nodes_registered(cfg: LabConfig, nodes: Sequence[str], timeout: float = 60) -> None:
    """Wait until every node's slurmd has registered (no NOT_RESPONDING / unknown states)."""
    want = set(nodes)

    def ready() -> bool:
        states = node_states(cfg)
        bad = {"NOT_RESPONDING", "UNKNOWN", "INVAL", "FUTURE"}
        return all(n in states and not (set(states[n]["state"]) & bad) for n in want)

    try:
        procs.wait_until(ready, timeout, "slurmd", interval=0.25)
    except LabError:
        dead = [n for n in nodes if not procs.running(cfg.run_dir).get(slurmd_name(n))]
        if dead:
            log = procs.log_path(cfg.run_dir, slurmd_name(dead[0]))
            raise LabError(
                f"slurmd {dead[0]}: exited during start; see {log}: {procs.log_tail(log)}"
            ) from None
        raise


def cancel_jobs(cfg: LabConfig) -> list[str]:
    """Cancel every job of this lab (while slurmctld and the slurmd still answer, so Slurm ends
    the job steps itself); returns their ids. Nothing to do when slurmctld is not running."""
    if "slurmctld" not in procs.running(cfg.run_dir):
        return []
    try:
        jobs = run(cfg, ["squeue", "-h", "-o", "%A"], timeout=10).split()
        if jobs:
            run(cfg, ["scancel", *jobs], timeout=30)
    except LabError:
        return []  # slurmctld is not answering: the sweep after the stop still ends the processes
    return jobs


def job_processes(cfg: LabConfig) -> list[tuple[int, int]]:
    """(PID, start ticks) of every process of this lab's Slurm jobs: its slurmstepd and the tasks
    they run, with all their descendants.

    A slurmstepd runs detached (its parent is init, outside the lab's process groups) and keeps
    the environment of the slurmd that forked it, which the lab started with SLURM_CONF=<this
    lab's slurm.conf>; a job's tasks carry SLURM_JOB_ID and the SLURM_CONF they were submitted
    with, the only way to reach this lab's controller. Another lab's processes name another
    slurm.conf, so they are never picked. The caller and its ancestors (an `salloc` shell running
    `autoheal lab down`) are left alone.
    """
    conf = str(cfg.slurm_conf)
    spared = {os.getpid(), *proc.ancestors(os.getpid())}
    roots = []
    for pid in proc.pids():
        if pid in spared:
            continue
        env = proc.environ(pid)
        if env.get("SLURM_CONF") != conf:
            continue
        st = proc.stat(pid)
        if st is not None and (st.comm == "slurmstepd" or "SLURM_JOB_ID" in env):
            roots.append(pid)
    found = dict.fromkeys(roots)
    for pid in roots:
        found.update(dict.fromkeys(proc.descendants(pid)))
    return [(pid, ticks) for pid in found if pid not in spared and (ticks := proc.start_ticks(pid))]

"""A pool change reaches running slurmds, never under a job (issue 33): on real nodes, `pulumi up`
of a changed pool puts the slurmd DaemonSet on a new template without restarting a pod (OnDelete);
playbooks/slurm_rollout.yml (real Ansible, real Slurm in the pods) then restarts each node's
slurmd pod: the busy node only after its job has ended (drained first,
the job COMPLETED, never killed or requeued), then the idle one. Check mode touches nothing; a second run changes
nothing.

The play runs on this host, as on-call would; its Slurm commands reach slurmctld through
`kubectl exec` into the slurmctld pod (small wrappers first on PATH), its Kubernetes calls use the
lab's kubeconfig. Prints the rollout's times.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from lab import controlplane, stack
from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from lab.login import Login
from tests.k8s_slurm.test_slurm_pods import NS, _job_state, _pods
from tests.nodes.conftest import require_real_nodes
from tests.runbook.conftest import RECAP_RE, REPO, VENV_BIN, ansible_env
from tests.support import port_base, wait_for

pytestmark = pytest.mark.timeout(900)
KUBECTL = Path.home() / ".cache/autoheal/bin/kubectl"
WRAPPER = """#!/bin/sh
exec {kubectl} --kubeconfig {kubeconfig} exec -n {ns} slurmctld-0 -c slurmctld -- {cmd} "$@"
"""


def _slurm_bin(cfg: LabConfig, where: Path) -> Path:
    """scontrol, sinfo, squeue and scancel that run in the slurmctld pod (as root, a Slurm operator)."""
    where.mkdir()
    for cmd in ("scontrol", "sinfo", "squeue", "scancel"):
        path = where / cmd
        path.write_text(WRAPPER.format(kubectl=KUBECTL, kubeconfig=cfg.kubeconfig, ns=NS, cmd=cmd))
        path.chmod(0o755)
    return where


def _play(bin_dir: Path, tmp: Path, extra: dict[str, Any], check: bool = False) -> tuple[int, int, str]:
    """(rc, changed, output) of one run of the rollout play."""
    vars_file = tmp / f"vars-{time.monotonic_ns()}.json"
    vars_file.write_text(json.dumps(extra))
    argv = [str(VENV_BIN / "ansible-playbook"), "playbooks/slurm_rollout.yml", "-e", f"@{vars_file}"]
    if check:
        argv.append("--check")
    env = ansible_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    m = RECAP_RE.search(out)
    return res.returncode, int(m.group(2)) if m else -1, out


def _slurmd(cfg: LabConfig) -> dict[str, dict[str, Any]]:
    """node -> its slurmd pod."""
    return {p["spec"]["nodeName"]: p for p in _pods(cfg) if "slurmd" in p["metadata"]["name"]}


def _newest_revision(cfg: LabConfig) -> str:
    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        r = http.get(f"/apis/apps/v1/namespaces/{NS}/controllerrevisions")
        r.raise_for_status()
        revs = [c for c in r.json()["items"] if c["metadata"]["name"].startswith("slurmd-")]
    return str(max(revs, key=lambda c: c["revision"])["metadata"]["labels"]["controller-revision-hash"])


def _sinfo(login: Login) -> dict[str, str]:
    rows = login.run("sinfo -h -N -o '%N %t'").split("\n")
    return dict(r.split() for r in rows if r.strip())


def test_a_pool_change_rolls_each_slurmd_once_its_jobs_are_done(tmp_path: Path) -> None:
    require_real_nodes()
    if not stack.available():
        pytest.skip("SLURM ROLLOUT NOT TESTED: pulumi or its Kubernetes provider is not built")
    if shutil.which("ssh") is None or not KUBECTL.exists():
        pytest.skip("SLURM ROLLOUT NOT TESTED: the ssh client or kubectl is not installed")
    pool = PoolConfig(size=2, spares=0, headroom=1, gpus_per_node=2)
    cfg = LabConfig(
        name="a-rollout",
        root=tmp_path / "labs",
        port_base=port_base(21800),
        pools=[pool],
        real_nodes=2,
        runner=False,
        watchers=False,
    )
    base = {"autoheal_kubeconfig": str(cfg.kubeconfig), "autoheal_rollout_pod_wait": 180}
    try:
        labmod.up(cfg)
        stack.up(cfg)
        bin_dir = _slurm_bin(cfg, tmp_path / "slurm-bin")
        login = Login(cfg)
        # on the template it was made from: nothing to roll
        rc, changed, out = _play(bin_dir, tmp_path, base)
        assert rc == 0 and changed == 0, out[-3000:]

        # a pool change (room for one more node: slurm.conf's MaxNodeCount) through `pulumi up`
        t0 = time.monotonic()
        stack.up(cfg.model_copy(update={"pools": [pool.model_copy(update={"headroom": 2})]}))
        print(f"\n[rollout] pulumi up of a pool change: {time.monotonic() - t0:.1f}s")
        before = _slurmd(cfg)
        new = _newest_revision(cfg)
        # OnDelete: the DaemonSet has the new template, every running slurmd is still the old one
        assert sorted(before) == ["gpu-1", "gpu-2"]
        assert all(p["metadata"]["labels"]["controller-revision-hash"] != new for p in before.values())
        wait_for(lambda: _sinfo(login) == {"gpu-1": "idle", "gpu-2": "idle"}, 60, "both nodes idle")

        # check mode: reports, restarts and drains nothing
        rc, _changed, out = _play(bin_dir, tmp_path, base, check=True)
        assert rc == 0, out[-3000:]
        assert {n: p["metadata"]["name"] for n, p in _slurmd(cfg).items()} == {
            n: p["metadata"]["name"] for n, p in before.items()
        }
        assert _sinfo(login) == {"gpu-1": "idle", "gpu-2": "idle"}

        job = login.run("sbatch --parsable -w gpu-1 -o /dev/null --wrap 'sleep 30'").strip()
        wait_for(lambda: _job_state(login, job) == "RUNNING", 60, f"job {job} running")
        t1 = time.monotonic()
        rc, changed, out = _play(bin_dir, tmp_path, base)
        took = time.monotonic() - t1
        assert rc == 0 and changed > 0, out[-4000:]
        print(f"[rollout] 2 nodes rolled (gpu-1 after its 30 s job): {took:.1f}s")
        # the job ran to its end on its node: not killed, not requeued
        assert _job_state(login, job) == "COMPLETED"
        assert "Restarts=0" in login.run(f"scontrol show job {job}")
        after = _slurmd(cfg)
        for node, pod in after.items():
            assert pod["metadata"]["name"] != before[node]["metadata"]["name"], node
            assert pod["metadata"]["labels"]["controller-revision-hash"] == new, node
        # gpu-1's slurmd restarted only after its job ended
        made = after["gpu-1"]["metadata"]["creationTimestamp"]
        ended = login.run(f"scontrol show job {job} -o").split("EndTime=")[1].split()[0]
        assert made.rstrip("Z") >= ended, (made, ended)
        assert _sinfo(login) == {"gpu-1": "idle", "gpu-2": "idle"}
        # idempotent: every pod is on the new template
        rc, changed, out = _play(bin_dir, tmp_path, base)
        assert rc == 0 and changed == 0, out[-3000:]
    finally:
        labmod.down(cfg)

"""Slurm follows its pools, on nodes named as a cloud names them (issue 33).

The lab's two real nodes are named like EKS's (`ip-10-0-3-1.us-west-2.compute.internal`): the
Kubernetes node, the kubelet's hostname, the dynamic Slurm node (`slurmd -N`) and every play's
`autoheal_nodes` carry the dots.

A pool change reaches running slurmds, never under a job: on real nodes, `pulumi up`
of a changed pool puts the slurmd DaemonSet on a new template without restarting a pod (OnDelete);
playbooks/slurm_rollout.yml (real Ansible, real Slurm in the pods) then restarts each node's
slurmd pod: the busy node only after its job has ended (drained first,
the job COMPLETED, never killed or requeued), then the idle one. Check mode touches nothing; a second run changes
nothing. Then the runbook's steps by hand (fence.yml, requeue.yml, node_return.yml) on a dotted
node: drained in Slurm, cordoned and quarantined, its job requeued, the node returned and the job
running on it again.

The plays run on this host, as on-call would; its Slurm commands reach slurmctld through
`kubectl exec` into the slurmctld pod (small wrappers first on PATH), its Kubernetes calls use the
lab's kubeconfig. Prints the rollout's times.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoheal.errors import LabError
from lab import controlplane, stack
from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from lab.login import Login
from tests.k8s_slurm.test_slurm_pods import NS, _job_state, _pods
from tests.nodes.conftest import require_real_nodes
from tests.runbook.conftest import RECAP_RE, REPO, VENV_BIN, ansible_env
from tests.support import port_base, wait_for

pytestmark = pytest.mark.timeout(1200)
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


def _play(
    bin_dir: Path, tmp: Path, extra: dict[str, Any], check: bool = False, playbook: str = "slurm_rollout"
) -> tuple[int, int, str]:
    """(rc, changed, output) of one run of a play."""
    vars_file = tmp / f"vars-{time.monotonic_ns()}.json"
    vars_file.write_text(json.dumps(extra))
    argv = [str(VENV_BIN / "ansible-playbook"), f"playbooks/{playbook}.yml", "-e", f"@{vars_file}"]
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


DOMAIN = "us-west-2.compute.internal"
N1, N2 = (f"ip-10-0-3-{i}.{DOMAIN}" for i in (1, 2))
POOL = PoolConfig(prefix="ip-10-0-3", domain=DOMAIN, size=2, spares=0, headroom=1, gpus_per_node=2)


def _sinfo(login: Login) -> dict[str, str]:
    rows = login.run("sinfo -h -N -o '%60N %t'").split("\n")
    return dict(r.split() for r in rows if r.strip())


def _idle(login: Login) -> bool:
    try:
        return _sinfo(login) == {N1: "idle", N2: "idle"}
    except LabError:  # ssh refused: the login pod is restarting
        return False


class Lab:
    def __init__(self, cfg: LabConfig, bin_dir: Path, login: Login) -> None:
        self.cfg, self.bin_dir, self.login = cfg, bin_dir, login
        self.base: dict[str, Any] = {"autoheal_kubeconfig": str(cfg.kubeconfig)}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    require_real_nodes()
    if not stack.available():
        pytest.skip("SLURM ROLLOUT NOT TESTED: pulumi or its Kubernetes provider is not built")
    if shutil.which("ssh") is None or not KUBECTL.exists():
        pytest.skip("SLURM ROLLOUT NOT TESTED: the ssh client or kubectl is not installed")
    tmp = tmp_path_factory.mktemp("rollout")
    cfg = LabConfig(
        name="a-rollout",
        root=tmp / "labs",
        port_base=port_base(21800),
        pools=[POOL],
        real_nodes=2,
        runner=False,
        watchers=False,
    )
    try:
        t0 = time.monotonic()
        labmod.up(cfg)
        stack.up(cfg)
        print(f"\n[rollout] lab and pulumi up on 2 real nodes: {time.monotonic() - t0:.1f}s")
        yield Lab(cfg, _slurm_bin(cfg, tmp / "slurm-bin"), Login(cfg))
    finally:
        labmod.down(cfg)


def test_a_pool_change_rolls_each_slurmd_once_its_jobs_are_done(lab: Lab, tmp_path: Path) -> None:
    cfg, login, bin_dir = lab.cfg, lab.login, lab.bin_dir
    base = {**lab.base, "autoheal_rollout_pod_wait": 180}
    # the Slurm nodes are the Kubernetes nodes, dots and all
    assert sorted(_slurmd(cfg)) == [N1, N2]
    wait_for(lambda: _sinfo(login) == {N1: "idle", N2: "idle"}, 60, "both nodes idle")
    # on the template it was made from: nothing to roll
    rc, changed, out = _play(bin_dir, tmp_path, base)
    assert rc == 0 and changed == 0, out[-3000:]

    # a pool change (room for one more node: slurm.conf's MaxNodeCount) through `pulumi up`
    t0 = time.monotonic()
    stack.up(cfg.model_copy(update={"pools": [POOL.model_copy(update={"headroom": 2})]}))
    print(f"[rollout] pulumi up of a pool change: {time.monotonic() - t0:.1f}s")
    before = _slurmd(cfg)
    new = _newest_revision(cfg)
    # OnDelete: the DaemonSet has the new template, every running slurmd is still the old one
    assert all(p["metadata"]["labels"]["controller-revision-hash"] != new for p in before.values())
    # the login pod rolled too (its config hash): ssh answers once its successor is up
    wait_for(lambda: _idle(login), 120, "the login pod back, both nodes idle")

    # check mode: reports, restarts and drains nothing
    rc, _changed, out = _play(bin_dir, tmp_path, base, check=True)
    assert rc == 0, out[-3000:]
    assert {n: p["metadata"]["name"] for n, p in _slurmd(cfg).items()} == {
        n: p["metadata"]["name"] for n, p in before.items()
    }
    assert _sinfo(login) == {N1: "idle", N2: "idle"}

    job = login.run(f"sbatch --parsable -w {N1} -o /dev/null --wrap 'sleep 30'").strip()
    wait_for(lambda: _job_state(login, job) == "RUNNING", 60, f"job {job} running")
    t1 = time.monotonic()
    rc, changed, out = _play(bin_dir, tmp_path, base)
    took = time.monotonic() - t1
    assert rc == 0 and changed > 0, out[-4000:]
    print(f"[rollout] 2 nodes rolled ({N1} after its 30 s job): {took:.1f}s")
    # the job ran to its end on its node: not killed, not requeued
    assert _job_state(login, job) == "COMPLETED"
    assert "Restarts=0" in login.run(f"scontrol show job {job}")
    after = _slurmd(cfg)
    for node, pod in after.items():
        assert pod["metadata"]["name"] != before[node]["metadata"]["name"], node
        assert pod["metadata"]["labels"]["controller-revision-hash"] == new, node
    # the busy node's slurmd restarted only after its job ended
    made = after[N1]["metadata"]["creationTimestamp"]
    ended = login.run(f"scontrol show job {job} -o").split("EndTime=")[1].split()[0]
    assert made.rstrip("Z") >= ended, (made, ended)
    assert _sinfo(login) == {N1: "idle", N2: "idle"}
    # idempotent: every pod is on the new template
    rc, changed, out = _play(bin_dir, tmp_path, base)
    assert rc == 0 and changed == 0, out[-3000:]


def _kube_node(cfg: LabConfig, name: str) -> dict[str, Any]:
    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        r = http.get(f"/api/v1/nodes/{name}")
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out


def _node_field(login: Login, node: str, field: str) -> str:
    out = login.run(f"scontrol show node {node} -o")
    return next((f.split("=", 1)[1] for f in out.split() if f.startswith(f"{field}=")), "")


def test_xid_79_on_a_dotted_node_fences_requeues_drains_and_returns_it(lab: Lab, tmp_path: Path) -> None:
    """The runbook's steps by hand on a dotted node: fence.yml (Slurm drain, cordon, quarantine
    taint), requeue.yml (SIGTERM, grace, requeue), node_return.yml; the job, pinned to the node,
    waits drained out and runs there again once it is back."""
    cfg, login = lab.cfg, lab.login
    # a job that checkpoints on SIGTERM and ends, as the training jobs do
    job = login.run(
        f"sbatch --parsable --requeue -w {N1} -o /dev/null --wrap \"trap 'exit 0' TERM; sleep 600 & wait\""
    ).strip()
    try:
        wait_for(lambda: _job_state(login, job) == "RUNNING", 60, f"job {job} running")
        run = {
            **lab.base,
            "autoheal_nodes": [N1],
            "autoheal_incident_ids": ["inc-dotted"],
            "autoheal_grace_seconds": 5,
        }
        t0 = time.monotonic()
        for play in ("fence", "requeue"):
            rc, _changed, out = _play(lab.bin_dir, tmp_path, run, playbook=play)
            assert rc == 0, f"{play}: {out[-4000:]}"
        print(f"[dotted] fence + requeue of {N1}: {time.monotonic() - t0:.1f}s")
        # Slurm: drained with our reason; the job left the node and was requeued
        assert _node_field(login, N1, "Reason").startswith("autoheal:"), login.run(f"scontrol show node {N1}")
        assert "DRAIN" in _node_field(login, N1, "State")
        wait_for(lambda: _job_state(login, job) == "PENDING", 60, f"job {job} requeued")
        assert "Restarts=1" in login.run(f"scontrol show job {job}")
        # Kubernetes: cordoned and quarantined
        node = _kube_node(cfg, N1)
        assert node["spec"].get("unschedulable") is True
        assert any(t["key"] == "autoheal.io/quarantine" for t in node["spec"].get("taints") or [])

        rc, _changed, out = _play(lab.bin_dir, tmp_path, run, playbook="node_return")
        assert rc == 0, out[-4000:]
        node = _kube_node(cfg, N1)
        assert not node["spec"].get("unschedulable")
        assert not any(t["key"] == "autoheal.io/quarantine" for t in node["spec"].get("taints") or [])
        # back in service: the job runs on it again
        wait_for(lambda: _job_state(login, job) == "RUNNING", 90, f"job {job} running again on {N1}")
        assert f"NodeList={N1}" in login.run(f"scontrol show job {job} -o")
    finally:
        login.run(f"scancel {job}", check=False)

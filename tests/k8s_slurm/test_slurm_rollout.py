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
running on it again. Last (it retires a node), the whole XID-79 play, gpu_fatal_xid.yml, on a
dotted node as the runner runs it (its Executor and PlayVars, the lab runner's and the stack's play
vars): fenced, its jobs SIGTERMed and requeued, drained, retired through the pool backend, its
phases journalled and its Events written; a second run changes nothing.

The plays run on this host, as on-call would; its Slurm commands reach slurmctld through
`kubectl exec` into the slurmctld pod (small wrappers first on PATH), its Kubernetes calls use the
lab's kubeconfig. Prints the rollout's and the XID-79 run's times.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoheal.errors import LabError
from autoheal.labels import INCIDENT_ANNOTATION, QUARANTINE_TAINT_KEY, QUARANTINED, STATE_LABEL
from images.build import build
from lab import controlplane, pool, stack
from lab import lab as labmod
from lab.config import RUNNER_NAMESPACE, LabConfig, PoolConfig
from lab.login import Login
from remediation.executor import Executor, PlayVars, RunOutcome, read_events
from remediation.states import RunStatus
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


# -- the whole XID-79 run on a dotted node, as the runner runs it ---------------------------------

XID_INCIDENT = "inc-0000000dd079"
# the trap records the SIGTERM on the job itself (its comment survives the requeue), then ends the
# job as a checkpointing training job does
TRAP_JOB = (
    "trap 'scontrol update jobid=$SLURM_JOB_ID comment=sigterm-${SLURM_RESTART_COUNT:-0}; exit 0' TERM;"
    " sleep 600 & wait"
)
# the step that runs right after the drain and before the retire: the node is still there to read
BEFORE_RETIRE = "Fail when pods could not be evicted"


def _ctl(lab: Lab, cmd: str, *argv: str) -> str:
    """A Slurm command as root in the slurmctld pod (the login pod may be evicted by the drain)."""
    res = subprocess.run([str(lab.bin_dir / cmd), *argv], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise AssertionError(f"{cmd} {argv}: rc={res.returncode} {res.stderr[-500:]}")
    return res.stdout


def _job(lab: Lab, job: str) -> dict[str, str]:
    """`scontrol show job -o` fields (values without spaces; Comment and JobState are)."""
    out = _ctl(lab, "scontrol", "show", "job", job, "-o")
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def _slurm_line(lab: Lab, node: str) -> str:
    """`scontrol show node -o`, or "" when Slurm has no record of the node (retired, or lent)."""
    res = subprocess.run(
        [str(lab.bin_dir / "scontrol"), "show", "node", node, "-o"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return res.stdout.strip() if res.returncode == 0 else ""


def _pods_on(cfg: LabConfig, node: str) -> list[str]:
    """The pods on `node` a drain evicts: not DaemonSet pods, not mirror pods, not finished."""
    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        r = http.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"})
        r.raise_for_status()
        items = r.json()["items"]
    return sorted(
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in items
        if not any(o.get("kind") == "DaemonSet" for o in p["metadata"].get("ownerReferences") or [])
        and "kubernetes.io/config.mirror" not in (p["metadata"].get("annotations") or {})
        and p["status"].get("phase") not in ("Succeeded", "Failed")
        and not p["metadata"].get("deletionTimestamp")
    )


def _node_events(cfg: LabConfig, node: str) -> set[str]:
    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        r = http.get("/api/v1/events", params={"fieldSelector": f"involvedObject.name={node}"})
        r.raise_for_status()
        return {e["reason"] for e in r.json()["items"]}


class _Run:
    """One run of gpu_fatal_xid.yml through the runner's Executor: its steps as the runner's
    journal records them (task, status, changed), and what Kubernetes and Slurm showed of the node
    right after the drain (the retire then removes the Kubernetes node)."""

    def __init__(self, lab: Lab, node: str) -> None:
        self.lab, self.node = lab, node
        self.steps: list[tuple[str, str, bool]] = []
        self.after_drain: dict[str, Any] = {}

    def on_step(self, task: str, host: str, status: str, changed: bool, t0: float | None, t1: float) -> None:
        self.steps.append((task, status, changed))
        if task.startswith(BEFORE_RETIRE) and not self.after_drain:
            try:
                self.after_drain = {
                    "kube": _kube_node(self.lab.cfg, self.node),
                    "pods": _pods_on(self.lab.cfg, self.node),
                    "slurm": _slurm_line(self.lab, self.node),
                }
            except Exception as exc:  # the callback must not stop the run; the asserts say it
                self.after_drain = {"error": repr(exc)}


def _xid_play_vars(cfg: LabConfig, tmp_path: Path, **more: Any) -> dict[str, Any]:
    """The XID play's vars as the lab runner gives them (no slurm.conf: scontrol on PATH reaches the
    pods' slurmctld), with the stack's job namespace (components/stack.py _ladder_play_vars)."""
    return {
        "autoheal_lab_name": cfg.name,
        "autoheal_lab_root": str(cfg.root),
        "autoheal_backend": "lab",
        "autoheal_evidence_dir": str(tmp_path / "evidence"),
        "autoheal_kubeconfig": str(cfg.kubeconfig),
        "autoheal_job_namespace": RUNNER_NAMESPACE,
        **more,
    }


def _run_xid_79(
    lab: Lab, ex: Executor, run_id: int, node: str, extra: dict[str, Any]
) -> tuple[RunOutcome, _Run, float]:
    """(outcome, its steps, seconds) of one run: the runner's PlayVars for an XID 79 incident on
    `node`, the runner's Executor (ansible-runner, the runner's environment, its events file)."""
    run = _Run(lab, node)
    play_vars = PlayVars(
        nodes=(node,),
        incident_ids=(XID_INCIDENT,),
        xid=79,
        gpu=0,
        tier="replace",
        opt_out=False,
        dry_run=False,
        grace_seconds=20,
        journal_events=ex.events_path(run_id),
        extra=extra,
        fault_time=time.time(),
    )
    t0 = time.monotonic()
    outcome = ex.run(
        run_id,
        "gpu_fatal_xid.yml",
        play_vars,
        on_pid=lambda _pid: None,
        on_step=run.on_step,
        on_tick=lambda: False,
    )
    return outcome, run, time.monotonic() - t0


def _play_output(ex: Executor, run_id: int) -> str:
    out = ex.run_dir(run_id) / "artifacts" / "play" / "stdout"
    return out.read_text()[-6000:] if out.exists() else "(no stdout)"


def test_the_whole_xid_79_run_on_a_dotted_node_fences_evacuates_drains_and_retires_it(
    lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """playbooks/gpu_fatal_xid.yml, whole, driven as the runner drives it: its Executor runs the
    play with ansible-runner and the PlayVars an XID 79 incident gets (remediation/runs.py), plus
    the play vars a lab runner's config and the stack give it (lab/runner.py write_config,
    components/stack.py _ladder_play_vars: the Job namespace and the DCGM image by digest, here
    the fake GPU tools image); its Slurm commands reach slurmctld as the runner pod's do, by
    `scontrol` on its PATH (here: kubectl exec into the slurmctld pod). The rung is replace, XID
    79's top rung (a repeat XID 79 is escalated to it): fence, SIGTERM + grace + requeue, spare
    promotion (the lab's pool has none: no_spare), notify, opt-out preflight, Slurm DOWN,
    Kubernetes drain, retire through the pool backend (the lab's pool controller: the real node
    goes), audit Events, done. (The reboot rung's reboot would restart a host slurmd in this lab,
    not the real node, and returns the node, which a rerun fences again.) The node is the one
    slurmctld does not run on (the lab runs Slurm's pods on its GPU nodes, production on system
    nodes). A second run changes nothing."""
    cfg, login = lab.cfg, lab.login
    ctld = next(p["spec"]["nodeName"] for p in _pods(cfg) if p["metadata"]["name"] == "slurmctld-0")
    node = N2 if ctld == N1 else N1
    assert "." in node
    tools = build(["fake-gpu-tools"])[0].ref  # the stack's monitoring.dcgmImage, by digest
    extra = _xid_play_vars(cfg, tmp_path, autoheal_dcgm_image=tools)
    monkeypatch.setenv("PATH", f"{lab.bin_dir}{os.pathsep}{os.environ['PATH']}")
    ex = Executor(REPO / "playbooks", tmp_path / "runner", step_timeout=900, run_timeout=1800)
    trap = login.run(
        f"sbatch --parsable --requeue -w {node} -o /dev/null --wrap {shlex.quote(TRAP_JOB)}"
    ).strip()
    # a job that dies of the SIGTERM (no trap), as a plain `sleep` does
    plain = login.run(f"sbatch --parsable --requeue -w {node} -o /dev/null --wrap 'sleep 600'").strip()
    try:
        wait_for(lambda: _job_state(login, trap) == "RUNNING", 60, f"job {trap} running")
        try:  # beside it if the node has a core left (the pool's slurmd registers 2 CPUs)
            plain_ran = bool(wait_for(lambda: _job_state(login, plain) == "RUNNING", 20, "plain job"))
        except AssertionError:
            plain_ran = False
            login.run(f"scancel {plain}")
        print(
            f"\n[xid-79] {node}: jobs {trap} (trap) {plain} (plain sleep, running: {plain_ran});"
            f" pods a drain evicts: {_pods_on(cfg, node)}"
        )

        outcome, run, took = _run_xid_79(lab, ex, 1, node, extra)
        assert outcome.status is RunStatus.SUCCESSFUL and outcome.rc == 0, (outcome, _play_output(ex, 1))
        events, _ = read_events(ex.events_path(1), 0, {XID_INCIDENT: node})
        t_fault = min(e.ts for e in events)
        flow = ", ".join(f"{e.phase} +{e.ts - t_fault:.1f}s" for e in events)
        print(f"[xid-79] run 1: {took:.1f}s; phases: {flow}")
        by = {e.phase: e for e in events}
        assert not [e for e in events if e.status == "failed"], events
        assert {"fenced", "jobs_signalled", "requeued", "no_spare", "drained", "retired", "done"} <= set(by)
        assert trap in by["jobs_signalled"].detail.split(" ", 1)[1].split(","), by["jobs_signalled"]
        assert trap in by["requeued"].detail, by["requeued"]

        # after the drain, before the retire: fenced in both, nothing left to evict
        seen = run.after_drain
        assert "error" not in seen and seen, seen
        spec, meta = seen["kube"]["spec"], seen["kube"]["metadata"]
        assert spec.get("unschedulable") is True
        assert any(t["key"] == QUARANTINE_TAINT_KEY for t in spec.get("taints") or [])
        assert meta["labels"].get(STATE_LABEL) == QUARANTINED
        assert (meta.get("annotations") or {}).get(INCIDENT_ANNOTATION) == XID_INCIDENT
        assert seen["pods"] == []
        state = seen["slurm"]
        assert (
            "DOWN" in state.split("State=")[1].split()[0] and "DRAIN" in state.split("State=")[1].split()[0]
        )
        assert XID_INCIDENT in state.split("Reason=", 1)[1], state

        # the job got its SIGTERM, checkpointed (its trap ran) and was requeued: pending, its node gone
        fields = _job(lab, trap)
        assert fields["Restarts"] == "1" and fields["JobState"] == "PENDING", fields
        assert fields.get("Comment") == "sigterm-0", fields
        # so was the job that died of the SIGTERM (it had left before the evacuation listed it)
        if plain_ran:
            fields = _job(lab, plain)
            assert fields["Restarts"] == "1" and fields["JobState"] == "PENDING", fields
            assert plain in by["requeued"].detail, by["requeued"]
        print(f"[xid-79] journal: {by['jobs_signalled'].detail} / {by['requeued'].detail}")

        # retired through the pool backend: the Kubernetes node is gone, its Events stay
        assert node in pool.client_status(cfg)["retired"]
        with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
            assert http.get(f"/api/v1/nodes/{node}").status_code == 404
        assert {"AutohealFenced", "AutohealEvacuated", "AutohealRetired"} <= _node_events(cfg, node)
        # Slurm: its slurmd pod deleted the node on the way out (components/slurm/workers.py), or,
        # where the node went down too hard for that, keeps it down with our reason
        line = _slurm_line(lab, node)
        assert not line or ("DOWN" in line.split("State=")[1].split()[0] and XID_INCIDENT in line), line
        print(f"[xid-79] Slurm after the retire: {line[:200] or 'the node left Slurm'}")

        # the same run again: every step finds its work done
        outcome, again, took = _run_xid_79(lab, ex, 2, node, extra)
        assert outcome.status is RunStatus.SUCCESSFUL and outcome.rc == 0, (outcome, _play_output(ex, 2))
        changed = [s for s in again.steps if s[2]]
        print(f"[xid-79] run 2: {took:.1f}s, {len(again.steps)} steps, changed {len(changed)}")
        assert changed == [], changed
        assert _job(lab, trap)["Restarts"] == "1"
    finally:
        for job in (trap, plain):
            subprocess.run([str(lab.bin_dir / "scancel"), job], capture_output=True, timeout=60, check=False)

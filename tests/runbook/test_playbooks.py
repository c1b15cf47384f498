"""The runbooks end to end on the lab: real Slurm jobs that checkpoint on SIGTERM, KWOK nodes in a
real kube-apiserver, the lab's pool controller as the replacement backend."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from autoheal import __version__
from tests.runbook.conftest import CONTROLLER_FLAGS, REPO, VENV_BIN, ansible_env, run_playbook
from tests.support import wait_for

pytestmark = pytest.mark.lab

SPARE_REASON = "autoheal: hot spare"


def snapshot(lab: Any) -> tuple[Any, Any, Any]:
    slurm = {
        n: (
            v["state"],
            tuple(f for f in v["state_flags"] if f not in CONTROLLER_FLAGS),
            v["reason"],
            v["comment"],
        )
        for n, v in lab.nodes().items()
    }
    jobs = {j: (v["job_state"], v["restart_cnt"]) for j, v in lab.jobs().items()}
    kube = {}
    if lab.kubeconfig is not None:
        for item in json.loads(lab.kubectl("get", "nodes", "-o", "json"))["items"]:
            meta = item["metadata"]
            kube[meta["name"]] = (
                item["spec"].get("unschedulable", False),
                json.dumps(item["spec"].get("taints", []), sort_keys=True),
                json.dumps({k: v for k, v in meta.get("labels", {}).items() if k.startswith("autoheal.io/")}),
            )
    return slurm, jobs, kube


def fault_vars(lab: Any, node: str, incident: str, **kw: Any) -> dict[str, Any]:
    return {
        **lab.base_vars(),
        "autoheal_nodes": [node],
        "autoheal_incident_ids": [incident],
        "autoheal_xid": 79,
        "autoheal_gpu": 3,
        "autoheal_tier": "replace",
        "autoheal_grace_seconds": 30,
        "autoheal_drain_timeout": 30,
        **kw,
    }


def quarantine_taint(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in node["spec"].get("taints", []) if t["key"] == "autoheal.io/quarantine"]


def deployment_on(lab: Any, node: str) -> Callable[[], list[dict[str, Any]]]:
    lab.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": f"side-{node}", "namespace": "default"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": f"side-{node}"}},
                    "template": {
                        "metadata": {"labels": {"app": f"side-{node}"}},
                        "spec": {
                            "nodeSelector": {"kubernetes.io/hostname": node},
                            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                            "containers": [{"name": "c", "image": "fake"}],
                        },
                    },
                },
            }
        ),
    )

    def running_on() -> list[dict[str, Any]]:
        pods = json.loads(lab.kubectl("get", "pods", "-l", f"app=side-{node}", "-o", "json"))["items"]
        return [
            p
            for p in pods
            if p["spec"].get("nodeName") == node and not p["metadata"].get("deletionTimestamp")
        ]

    wait_for(running_on, 60, f"a pod on {node}")
    return running_on


def test_every_playbook_in_check_mode_changes_nothing(lab, tmp_path, checkpoint_job):
    script, _ck, _log = checkpoint_job
    job = lab.sbatch("-N2", "--exclusive", "-o", "/dev/null", str(script))
    try:
        wait_for(lambda: lab.jobs()[job]["job_state"] == "RUNNING", 60, "job running")
        node = lab.slurm("scontrol", "show", "hostnames", lab.jobs()[job]["nodes"]).split()[0]
        before = snapshot(lab)
        base = {**lab.base_vars(), "autoheal_nodes": [node], "autoheal_incident_ids": ["inc-dry"]}
        plays = {
            "gpu_fatal_xid": {**base, "autoheal_xid": 79, "autoheal_gpu": 1, "autoheal_grace_seconds": 5},
            "fence": base,
            "unfence": base,
            "requeue": {**base, "autoheal_grace_seconds": 5},
            "replace": base,
            "node_return": base,
        }
        for name, extra in plays.items():
            res = run_playbook(name, extra, check=True, tmp=tmp_path)
            # replace refuses nodes that are not fenced: that refusal is its check-mode answer
            if name == "replace":
                assert "fence the nodes first" in res.output, res.output[-3000:]
            else:
                assert res.rc == 0, f"{name}: {res.output[-4000:]}"
            assert snapshot(lab) == before, name
        assert not lab.journal_lines()  # a dry run writes no journal
    finally:
        lab.slurm("scancel", str(job), check=False)


def test_fence_then_unfence_round_trip_keeps_an_admin_cordon(kube_lab, tmp_path):
    lab = kube_lab
    base = {**lab.base_vars(), "autoheal_nodes": ["gpu-3", "gpu-4"], "autoheal_incident_ids": ["f1", "f2"]}
    lab.kubectl("cordon", "gpu-4")
    try:
        res = run_playbook("fence", base, tmp=tmp_path)
        assert res.rc == 0, res.output[-3000:]
        for n in ("gpu-3", "gpu-4"):
            assert lab.node(n)["reason"].startswith("autoheal: manual fence")
            assert quarantine_taint(lab.kube_node(n))
        assert run_playbook("fence", base, tmp=tmp_path).changed == 0
        res = run_playbook("unfence", base, tmp=tmp_path)
        assert res.rc == 0, res.output[-3000:]
        for n in ("gpu-3", "gpu-4"):
            assert "DRAIN" not in lab.node(n)["state_flags"]
            assert not quarantine_taint(lab.kube_node(n))
        assert not lab.kube_node("gpu-3")["spec"].get("unschedulable")
        assert lab.kube_node("gpu-4")["spec"]["unschedulable"] is True  # the admin's cordon stays
        assert run_playbook("unfence", base, tmp=tmp_path).changed == 0
    finally:
        lab.kubectl("uncordon", "gpu-3", "gpu-4", check=False)


def test_gpu_fatal_xid_fences_requeues_onto_the_promoted_spare_and_resumes_from_checkpoint(
    fresh_lab, tmp_path, checkpoint_job, sink
):
    lab = fresh_lab
    script, ck, log = checkpoint_job
    # gpu-3 and gpu-4 are busy, so the requeued two-node job can only run on gpu-2 + the spare
    fillers = [
        lab.sbatch("-N1", "--exclusive", "-w", n, "--no-requeue", "-o", "/dev/null", "--wrap", "sleep 3000")
        for n in ("gpu-3", "gpu-4")
    ]
    job = lab.sbatch("-N2", "--exclusive", "-o", "/dev/null", str(script))
    try:
        wait_for(lambda: lab.jobs()[job]["job_state"] == "RUNNING", 60, "job running")
        assert lab.jobs()[job]["nodes"] == "gpu-[1-2]"
        wait_for(lambda: log.exists() and "start" in log.read_text(), 30, "job started")
        pods_on_bad = deployment_on(lab, "gpu-1") if lab.kubeconfig else (lambda: [])

        extra = fault_vars(lab, "gpu-1", "inc-main", autoheal_backend="none", autoheal_webhook_url=sink.url)
        res = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
        assert res.rc == 0, res.output[-5000:]

        # Slurm: DOWN with our reason
        bad = lab.node("gpu-1")
        assert bad["state"] == "down" and bad["reason"] == "autoheal: XID 79 gpu3 inc-main"
        # the job got SIGTERM, wrote its checkpoint, was requeued and resumed on gpu-2 + the spare
        text = log.read_text()
        m = re.search(r"SIGTERM at step (\d+) .*checkpoint written", text)
        assert m, text
        assert ck.read_text().strip() == m.group(1)
        wait_for(
            lambda: lab.jobs()[job]["job_state"] == "RUNNING" and lab.jobs()[job]["restart_cnt"] == 1,
            90,
            "requeued job running again",
        )
        assert lab.jobs()[job]["nodes"] in ("gpu-[2,5]", "gpu-2,gpu-5")
        wait_for(lambda: f"resumed from {m.group(1)} on" in log.read_text(), 30, "resume from checkpoint")
        spare = lab.node("gpu-5")
        assert spare["comment"] == "autoheal: replaces gpu-1 inc-main" and "DRAIN" not in spare["state_flags"]

        phases = [e["phase"] for e in lab.journal_lines()]
        for p in ("fenced", "spare_promoted", "jobs_signalled", "requeued", "done"):
            assert p in phases, phases
        assert sink.events()[0] == "start" and sink.events()[-1] == "done"

        if lab.kubeconfig is not None:
            node = lab.kube_node("gpu-1")
            assert node["spec"]["unschedulable"] is True
            assert quarantine_taint(node) == [
                {"key": "autoheal.io/quarantine", "value": "replace", "effect": "NoSchedule"}
            ]
            assert node["metadata"]["labels"]["autoheal.io/state"] == "quarantined"
            assert node["metadata"]["annotations"]["autoheal.io/incident"] == "inc-main"
            wait_for(lambda: not pods_on_bad(), 60, "the deployment's pod evicted from gpu-1")
            assert "drained" in phases
            promoted = lab.kube_node("gpu-5")
            assert "autoheal.io/spare" not in promoted["metadata"]["labels"]
            assert not [t for t in promoted["spec"].get("taints", []) if t["key"] == "autoheal.io/spare"]
            events = lab.kubectl(
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=gpu-1",
                "-l",
                f"app.kubernetes.io/version={__version__}",
            )
            assert "AutohealFenced" in events  # labelled with the release that acted (issue 19)

        # a second run changes nothing
        again = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
        assert again.rc == 0 and again.changed == 0, again.output[-5000:]
        assert lab.jobs()[job]["restart_cnt"] == 1

        # the repaired node returns to the pool as a hot spare
        back = {
            **lab.base_vars(),
            "autoheal_nodes": ["gpu-1"],
            "autoheal_incident_ids": ["inc-main"],
            "autoheal_return_as": "spare",
        }
        res = run_playbook("node_return", back, tmp=tmp_path)
        assert res.rc == 0, res.output[-4000:]
        node = lab.node("gpu-1")
        assert node["state"] != "down" and "DRAIN" in node["state_flags"] and node["reason"] == SPARE_REASON
        # the promotion record on gpu-5 goes with gpu-1's return (a later failure takes a new spare)
        assert lab.node("gpu-5")["comment"] == "", lab.node("gpu-5")
        if lab.kubeconfig is not None:
            kn = lab.kube_node("gpu-1")
            assert not kn["spec"].get("unschedulable") and not quarantine_taint(kn)
            assert kn["metadata"]["labels"].get("autoheal.io/spare") == "true"
        assert run_playbook("node_return", back, tmp=tmp_path).changed == 0
    finally:
        lab.slurm("scancel", str(job), *map(str, fillers), check=False)


def test_opt_out_pod_label_fences_and_notifies_but_does_not_drain_or_replace(fresh_lab, tmp_path, sink):
    lab = fresh_lab
    if lab.kubeconfig is None:
        pytest.skip("needs the lab's Kubernetes (the opt-out label lives on a pod)")
    job = lab.sbatch("-N1", "-w", "gpu-2", "-o", "/dev/null", "--wrap", "sleep 3000")
    lab.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "precious",
                    "namespace": "default",
                    "labels": {"autoheal.io/opt-out": "true"},
                },
                "spec": {
                    "nodeName": "gpu-2",
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "containers": [{"name": "c", "image": "fake"}],
                },
            }
        ),
    )
    try:
        wait_for(lambda: lab.jobs()[job]["job_state"] == "RUNNING", 60, "job running")
        extra = fault_vars(lab, "gpu-2", "inc-opt", autoheal_webhook_url=sink.url)
        res = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
        assert res.rc == 0, res.output[-5000:]
        node = lab.node("gpu-2")
        assert "DRAIN" in node["state_flags"] and node["state"] != "down"  # fenced, not downed
        assert lab.jobs()[job]["job_state"] == "RUNNING" and lab.jobs()[job]["restart_cnt"] == 0
        kn = lab.kube_node("gpu-2")
        assert kn["spec"]["unschedulable"] is True and quarantine_taint(kn)
        assert json.loads(lab.kubectl("get", "pod", "precious", "-o", "json"))["spec"]["nodeName"] == "gpu-2"
        for spare in ("gpu-5", "gpu-6"):
            assert lab.node(spare)["reason"] == SPARE_REASON
        assert lab.pool_status()["retired"] == []
        assert "opt_out" in sink.events()
        journal = {(e["phase"], e["status"]) for e in lab.journal_lines()}
        assert ("fenced", "ok") in journal and ("opt_out", "skipped") in journal
        assert not {p for p, _ in journal} & {
            "jobs_signalled",
            "requeued",
            "drained",
            "spare_promoted",
            "retired",
        }
        assert run_playbook("gpu_fatal_xid", extra, tmp=tmp_path).changed == 0
    finally:
        lab.slurm("scancel", str(job), check=False)


def test_admin_drained_node_keeps_its_reason_through_the_runbook(fresh_lab, tmp_path):
    lab = fresh_lab
    lab.slurm("scontrol", "update", "nodename=gpu-4", "state=drain", "reason=bad dimm ticket 881")
    extra = fault_vars(lab, "gpu-4", "inc-adm", autoheal_backend="none")
    res = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
    assert res.rc == 0, res.output[-5000:]
    node = lab.node("gpu-4")
    assert node["reason"] == "bad dimm ticket 881" and node["state"] != "down"
    fenced = [e for e in lab.journal_lines() if e["phase"] == "fenced"]
    assert fenced and "slurm reason kept" in fenced[0].get("detail", "")


def test_replace_tier_retires_the_node_and_the_pool_backfills_a_spare(fresh_lab, tmp_path):
    lab = fresh_lab
    extra = fault_vars(lab, "gpu-3", "inc-rep", autoheal_wait_replacement=True)
    res = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
    assert res.rc == 0, res.output[-5000:]
    status = lab.pool_status()
    assert status["retired"] == ["gpu-3"]
    new = [n for n in status["pools"]["h100"]["members"] if n not in {f"gpu-{i}" for i in range(1, 7)}]
    assert new == ["gpu-7"]
    wait_for(lambda: lab.node("gpu-7")["reason"] == SPARE_REASON, 30, "backfilled spare drained as a spare")
    assert lab.node("gpu-3")["state"] == "down"
    if lab.kubeconfig is not None:
        assert lab.kube_node("gpu-3") is None
        assert lab.kube_node("gpu-7")["metadata"]["labels"].get("autoheal.io/spare") == "true"
    phases = [e["phase"] for e in lab.journal_lines()]
    assert "retired" in phases and "replacement_ready" in phases
    again = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
    assert again.rc == 0 and again.changed == 0, again.output[-5000:]
    assert lab.pool_status()["retired"] == ["gpu-3"]


def test_gpu_fatal_xid_on_a_batch_promotes_a_spare_per_node_and_drains_them_together(fresh_lab, tmp_path):
    lab = fresh_lab
    if lab.kubeconfig is not None:
        on3, on4 = deployment_on(lab, "gpu-3"), deployment_on(lab, "gpu-4")
    extra = {
        **fault_vars(lab, "gpu-3", "inc-b3", autoheal_backend="none"),
        "autoheal_nodes": ["gpu-3", "gpu-4"],
        "autoheal_incident_ids": ["inc-b3", "inc-b4"],
    }
    res = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
    assert res.rc == 0, res.output[-5000:]
    # each step ran once for the batch (one task), not once per node
    assert (
        res.output.count(
            "TASK [Fence - Slurm drain, Kubernetes quarantine (cordon, taint, label) and SIGTERM to the jobs,"
            " concurrently]"
        )
        == 1
    )
    for node, inc in (("gpu-3", "inc-b3"), ("gpu-4", "inc-b4")):
        assert (
            lab.node(node)["state"] == "down" and lab.node(node)["reason"] == f"autoheal: XID 79 gpu3 {inc}"
        )
    assert {lab.node("gpu-5")["comment"], lab.node("gpu-6")["comment"]} == {
        "autoheal: replaces gpu-3 inc-b3",
        "autoheal: replaces gpu-4 inc-b4",
    }
    if lab.kubeconfig is not None:
        assert "TASK [k8s_node : Drain the batch concurrently (Eviction API, PDB-aware)]" in res.output
        wait_for(lambda: not on3() and not on4(), 60, "pods evicted from both nodes")
    fenced = {e["node"] for e in lab.journal_lines() if e["phase"] == "fenced"}
    assert fenced == {"gpu-3", "gpu-4"}
    again = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
    assert again.rc == 0 and again.changed == 0, again.output[-5000:]


def test_stop_after_fenced_fences_and_ends_and_the_full_run_finds_the_fence_done(fresh_lab, tmp_path):
    """The runner's fence lane: `autoheal_stop_after=fenced` drains and cordons, reports `fenced`,
    and touches nothing else (no spare, no job signalled); the full run then changes no fence."""
    lab = fresh_lab
    spares = {n: lab.node(n)["comment"] for n in ("gpu-5", "gpu-6")}
    extra = fault_vars(lab, "gpu-3", "inc-lane", autoheal_backend="none")
    res = run_playbook("gpu_fatal_xid", {**extra, "autoheal_stop_after": "fenced"}, tmp=tmp_path)
    assert res.rc == 0, res.output[-5000:]
    node = lab.node("gpu-3")
    assert "DRAIN" in node["state_flags"] and node["reason"] == "autoheal: XID 79 gpu3 inc-lane"
    assert node["state"] != "down"
    assert [e["phase"] for e in lab.journal_lines()] == ["fenced"]
    assert {n: lab.node(n)["comment"] for n in spares} == spares
    if lab.kubeconfig is not None:
        kn = lab.kube_node("gpu-3")
        assert kn["spec"].get("unschedulable") is True and quarantine_taint(kn)
    full = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
    assert full.rc == 0, full.output[-5000:]
    fence_task = full.output.split(
        "TASK [Fence - Slurm drain, Kubernetes quarantine (cordon, taint, label) and SIGTERM to the jobs, concurrently]",
        1,
    )[1]
    status = re.search(r"^(ok|changed): \[localhost\]", fence_task, re.M)
    assert status and status.group(1) == "ok", fence_task[:400]
    assert lab.node("gpu-3")["state"] == "down"
    assert "spare_promoted" in [e["phase"] for e in lab.journal_lines()]

    # at the reboot rung (XID 79's) the ladder's plays must not run in a fence-only run either
    lane = {**fault_vars(lab, "gpu-4", "inc-lane4", autoheal_backend="none"), "autoheal_tier": "reboot"}
    try:
        res = run_playbook("gpu_fatal_xid", {**lane, "autoheal_stop_after": "fenced"}, tmp=tmp_path)
        assert res.rc == 0, res.output[-5000:]
        assert [e["phase"] for e in lab.journal_lines() if e["node"] == "gpu-4"] == ["fenced"]
        assert lab.node("gpu-4")["state"] != "down"
    finally:
        back = {**lab.base_vars(), "autoheal_nodes": ["gpu-4"], "autoheal_incident_ids": ["inc-lane4"]}
        run_playbook("node_return", back, tmp=tmp_path)


def readme_example() -> str:
    """The README's on-call example, as it stands."""
    text = (REPO / "README.md").read_text()
    line = next(
        x for x in text.splitlines() if x.startswith(".venv/bin/ansible-playbook playbooks/fence.yml")
    )
    assert ".lab/default/" in line, line
    return line


def test_the_readme_example_works_as_written_with_its_relative_paths(kube_lab, tmp_path):
    """Issue 21: the modules run in a directory of their own, so the play makes the relative
    paths absolute from where the engineer ran it. The command runs from a checkout-shaped folder
    whose .lab/ holds the test lab (its name in place of "default")."""
    lab = kube_lab
    work = tmp_path / "checkout"
    work.mkdir()
    for part in ("playbooks", "roles", "collections", "inventory", "ansible.cfg"):
        (work / part).symlink_to(REPO / part)
    (work / ".venv").symlink_to(VENV_BIN.parent)
    (work / ".lab").symlink_to(lab.root)
    argv = shlex.split(readme_example().replace(".lab/default/", f".lab/{lab.name}/"))
    before = snapshot(lab)
    res = subprocess.run(argv, cwd=work, env=ansible_env(), capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "changed: [localhost]" in out  # check mode: it would drain and quarantine gpu-2
    assert snapshot(lab) == before

    # from anywhere else the same paths name nothing: refused before any step, naming the fix
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    argv[:2] = [str(VENV_BIN / "ansible-playbook"), str(REPO / "playbooks/fence.yml")]
    res = subprocess.run(argv, cwd=elsewhere, env=ansible_env(), capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert f"autoheal_slurm_conf: .lab/{lab.name}/slurm/slurm.conf does not exist" in out, out[-3000:]
    assert f"relative paths are read from {elsewhere}" in out
    assert snapshot(lab) == before

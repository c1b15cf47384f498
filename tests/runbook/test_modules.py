"""The autoheal.cluster modules against real Slurm (and the lab's Kubernetes): changed, then not
changed; check mode changes nothing; an administrator's drain or cordon is never touched."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.runbook.conftest import run_module, trap_job_script
from tests.support import pinned_deployment, wait_for

pytestmark = pytest.mark.lab


def conf(lab: Any) -> dict[str, str]:
    return {"slurm_conf": str(lab.slurm_conf)}


def reset(lab: Any, *nodes: str) -> None:
    for n in nodes:
        lab.slurm("scontrol", "update", f"nodename={n}", "state=resume", check=False)
        lab.slurm("scontrol", "update", f"nodename={n}", "comment=", check=False)


def test_slurm_node_drain_reports_changed_once_then_nothing(lab):
    args = {"nodes": ["gpu-1", "gpu-2"], "state": "drain", "reason": "XID 79 gpu3 inc-a", **conf(lab)}
    try:
        first = run_module("slurm_node", args)
        assert first["changed"] and sorted(first["changed_nodes"]) == ["gpu-1", "gpu-2"]
        # one scontrol call with a hostlist for the batch
        updates = [c for c in first["commands"] if "update" in c]
        assert len(updates) == 1 and "nodename=gpu-[1-2]" in updates[0]
        for n in ("gpu-1", "gpu-2"):
            node = lab.node(n)
            assert "DRAIN" in node["state_flags"] and node["reason"] == "autoheal: XID 79 gpu3 inc-a"
        second = run_module("slurm_node", args)
        assert not second["changed"] and sorted(second["unchanged_nodes"]) == ["gpu-1", "gpu-2"]
    finally:
        reset(lab, "gpu-1", "gpu-2")


def test_slurm_node_check_mode_predicts_but_changes_nothing(lab):
    before = lab.node("gpu-3")
    res = run_module(
        "slurm_node", {"nodes": ["gpu-3"], "state": "down", "reason": "x", **conf(lab)}, check=True
    )
    assert res["changed"] and res["changed_nodes"] == ["gpu-3"]
    assert res["nodes_after"]["gpu-3"]["state"] == "down"
    assert all("update" not in c for c in res["commands"])
    after = lab.node("gpu-3")
    assert (after["state"], after["state_flags"], after["reason"]) == (
        before["state"],
        before["state_flags"],
        before["reason"],
    )


def test_slurm_node_never_overrides_or_clears_an_admin_drain(lab):
    lab.slurm("scontrol", "update", "nodename=gpu-4", "state=drain", "reason=bad dimm ticket 881")
    try:
        for state in ("drain", "down", "resume"):
            res = run_module(
                "slurm_node", {"nodes": ["gpu-4"], "state": state, "reason": "XID 79", **conf(lab)}
            )
            assert not res["changed"], state
            assert [s["node"] for s in res["skipped_nodes"]] == ["gpu-4"]
            assert res["skipped_nodes"][0]["reason"] == "bad dimm ticket 881"
            node = lab.node("gpu-4")
            assert "DRAIN" in node["state_flags"] and node["reason"] == "bad dimm ticket 881"
            assert node["state"] != "down"
    finally:
        lab.slurm("scontrol", "update", "nodename=gpu-4", "state=resume")


def test_slurm_node_down_then_resume_round_trip(lab):
    args = {"nodes": ["gpu-3"], "reason": "XID 79 inc-b", **conf(lab)}
    try:
        assert run_module("slurm_node", {**args, "state": "down"})["changed"]
        assert lab.node("gpu-3")["state"] == "down"
        # a node that is DOWN with our reason also satisfies "drain": a rerun of the fence changes nothing
        assert not run_module("slurm_node", {**args, "state": "drain"})["changed"]
        assert not run_module("slurm_node", {**args, "state": "down"})["changed"]
        res = run_module("slurm_node", {"nodes": ["gpu-3"], "state": "resume", **conf(lab)})
        assert res["changed"]
        assert wait_for(lambda: lab.node("gpu-3")["state"] in ("idle", "mixed", "allocated"), 15, "resume")
        assert not run_module("slurm_node", {"nodes": ["gpu-3"], "state": "resume", **conf(lab)})["changed"]
    finally:
        reset(lab, "gpu-3")


def test_slurm_node_rejects_hostile_names_before_running_anything(lab):
    res = run_module("slurm_node", {"nodes": ["gpu-1,gpu-2"], "state": "drain", "reason": "x", **conf(lab)})
    assert res.get("failed") and "invalid node name" in res["msg"]
    res = run_module("slurm_node", {"nodes": ["gpu-1"], "state": "drain", "reason": "x\ny", **conf(lab)})
    assert res.get("failed")
    assert lab.flags("gpu-1") == []  # nothing was drained (slurmctld's own NOT_RESPONDING aside)


def test_slurm_node_unknown_nodes_fail_after_the_known_ones_are_fenced(lab):
    try:
        res = run_module(
            "slurm_node", {"nodes": ["gpu-2", "gpu-99"], "state": "drain", "reason": "x", **conf(lab)}
        )
        assert res.get("failed") and res["missing_nodes"] == ["gpu-99"]
        assert "DRAIN" in lab.node("gpu-2")["state_flags"]
    finally:
        reset(lab, "gpu-2")


def test_slurm_jobs_evacuate_signals_waits_requeues_and_reports_no_requeue_jobs(lab, tmp_path):
    script, log = trap_job_script(tmp_path)
    lab.slurm(
        "scontrol", "update", "nodename=gpu-1,gpu-2", "state=drain", "reason=autoheal: test", check=False
    )
    lab.slurm("scontrol", "update", "nodename=gpu-1,gpu-2", "state=resume")
    a = lab.sbatch("-N1", "-w", "gpu-1", "--requeue", "-o", "/dev/null", str(script))
    b = lab.sbatch("-N1", "-w", "gpu-2", "--no-requeue", "-o", "/dev/null", str(script))
    try:
        wait_for(lambda: all(lab.jobs()[j]["job_state"] == "RUNNING" for j in (a, b)), 30, "jobs running")
        # fence first, as the runbook does, so the requeued job cannot come back to these nodes
        lab.slurm("scontrol", "update", "nodename=gpu-[1-2]", "state=drain", "reason=autoheal: test")
        args = {"nodes": ["gpu-1", "gpu-2"], "grace_seconds": 30, **conf(lab)}
        dry = run_module("slurm_jobs", args, check=True)
        assert dry["changed"] and sorted(dry["job_ids"]) == sorted([a, b]) and dry["requeued_job_ids"] == [a]
        assert lab.jobs()[a]["job_state"] == "RUNNING"  # check mode sent nothing

        res = run_module("slurm_jobs", args)
        assert res["changed"] and res["requeued_job_ids"] == [a]
        assert [x["job_id"] for x in res["not_requeued"]] == [b]
        assert res["still_running_job_ids"] == [] and res["waited_seconds"] < 30
        assert sorted(log.read_text().split()) == sorted(["TERM", str(a), "TERM", str(b)])
        jobs = lab.jobs()
        assert jobs[a]["job_state"] == "PENDING" and jobs[a]["restart_cnt"] == 1
        assert jobs[b]["job_state"] == "COMPLETED"
        again = run_module("slurm_jobs", args)
        assert not again["changed"] and again["job_ids"] == []
    finally:
        lab.slurm("scancel", str(a), str(b), check=False)
        reset(lab, "gpu-1", "gpu-2")


def test_slurm_spares_promotes_one_spare_per_incident_only_once(fresh_lab):
    lab = fresh_lab
    args = {"nodes": ["gpu-2"], "incident_ids": ["inc-s1"], **conf(lab)}
    dry = run_module("slurm_spares", args, check=True)
    assert dry["changed"] and dry["promotions"][0]["spare"] == "gpu-5"
    assert "DRAIN" in lab.node("gpu-5")["state_flags"]
    res = run_module("slurm_spares", args)
    assert res["changed"] and res["promoted_spares"] == ["gpu-5"]
    spare = lab.node("gpu-5")
    assert "DRAIN" not in spare["state_flags"] and spare["comment"] == "autoheal: replaces gpu-2 inc-s1"
    again = run_module("slurm_spares", args)
    assert not again["changed"] and again["promotions"][0]["status"] == "already"
    assert "DRAIN" in lab.node("gpu-6")["state_flags"]  # the other spare is untouched
    # the alert fires again after the dedup window: a new incident for the same outage takes no
    # second spare (the record stands until gpu-2 returns to service)
    refire = run_module("slurm_spares", {**args, "incident_ids": ["inc-s1-refire"]})
    assert not refire["changed"] and refire["promotions"][0]["spare"] == "gpu-5"
    assert refire["promotions"][0]["status"] == "already"
    assert "DRAIN" in lab.node("gpu-6")["state_flags"]
    # a new incident on another node takes the next spare; then the pool has none left
    two = run_module("slurm_spares", {"nodes": ["gpu-3", "gpu-4"], "incident_ids": ["i3", "i4"], **conf(lab)})
    assert [p["spare"] for p in two["promotions"]] == ["gpu-6", None] and two["shortfall"] == ["gpu-4"]


def test_slurm_spares_concurrent_runs_never_promote_the_same_spare(fresh_lab):
    """Two runs of a storm promote at once: each failed node gets its own spare, none fails."""
    from concurrent.futures import ThreadPoolExecutor

    lab = fresh_lab

    def promote(node: str) -> dict[str, Any]:
        return run_module("slurm_spares", {"nodes": [node], "incident_ids": [f"i-{node}"], **conf(lab)})

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(promote, ["gpu-3", "gpu-4"])
    assert not a.get("failed") and not b.get("failed"), (a.get("msg"), b.get("msg"))
    assert sorted([a["promotions"][0]["spare"], b["promotions"][0]["spare"]]) == ["gpu-5", "gpu-6"]
    assert {lab.node(n)["comment"] for n in ("gpu-5", "gpu-6")} == {
        "autoheal: replaces gpu-3 i-gpu-3",
        "autoheal: replaces gpu-4 i-gpu-4",
    }


@pytest.mark.kube
def test_k8s_nodes_quarantine_is_idempotent_and_leaves_an_admin_cordon(kube_lab):
    lab = kube_lab
    kc = str(lab.kubeconfig)
    lab.kubectl("cordon", "gpu-4")  # an administrator's cordon
    args = {
        "nodes": ["gpu-3", "gpu-4"],
        "cordon": True,
        "kubeconfig": kc,
        "labels": {"autoheal.io/state": "quarantined"},
        "taints": [{"key": "autoheal.io/quarantine", "value": "replace", "effect": "NoSchedule"}],
    }
    try:
        dry = run_module("k8s_nodes", args, check=True)
        assert dry["changed"] and "autoheal.io/quarantine" not in json.dumps(lab.kube_node("gpu-3")["spec"])
        res = run_module("k8s_nodes", args)
        assert sorted(res["changed_nodes"]) == ["gpu-3", "gpu-4"]
        n3 = lab.kube_node("gpu-3")
        assert n3["spec"]["unschedulable"] is True
        assert {"key": "autoheal.io/quarantine", "value": "replace", "effect": "NoSchedule"} in n3["spec"][
            "taints"
        ]
        assert n3["metadata"]["labels"]["autoheal.io/state"] == "quarantined"
        assert not run_module("k8s_nodes", args)["changed"]
        lift = {
            "nodes": ["gpu-3", "gpu-4"],
            "cordon": False,
            "kubeconfig": kc,
            "labels": {"autoheal.io/state": None},
            "taints": [{"key": "autoheal.io/quarantine", "state": "absent"}],
        }
        res = run_module("k8s_nodes", lift)
        assert res["changed"] and [s["node"] for s in res["skipped_nodes"]] == ["gpu-4"]
        assert not lab.kube_node("gpu-3")["spec"].get("unschedulable")
        n4 = lab.kube_node("gpu-4")
        assert n4["spec"]["unschedulable"] is True  # the admin's cordon stays
        assert "autoheal.io/quarantine" not in json.dumps(n4["spec"].get("taints", []))
        assert not run_module("k8s_nodes", lift)["changed"]
    finally:
        lab.kubectl("uncordon", "gpu-3", "gpu-4", check=False)


@pytest.mark.kube
def test_fence_drains_and_quarantines_in_one_task_then_changes_nothing(kube_lab):
    lab = kube_lab
    lab.slurm("scontrol", "update", "nodename=gpu-2", "state=drain", "reason=bad dimm")  # an admin's drain
    args = {
        "nodes": ["gpu-1", "gpu-2"],
        "reasons": {"gpu-1": "XID 79 gpu3 inc-f1", "gpu-2": "XID 79 gpu0 inc-f2"},
        "incident_ids": ["inc-f1", "inc-f2"],
        "tier": "replace",
        "kubeconfig": str(lab.kubeconfig),
        **conf(lab),
    }
    try:
        dry = run_module("fence", args, check=True)
        assert dry["changed"] and "DRAIN" not in lab.node("gpu-1")["state_flags"]
        assert not lab.kube_node("gpu-1")["spec"].get("unschedulable")
        res = run_module("fence", args)
        assert res["slurm"]["changed_nodes"] == ["gpu-1"]
        assert [s["node"] for s in res["slurm"]["skipped_nodes"]] == ["gpu-2"]
        assert sorted(res["kube"]["changed_nodes"]) == ["gpu-1", "gpu-2"]
        assert lab.node("gpu-1")["reason"] == "autoheal: XID 79 gpu3 inc-f1"
        assert lab.node("gpu-2")["reason"] == "bad dimm"  # never overridden
        n1 = lab.kube_node("gpu-1")
        assert n1["spec"]["unschedulable"] is True
        assert {"key": "autoheal.io/quarantine", "value": "replace", "effect": "NoSchedule"} in n1["spec"][
            "taints"
        ]
        assert n1["metadata"]["annotations"]["autoheal.io/incident"] == "inc-f1"
        assert n1["metadata"]["labels"]["autoheal.io/state"] == "quarantined"
        again = run_module("fence", args)
        assert not again["changed"], again
    finally:
        reset(lab, "gpu-1", "gpu-2")
        lab.kubectl("uncordon", "gpu-1", "gpu-2", check=False)
        lab.kubectl("taint", "nodes", "gpu-1", "gpu-2", "autoheal.io/quarantine-", check=False)
        lab.kubectl("label", "nodes", "gpu-1", "gpu-2", "autoheal.io/state-", check=False)
        lab.kubectl(
            "annotate",
            "nodes",
            "gpu-1",
            "gpu-2",
            "autoheal.io/incident-",
            "autoheal.io/cordoned-by-",
            check=False,
        )


@pytest.mark.kube
def test_k8s_nodes_info_reports_opt_out_from_a_pod_label(kube_lab):
    lab = kube_lab
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "optout-probe",
            "namespace": "default",
            "labels": {"autoheal.io/opt-out": "true"},
        },
        "spec": {
            "nodeName": "gpu-2",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "fake"}],
        },
    }
    lab.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    try:
        res = run_module(
            "k8s_nodes_info", {"nodes": ["gpu-1", "gpu-2", "gpu-404"], "kubeconfig": str(lab.kubeconfig)}
        )
        assert res["opt_out_nodes"] == {"gpu-2": ["pod default/optout-probe"]}
        assert res["missing_nodes"] == ["gpu-404"]
        assert res["nodes"]["gpu-1"]["opt_out"] is False
    finally:
        lab.kubectl("delete", "pod", "optout-probe", "--grace-period=0", "--force", check=False)


@pytest.mark.kube
def test_k8s_evict_drains_a_batch_and_reports_what_a_pdb_protects(kube_lab):
    lab = kube_lab
    kc = str(lab.kubeconfig)

    def deployment(name: str, node: str, replicas: int) -> dict[str, Any]:
        return pinned_deployment(
            name, node, replicas, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]
        )

    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded", "namespace": "default"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    items = [deployment("guarded", "gpu-3", 2), deployment("free", "gpu-4", 1), pdb]
    lab.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    def pods(app: str, node: str) -> list[str]:
        out = json.loads(lab.kubectl("get", "pods", "-l", f"app={app}", "-o", "json"))["items"]
        return [
            p["metadata"]["name"]
            for p in out
            if p["spec"].get("nodeName") == node
            and not p["metadata"].get("deletionTimestamp")
            and p.get("status", {}).get("phase") == "Running"
        ]

    def pdb_ready() -> bool:
        st = json.loads(lab.kubectl("get", "pdb", "guarded", "-o", "json")).get("status", {})
        return st.get("currentHealthy") == 2 and st.get("disruptionsAllowed") == 0

    try:
        wait_for(lambda: len(pods("guarded", "gpu-3")) == 2 and pods("free", "gpu-4"), 90, "pods running")
        wait_for(pdb_ready, 60, "the PDB to count its pods")
        lab.kubectl("cordon", "gpu-3", "gpu-4")
        args = {"nodes": ["gpu-3", "gpu-4"], "kubeconfig": kc, "timeout": 6, "poll": 1}
        dry = run_module("k8s_evict", args, check=True)
        assert dry["changed"] and len(dry["evicted"]["gpu-3"]) == 2 and len(dry["evicted"]["gpu-4"]) == 1
        assert len(pods("guarded", "gpu-3")) == 2 and pods("free", "gpu-4")
        res = run_module("k8s_evict", args)
        assert not res["failed"], res
        assert res["drained_nodes"] == ["gpu-4"] and "gpu-4" not in res["not_evicted"]
        assert wait_for(lambda: not pods("free", "gpu-4"), 30, "free pod evicted")
        # each evicted pod with its workload (the Deployment, through its ReplicaSet's name)
        (owner,) = res["evicted_owners"]["gpu-4"]
        assert (owner["kind"], owner["namespace"], owner["name"]) == ("Deployment", "default", "free")
        assert owner["pod"] == res["evicted"]["gpu-4"][0] and owner["contact"] == ""
        blocked = res["not_evicted"]["gpu-3"]
        assert len(blocked) == 2 and all("disruption budget" in b["reason"].lower() for b in blocked)
        assert len(pods("guarded", "gpu-3")) == 2  # the budget was respected
    finally:
        lab.kubectl(
            "delete",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
            check=False,
        )
        lab.kubectl("uncordon", "gpu-3", "gpu-4", check=False)


def test_fence_sigterms_the_jobs_in_the_same_step_and_slurm_jobs_only_requeues_them(lab, tmp_path):
    """Issue 18: the jobs get SIGTERM at the fence, not steps later; slurm_jobs then requeues each
    job that has left (here: before it even started) without signalling it a second time."""
    script, log = trap_job_script(tmp_path)
    a = lab.sbatch("-N1", "-w", "gpu-1", "--requeue", "-o", "/dev/null", str(script))
    try:
        wait_for(lambda: lab.jobs()[a]["job_state"] == "RUNNING", 30, "job running")
        args = {
            "nodes": ["gpu-1"],
            "reasons": {"gpu-1": "XID 79 gpu3 inc-s1"},
            "kubernetes": False,
            "signal_jobs": ["gpu-1"],
            **conf(lab),
        }
        dry = run_module("fence", args, check=True)
        assert [j["job_id"] for j in dry["jobs"]["jobs"]] == [a] and dry["jobs"]["signalled_job_ids"] == []
        assert not log.exists()  # check mode signals nothing
        fence = run_module("fence", args)
        assert "DRAIN" in lab.node("gpu-1")["state_flags"]
        assert fence["jobs"]["signalled_job_ids"] == [a] and fence["jobs"]["signalled_at"]
        wait_for(lambda: log.exists() and log.read_text().split() == ["TERM", str(a)], 10, "the trap")
        wait_for(lambda: lab.jobs()[a]["job_state"] not in ("RUNNING", "COMPLETING"), 15, "the job to leave")
        res = run_module(
            "slurm_jobs",
            {
                "nodes": ["gpu-1"],
                "grace_seconds": 30,
                "signalled_job_ids": [a],
                "signalled_at": fence["jobs"]["signalled_at"],
                **conf(lab),
            },
        )
        assert res["requeued_job_ids"] == [a] and res["requeued_at"] >= fence["jobs"]["signalled_at"]
        assert not [c for c in res["commands"] if "scancel" in c[0]]  # not signalled twice
        assert log.read_text().split() == ["TERM", str(a)]
        assert lab.jobs()[a]["job_state"] == "PENDING" and lab.jobs()[a]["restart_cnt"] == 1
    finally:
        lab.slurm("scancel", str(a), check=False)
        reset(lab, "gpu-1")


# -- evidence: a batch in one module run ------------------------------------------------------------
# No cluster needed: the sources are files and a local metrics endpoint.


class MetricsServer:
    """A Prometheus text endpoint with GPU metrics for gpu-1, gpu-2 and gpu-9 (a whole cluster's,
    as one federation endpoint); counts its reads."""

    BODY = "\n".join(
        [
            "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature",
            *(
                f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="{n}"}} 4{i}'
                for i, n in enumerate(["gpu-1", "gpu-2", "gpu-9"])
            ),
            'DCGM_FI_DEV_XID_ERRORS{gpu="0",Hostname="gpu-1"} 79',
        ]
    )

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from threading import Thread

        self.reads = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.reads += 1
                body = MetricsServer.BODY.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def metrics_server():
    s = MetricsServer()
    yield s
    s.stop()


def evidence_batch(tmp_path: Any, url: str, nodes: tuple[str, ...] = ("gpu-1", "gpu-2")) -> dict[str, Any]:
    entries = []
    for i, n in enumerate(nodes):
        kmsg = tmp_path / f"kmsg-{n}"
        kmsg.write_text(
            f"6,1,1,-;boot\n3,2,2,-;NVRM: Xid (PCI:0000:0{i}:00): 79, pid=1, GPU has fallen off the bus.\n"
        )
        entries.append(
            {
                "node": n,
                "incident_id": f"inc-00000000007{i}",
                "kmsg": str(kmsg),
                "metrics_url": url,
                "gpus": [{"gpu": 0, "uuid": f"GPU-{n}", "serial": f"1652{i}"}],
                "validation": {"failures": "injected diagnostic failure"} if n == "gpu-2" else {},
            }
        )
    return {"nodes": entries, "xid": 79, "gpu": 0, "dir": str(tmp_path / "evidence")}


def bundle_files(tmp_path: Any) -> dict[str, float]:
    root = tmp_path / "evidence"
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")} if root.exists() else {}


def test_evidence_collects_a_batch_in_one_run_reading_each_metrics_endpoint_once(tmp_path, metrics_server):
    import tarfile

    args = evidence_batch(tmp_path, metrics_server.url)
    res = run_module("evidence", args)
    assert not res["failed"] and res["changed"], res
    ev = tmp_path / "evidence"
    assert res["paths"] == {
        "gpu-1": str(ev / "inc-000000000070-gpu-1.tar.gz"),
        "gpu-2": str(ev / "inc-000000000071-gpu-2.tar.gz"),
    }
    assert [(b["node"], b["changed"], b["missing"]) for b in res["bundles"]] == [
        ("gpu-1", True, []),
        ("gpu-2", True, []),
    ]
    assert metrics_server.reads == 1  # one read of the shared endpoint for the whole batch
    for n, inc in (("gpu-1", "inc-000000000070"), ("gpu-2", "inc-000000000071")):
        with tarfile.open(ev / f"{inc}-{n}.tar.gz") as tar:
            summary = json.loads(tar.extractfile(f"{inc}-{n}/summary.json").read())
            metrics = tar.extractfile(f"{inc}-{n}/metrics.txt").read().decode()
            lines = tar.extractfile(f"{inc}-{n}/xid_lines.txt").read().decode()
        assert summary["node"] == n and summary["incident"] == inc and summary["xid"] == 79
        assert summary["gpus"][0]["uuid"] == f"GPU-{n}" and summary["missing"] == []
        assert f'Hostname="{n}"' in metrics and "gpu-9" not in metrics and "# HELP" not in metrics
        assert "fallen off the bus" in lines and "boot" not in lines
    assert summary["validation"] == {"failures": "injected diagnostic failure"}  # gpu-2's
    assert "XID_ERRORS" in (ev / "inc-000000000070-gpu-1" / "metrics.txt").read_text()


def test_evidence_batch_keeps_what_exists_and_check_mode_writes_nothing(tmp_path, metrics_server):
    args = evidence_batch(tmp_path, metrics_server.url)
    dry = run_module("evidence", args, check=True)
    assert not dry["failed"] and dry["changed"], dry
    assert [b["changed"] for b in dry["bundles"]] == [True, True] and len(dry["paths"]) == 2
    assert bundle_files(tmp_path) == {} and metrics_server.reads == 0  # nothing read, nothing written

    assert run_module("evidence", args)["changed"]
    before = bundle_files(tmp_path)
    again = run_module("evidence", args)
    assert not again["failed"] and not again["changed"], again
    assert [b["changed"] for b in again["bundles"]] == [False, False]
    assert bundle_files(tmp_path) == before and metrics_server.reads == 1  # kept as taken, not read again

    # a third node joins the batch: only its bundle is written; check mode says so first
    bigger = evidence_batch(tmp_path, metrics_server.url, ("gpu-1", "gpu-2", "gpu-9"))
    dry = run_module("evidence", bigger, check=True)
    assert [b["changed"] for b in dry["bundles"]] == [False, False, True] and bundle_files(tmp_path) == before
    res = run_module("evidence", bigger)
    assert [b["changed"] for b in res["bundles"]] == [False, False, True]
    after = bundle_files(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before
    assert "inc-000000000072-gpu-9.tar.gz" in after


def test_evidence_single_node_form_still_works_and_the_forms_do_not_mix(tmp_path):
    one = {"node": "gpu-3", "incident_id": "inc-0123456789ab", "xid": 48, "dir": str(tmp_path / "evidence")}
    res = run_module("evidence", {**one, "metrics_url": "http://127.0.0.1:9/metrics"})
    assert not res["failed"] and res["changed"], res
    assert res["path"] == str(tmp_path / "evidence" / "inc-0123456789ab-gpu-3.tar.gz")
    assert res["paths"] == {"gpu-3": res["path"]} and res["missing"][0].startswith("metrics: ")
    assert not run_module("evidence", one)["changed"]
    both = run_module("evidence", {**one, "nodes": [{"node": "gpu-4"}]})
    assert both["failed"] and "mutually exclusive" in both["msg"]
    shared = run_module(
        "evidence", {"nodes": [{"node": "gpu-4"}], "kmsg": "/x", "xid": 48, "dir": one["dir"]}
    )
    assert shared["failed"] and "mutually exclusive" in shared["msg"]
    twice = run_module(
        "evidence", {"nodes": [{"node": "gpu-4"}, {"node": "gpu-4"}], "xid": 48, "dir": one["dir"]}
    )
    assert twice["failed"] and "given twice" in twice["msg"]
    hostile = run_module("evidence", {"nodes": [{"node": "gpu-4; rm -rf /"}], "xid": 48, "dir": one["dir"]})
    assert hostile["failed"] and "invalid node name" in hostile["msg"]

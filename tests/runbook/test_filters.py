"""The runbooks' decisions, held by the collection's filters and the inputs step, without a
cluster: Slurm reasons, which nodes a step acts on, journal and Kubernetes events, paths."""

from __future__ import annotations

import os

import pytest

from tests.runbook.conftest import plugin

runbook = plugin("filter.runbook")
events = plugin("filter.journal_events")
inputs = plugin("plugin_utils.runbook_inputs")


def run(**kw):
    nodes = kw.pop("nodes", ["gpu-1", "gpu-2"])
    incidents = kw.pop("incidents", {n: f"inc-{n[-1]}" for n in nodes})
    return {"nodes": nodes, "incidents": incidents, **kw}


# ---------------------------------------------------------------- reasons


def test_fault_reasons_name_each_incident_up_to_the_per_node_limit():
    r = run(xid=79, gpu=3, reason_per_node_max=4)
    assert runbook.slurm_reasons(r) == {"gpu-1": "XID 79 gpu3 inc-1", "gpu-2": "XID 79 gpu3 inc-2"}
    assert runbook.slurm_reasons({**r, "gpu": None})["gpu-1"] == "XID 79 inc-1"


def test_a_storm_shares_one_reason_so_one_scontrol_call_fences_it():
    nodes = [f"gpu-{i}" for i in range(1, 7)]
    reasons = runbook.slurm_reasons(run(nodes=nodes, xid=79, gpu=0, reason_per_node_max=4))
    assert set(reasons.values()) == {"XID 79 gpu0 inc-1 +5"} and list(reasons) == nodes


def test_a_manual_fence_names_its_reason_and_incident():
    assert runbook.slurm_reasons(run(reason="bad fan"))["gpu-2"] == "bad fan inc-2"
    assert runbook.slurm_reasons(run())["gpu-1"] == "manual fence inc-1"


# ---------------------------------------------------------------- triage


FENCE = {"gone_nodes": ["gpu-9"], "slurm_nodes": ["gpu-1", "gpu-2"], "kube_nodes": ["gpu-1"]}


def test_triage_skips_gone_nodes_and_keeps_opted_out_ones_fenced_only():
    r = run(nodes=["gpu-1", "gpu-2", "gpu-9"])
    t = runbook.triage(FENCE, r, {"gpu-2": ["pod team/a", "node label"]})
    assert t["gone"] == ["gpu-9"] and t["fenced"] == ["gpu-1", "gpu-2"]
    assert t["opt_out"] == ["gpu-2"] and t["opt_out_why"] == {"gpu-2": "pod team/a, node label"}
    assert t["act"] == ["gpu-1"] and t["act_slurm"] == ["gpu-1"] and t["act_kube"] == ["gpu-1"]


def test_autoheal_opt_out_opts_out_every_node_that_exists():
    t = runbook.triage(FENCE, run(nodes=["gpu-1", "gpu-2", "gpu-9"], opt_out=True), {})
    assert t["opt_out"] == ["gpu-1", "gpu-2"] and t["act"] == []


# ---------------------------------------------------------------- small helpers


def test_nodes_where_selects_records_by_field():
    info = {"a": {"down": True, "owned": True}, "b": {"down": True, "owned": False}, "c": {"down": False}}
    assert runbook.nodes_where(info, down=True, owned=True) == ["a"]
    assert runbook.nodes_where(info, down=False) == ["c"]


def test_promoted_for_finds_the_spares_whose_record_names_a_returning_node():
    info = {
        "gpu-5": {"comment": "autoheal: replaces gpu-1 inc-a"},
        "gpu-6": {"comment": "autoheal: replaces gpu-10 inc-b"},  # gpu-10, not gpu-1
        "gpu-7": {"comment": "autoheal: replaces gpu-2"},
        "gpu-8": {"comment": "an admin's note: replaces gpu-1"},
        "gpu-9": {"comment": ""},
    }
    assert runbook.promoted_for(info, ["gpu-1"]) == ["gpu-5"]
    assert sorted(runbook.promoted_for(info, ["gpu-1", "gpu-2", "gpu-10"])) == ["gpu-5", "gpu-6", "gpu-7"]
    assert runbook.promoted_for(info, []) == []


def test_node_map_and_annotate_skip_nodes_without_a_value():
    m = runbook.node_map(["a", "b"], ["i1"])
    assert m == {"a": "i1", "b": None}
    assert runbook.annotate(m, "autoheal.io/incident") == {"a": {"autoheal.io/incident": "i1"}}


def test_k8s_drain_outcome_reads_a_loop_of_k8s_drain_results():
    results = [
        {"item": "a", "result": "drained", "warnings": ["w"]},
        {"item": "b", "msg": "PDB says no", "failed": True},
        {"item": "c", "skipped": True},
    ]
    out = runbook.k8s_drain_outcome(results)
    assert out == {"drained": ["a"], "failures": {"b": "PDB says no"}, "warnings": {"a": ["w"]}}


def test_lab_pools_tells_when_the_pool_is_backfilled():
    status = {
        "retired": ["gpu-3"],
        "pools": {"h100": {"members": ["gpu-1", "gpu-7"], "pending": [], "declared": 2}},
    }
    assert runbook.lab_pools(status) == {
        "retired": ["gpu-3"],
        "members": ["gpu-1", "gpu-7"],
        "pending": [],
        "backfilled": True,
    }
    status["pools"]["h100"]["pending"] = ["gpu-8"]
    assert runbook.lab_pools(__import__("json").dumps(status))["backfilled"] is False


# ---------------------------------------------------------------- journal events


def test_fence_events_name_an_admin_reason_kept_and_gone_nodes():
    incidents = {"gpu-1": "i1", "gpu-2": "i2", "gpu-9": "i9"}
    fence = {"gone_nodes": ["gpu-9"], "slurm": {"skipped_nodes": [{"node": "gpu-2", "reason": "bad dimm"}]}}
    evs = events.fence_events(fence, incidents)
    assert [(e["node"], e["phase"], e["status"]) for e in evs] == [
        ("gpu-1", "fenced", "ok"),
        ("gpu-2", "fenced", "ok"),
        ("gpu-9", "gone", "skipped"),
    ]
    assert evs[1]["detail"] == "slurm reason kept: bad dimm" and "detail" not in evs[0]
    # the fence module's own end is the stamp (not the journal step's start, ~0.13 s later)
    stamped = events.fence_events({**fence, "fenced_at": 1234.5}, incidents)
    assert [e["ts"] for e in stamped if e["phase"] == "fenced"] == [1234.5, 1234.5]


def test_fence_events_say_a_node_is_not_in_slurm_and_lent_to_inference():
    """Issue 35: a lent node has no slurmd, so no Slurm record; the fence's Slurm half skips it and
    the journal says why, from the lend label the Kubernetes half read."""
    incidents = {"gpu-1": "i1", "gpu-2": "i2", "gpu-3": "i3"}
    fence = {
        "slurm": {"missing_nodes": ["gpu-2", "gpu-3"]},
        "slurm_nodes": ["gpu-1"],
        "kube_nodes": ["gpu-1", "gpu-2", "gpu-3"],
        "kube": {"nodes_after": {"gpu-2": {"labels": {"autoheal.io/lend": "lent"}}, "gpu-3": {"labels": {}}}},
        "gone_nodes": [],
    }
    evs = {e["node"]: e for e in events.fence_events(fence, incidents)}
    assert {n: (e["phase"], e["status"]) for n, e in evs.items()} == {n: ("fenced", "ok") for n in incidents}
    assert evs["gpu-2"]["detail"] == "not in Slurm: lent to inference (autoheal.io/lend=lent)"
    assert evs["gpu-3"]["detail"] == "not in Slurm" and "detail" not in evs["gpu-1"]


def test_drain_events_name_the_evicted_pods_their_workload_and_owner():
    evicted = {
        "a": [
            {
                "pod": "web/infer-7d9-x",
                "namespace": "web",
                "kind": "Deployment",
                "name": "infer",
                "contact": "email:s@x.org",
            },
            {"pod": "web/solo", "namespace": "web", "kind": "Pod", "name": "solo", "contact": ""},
        ]
    }
    (ev,) = events.drain_events(["a"], {}, {"a": "i"}, evicted)
    assert ev["detail"] == (
        "evicted web/infer-7d9-x (Deployment web/infer, owner email:s@x.org); web/solo (Pod web/solo, no owner-contact)"
    )
    assert "detail" not in events.drain_events(["a"], {}, {"a": "i"}, {"a": []})[0]


def test_the_drain_names_each_evicted_pods_workload_and_contact_from_the_pod_alone():
    evict = plugin("modules.k8s_evict")

    def pod(refs: list[dict[str, object]], labels: dict[str, str], ann: dict[str, str]) -> dict[str, object]:
        meta = {
            "name": "p",
            "namespace": "web",
            "ownerReferences": refs,
            "labels": labels,
            "annotations": ann,
        }
        return {"metadata": meta}

    rs = [{"kind": "ReplicaSet", "name": "infer-7d9f8", "controller": True}]
    contact = {"autoheal.io/owner-contact": "slack:#serving"}
    assert evict.owner_record(pod(rs, {"pod-template-hash": "7d9f8"}, contact)) == {
        "pod": "web/p",
        "namespace": "web",
        "kind": "Deployment",
        "name": "infer",
        "contact": "slack:#serving",
    }
    # a ReplicaSet not named after the pod's template hash stays a ReplicaSet; no controller: the pod
    assert evict.owner_record(pod(rs, {}, {}))["kind"] == "ReplicaSet"
    assert evict.owner_record(pod([], {}, {}))["kind"] == "Pod"
    sts = [{"kind": "StatefulSet", "name": "db", "controller": True}]
    assert (evict.owner_record(pod(sts, {}, {}))["kind"], evict.owner_record(pod(sts, {}, {}))["name"]) == (
        "StatefulSet",
        "db",
    )


def test_evacuation_events_report_signalled_and_requeued_jobs_per_node():
    jobs = {
        "jobs": [{"job_id": 7, "nodes": ["a", "b"]}, {"job_id": 8, "nodes": ["b"]}],
        "requeued_job_ids": [7],
        "not_requeued": [{"job_id": 8}],
        "signalled_at": 100.0,
    }
    evs = {(e["node"], e["phase"]): e for e in events.evacuation_events(jobs, ["a", "b", "c"], {"a": "i"})}
    assert evs[("a", "jobs_signalled")]["detail"] == "jobs 7" and evs[("a", "jobs_signalled")]["ts"] == 100.0
    assert evs[("b", "requeued")]["status"] == "failed"
    assert evs[("b", "requeued")]["detail"] == "requeued 7 not requeued 8"
    assert evs[("c", "jobs_signalled")]["detail"] == "no jobs" and evs[("c", "requeued")]["status"] == "ok"
    assert evs[("a", "requeued")]["incident"] == "i" and evs[("b", "requeued")]["incident"] == "manual"


def test_promotion_drain_retire_and_escalation_events():
    promo = {
        "promotions": [{"node": "a", "spare": "s1"}, {"node": "b", "spare": None, "pool": "h100"}],
        "shortfall": ["b"],
    }
    # running out of spares is capacity, not a failed step: `no_spare` ok, naming the pool
    assert [
        (e["node"], e["phase"], e["status"], e.get("detail")) for e in events.promotion_events(promo, {})
    ] == [
        ("a", "spare_promoted", "ok", "s1"),
        ("b", "no_spare", "ok", "no spare: jobs wait for capacity (pool h100)"),
    ]
    drained = events.drain_events(["a"], {"b": [{"pod": "x/y"}]}, {})
    assert [(e["node"], e["status"]) for e in drained] == [("a", "ok"), ("b", "failed")]
    assert [e["phase"] for e in events.retire_events(["a"], ["gpu-7"], {})] == [
        "retired",
        "replacement_ready",
    ]
    assert [e["phase"] for e in events.retire_events(["a"], [], {})] == ["retired"]
    esc = events.escalation_events(["a"], {}, "Fence", "x" * 400)
    assert esc[0]["status"] == "failed" and len(esc[0]["detail"]) == len("Fence: ") + 300


def test_kube_events_are_named_per_incident_node_and_phase_and_never_repeated():
    evs = events.phase_events(["a", "b"], {"a": "i1", "b": "i2"}, "fenced", "ok")
    objs = events.kube_events(evs, [], ["a"], stamp="2026-01-01T00:00:00Z")
    assert [o["involvedObject"]["name"] for o in objs] == ["a"]  # b is not in Kubernetes
    assert objs[0]["reason"] == "AutohealFenced" and objs[0]["type"] == "Normal"
    assert objs[0]["metadata"]["annotations"] == {"autoheal.io/incident": "i1"}
    # issue 19: the release that acted; by hand (no version passed) the collection's own
    assert objs[0]["metadata"]["labels"]["app.kubernetes.io/version"] == events.collection_version() != ""
    given = events.kube_events(evs, [], ["a"], version="9.9.9")
    assert given[0]["metadata"]["labels"]["app.kubernetes.io/version"] == "9.9.9"
    assert events.kube_events(evs, [objs[0]["metadata"]["name"]], ["a"]) == []
    failed = events.kube_events(events.phase_events(["a"], {}, "drained", "failed", detail="pdb"), [], ["a"])
    assert failed[0]["type"] == "Warning" and failed[0]["message"].endswith(": pdb")


# ---------------------------------------------------------------- inputs


def test_inputs_derive_incidents_backend_and_kube(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    values = {
        "autoheal_nodes": ["gpu-1", "gpu-2"],
        "autoheal_incident_ids": ["inc-1"],
        "autoheal_slurm_conf": str(conf),
        "autoheal_kubeconfig": "",
        "autoheal_lab_name": "",
        "autoheal_backend": "",
        "autoheal_xid": 79,
    }
    r = inputs.derive(values, str(tmp_path), str(tmp_path / "playbooks"), {})
    assert r["incidents"] == {"gpu-1": "inc-1", "gpu-2": "manual"} and r["incident_list"] == [
        "inc-1",
        "manual",
    ]
    assert r["use_kube"] is False and r["backend"] == "none" and r["xid"] == 79


def test_relative_paths_are_read_from_the_working_directory(tmp_path):
    (tmp_path / ".lab/default/slurm").mkdir(parents=True)
    (tmp_path / ".lab/default/slurm/slurm.conf").write_text("")
    values = {"autoheal_nodes": ["gpu-2"], "autoheal_slurm_conf": ".lab/default/slurm/slurm.conf"}
    r = inputs.derive(values, str(tmp_path), "/nowhere/playbooks", {})
    assert r["slurm_conf"] == str(tmp_path / ".lab/default/slurm/slurm.conf")
    with pytest.raises(inputs.InputError) as err:
        inputs.derive(values, str(tmp_path / "elsewhere"), "/nowhere/playbooks", {})
    msg = str(err.value)
    assert msg.startswith("autoheal_slurm_conf: .lab/default/slurm/slurm.conf does not exist")
    assert os.path.join(str(tmp_path), "elsewhere") in msg  # says where relative paths are read from


def test_a_journal_needs_its_folder_and_the_lab_backend_a_lab_root(tmp_path):
    base = {"autoheal_nodes": ["gpu-2"]}
    with pytest.raises(inputs.InputError, match="autoheal_journal_events: the folder of"):
        inputs.derive(
            {**base, "autoheal_journal_events": "no/such/dir/j.jsonl"}, str(tmp_path), str(tmp_path), {}
        )
    r = inputs.derive({**base, "autoheal_journal_events": "j.jsonl"}, str(tmp_path), str(tmp_path), {})
    assert r["journal_events"] == str(tmp_path / "j.jsonl")
    lab = {**base, "autoheal_lab_name": "x", "autoheal_lab_root": "", "autoheal_backend": ""}
    with pytest.raises(inputs.InputError, match="autoheal_lab_root"):
        inputs.derive(lab, str(tmp_path), str(tmp_path / "playbooks"), {})
    (tmp_path / "labs").mkdir()
    r = inputs.derive(
        lab, str(tmp_path), str(tmp_path / "playbooks"), {"AUTOHEAL_LAB_ROOT": str(tmp_path / "labs")}
    )
    assert r["backend"] == "lab" and r["lab_root"] == str(tmp_path / "labs")
    assert r["lab_args"] == ["--name", "x", "--root", str(tmp_path / "labs")]


def test_a_runner_in_a_pod_names_the_lab_by_its_pool_api(tmp_path):
    """No lab folder in a pod: the lab backend calls the pool API's URL with the token file."""
    token = tmp_path / "token"
    token.write_text("t")
    base = {"autoheal_nodes": ["gpu-2"], "autoheal_lab_root": "", "autoheal_backend": ""}
    pod = {**base, "autoheal_lab_url": "http://10.200.0.1:21007", "autoheal_lab_token_file": str(token)}
    r = inputs.derive(pod, str(tmp_path), "/nowhere/playbooks", {})
    assert r["backend"] == "lab"
    assert r["lab_args"] == ["--url", "http://10.200.0.1:21007", "--token-file", str(token)]
    for bad in ("http://x:1/$(reboot)", "file:///etc/passwd", "http://a b"):
        with pytest.raises(inputs.InputError, match="autoheal_lab_url"):
            inputs.derive({**pod, "autoheal_lab_url": bad}, str(tmp_path), "/nowhere/playbooks", {})
    with pytest.raises(inputs.InputError, match="autoheal_lab_token_file"):
        inputs.derive({**pod, "autoheal_lab_token_file": str(tmp_path / "no-such")}, str(tmp_path), "/", {})


@pytest.mark.parametrize(
    ("nodes", "ids", "error"),
    [
        (["gpu-1", "gpu-1"], [], "given twice"),
        (["GPU-1"], [], "not node names"),
        (["gpu-1;reboot"], [], "not node names"),
        ([], [], "at least one node"),
        (["gpu-1"], ["inc 1"], "autoheal_incident_ids"),
        (["gpu-1"], ["a", "b"], "more incident ids than nodes"),
    ],
)
def test_hostile_or_malformed_names_are_refused(nodes, ids, error):
    with pytest.raises(inputs.InputError, match=error):
        inputs.derive({"autoheal_nodes": nodes, "autoheal_incident_ids": ids}, "/", "/", {})


def test_the_runner_config_reads_relative_play_paths_from_its_own_folder(tmp_path):
    """`autoheal run` and the runner pass play_vars to plays that run elsewhere: relative path
    inputs in the config are made absolute from the config file's folder, like its other paths."""
    from remediation.config import parse_config

    cfg = parse_config(
        {
            "token_file": "t",
            "journal_path": "j",
            "rules_file": "r",
            "playbook_dir": "p",
            "state_dir": "s",
            "play_vars": {
                "autoheal_slurm_conf": "slurm.conf",
                "autoheal_kubeconfig": "",
                "autoheal_webhook_url": "w",
            },
        },
        "runner.yaml",
        tmp_path,
        {},
    )
    assert cfg.play_vars == {
        "autoheal_slurm_conf": str(tmp_path / "slurm.conf"),
        "autoheal_kubeconfig": "",
        "autoheal_webhook_url": "w",
    }


def test_the_drain_leaves_daemonset_pods_whatever_their_volumes():
    """A DaemonSet pod with an emptyDir (the slurmd pod: munge's socket, slurmd's spool) stays:
    evicting it takes its node out of Slurm mid-runbook (kubernetes.core.k8s_drain does, which is
    why the role's default driver is k8s_evict); an unmanaged pod still needs force."""
    evict = plugin("modules.k8s_evict")
    p = {"force": False, "delete_emptydir_data": True}
    slurmd = {
        "metadata": {"ownerReferences": [{"kind": "DaemonSet", "name": "slurmd-h100"}]},
        "spec": {"volumes": [{"name": "spool", "emptyDir": {}}]},
        "status": {"phase": "Running"},
    }
    assert evict.classify(slurmd, p) == ("ignore", "DaemonSet pod")
    rs = {**slurmd, "metadata": {"ownerReferences": [{"kind": "ReplicaSet", "name": "x"}]}}
    assert evict.classify(rs, p) == ("evict", "")
    assert evict.classify({**slurmd, "metadata": {}}, p)[0] == "block"
    import yaml

    from tests.runbook.conftest import REPO

    defaults = yaml.safe_load((REPO / "roles/k8s_node/defaults/main.yml").read_text())
    assert defaults["k8s_node_drain_method"] == "auto"
    assert "'auto'" in defaults["k8s_node_drain_batch"]  # auto is k8s_evict, one node or many

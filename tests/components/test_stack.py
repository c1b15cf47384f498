"""The lab stack as a whole: what it declares, that every object belongs to a component, and that
the policy pack accepts it."""

from __future__ import annotations

from collections import Counter

from policy.rules import RESOURCE_RULES, stack_has_remediation

TOP_LEVEL = {
    "autoheal:cluster:KubernetesCluster",
    "autoheal:nodepool:GpuNodePool",
    "autoheal:slurm:SlurmCluster",
    "autoheal:monitoring:GpuMonitoring",
    "autoheal:runner:RemediationRunner",
}
# SlurmCluster's parts, in the order of the architecture.
SLURM_PARTS = {
    "autoheal:slurm:SlurmConfig",
    "autoheal:slurm:SlurmSharedStorage",
    "autoheal:slurm:SlurmController",
    "autoheal:slurm:SlurmLogin",
    "autoheal:slurm:SlurmWorkers",
}
COMPONENTS = TOP_LEVEL | SLURM_PARTS


def test_lab_stack_declares_the_expected_resources(lab):
    counts = Counter(r.type for r in lab.resources)
    assert {t: counts[t] for t in COMPONENTS} == dict.fromkeys(COMPONENTS, 1)  # one pool: one SlurmWorkers
    assert counts["kubernetes:core/v1:Namespace"] == 2
    assert counts["kubernetes:apps/v1:DaemonSet"] == 3  # slurmd-h100, dcgm-exporter, xid-watcher
    assert counts["kubernetes:apps/v1:StatefulSet"] == 1
    assert counts["kubernetes:apps/v1:Deployment"] == 2  # login, runner
    # the runner's playbooks come from its image; its copy of slurm.conf and of the munge key
    # (its path to slurmctld) are the runner's own, in its namespace
    assert counts["kubernetes:core/v1:ConfigMap"] == 7
    assert (
        counts["kubernetes:core/v1:Secret"] == 4
    )  # munge key, login host key, runner token, runner's munge key
    assert counts["pulumi-python:dynamic:Resource"] == 3  # their generators
    assert counts["kubernetes:core/v1:PersistentVolumeClaim"] == 3
    assert counts["pulumi:providers:kubernetes"] == 1
    # slurmd's ServiceAccount, ClusterRole and binding (a spare registers drained)
    assert counts["kubernetes:core/v1:ServiceAccount"] == 2  # the runner's, slurmd's
    assert len(lab.resources) == 50  # + the runner's Role and RoleBinding for the ladder's Jobs
    assert all(not r.custom for r in lab.resources if r.type in COMPONENTS)


def test_every_resource_is_parented_to_its_component(lab):
    by_urn = {r.urn: r for r in lab.resources}

    def top(r):
        while r.type not in TOP_LEVEL:
            r = by_urn[r.parent]
        return r

    for r in lab.resources:
        if r.type in TOP_LEVEL:
            assert r.parent.endswith("pulumi:pulumi:Stack::autoheal-test")  # at the stack's top
            continue
        parent = by_urn.get(r.parent)
        assert parent is not None and parent.type in COMPONENTS, (r.type, r.name, r.parent)
        if r.type in SLURM_PARTS:
            assert parent.type == "autoheal:slurm:SlurmCluster", r.name
        # child names derive from the top-level component's name
        assert r.name.startswith(top(r).name), (r.name, top(r).name)


def test_slurm_parts_alias_their_resources_to_the_cluster(lab):
    """Resources that moved into SlurmCluster's parts keep their URN of before the split as an
    alias, so `pulumi preview` of an existing stack shows no replacement."""
    by_urn = {r.urn: r for r in lab.resources}
    moved = [r for r in lab.resources if by_urn.get(r.parent) and by_urn[r.parent].type in SLURM_PARTS]
    assert len(moved) == 13  # config 3, storage 2, controller 2, login 5, workers 1
    for r in moved:
        old = f"urn:pulumi:test::autoheal::autoheal:slurm:SlurmCluster${r.type}::{r.name}"
        assert old in r.aliases, r.name


def test_lab_workloads_do_not_wait_for_kubelets_the_lab_does_not_have(lab):
    kinds = [f"apps/v1:{k}" for k in ("Deployment", "StatefulSet", "DaemonSet")]
    kinds += ["core/v1:Service", "core/v1:PersistentVolumeClaim"]
    for kind in kinds:
        found = lab.of_type(f"kubernetes:{kind}")
        assert found, kind
        for r in found:
            assert r.inputs["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true", r.k8s_name


def test_policy_pack_accepts_the_lab_stack(lab):
    violations = [
        (name, r.k8s_name, msg)
        for r in lab.resources
        for name, rule in RESOURCE_RULES.items()
        for msg in rule(r.type, r.inputs)
    ]
    assert violations == []
    assert stack_has_remediation((r.type, r.inputs) for r in lab.resources) == []


def test_policy_pack_rules_cover_the_stacks_guarded_objects(lab):
    """Each rule has something to judge in the lab stack (no rule passes by never matching)."""
    from autoheal import labels as lb
    from policy import rules

    types = {r.type for r in lab.resources}
    assert rules.CONFIG_MAP in types
    assert types & rules.ROLE_TYPES
    labels = [(r.inputs.get("metadata") or {}).get("labels") or {} for r in lab.resources]
    assert any(x.get(lb.COMPONENT_LABEL) == lb.NODE_POOL_COMPONENT for x in labels)
    assert any(x.get(lb.COMPONENT_LABEL) == lb.SLURMCTLD_COMPONENT for x in labels)
    assert any(x.get(lb.COMPONENT_LABEL) == lb.RUNNER_COMPONENT for x in labels)
    assert any(x.get(lb.ALERTMANAGER_CONFIG_LABEL) == "true" for x in labels)


def test_example_eks_stack_builds_node_groups_and_passes_the_policy():
    import yaml

    from components.config import parse_stack_config
    from components.stack import build_stack
    from tests.components.harness import ROOT, run_program

    doc = yaml.safe_load((ROOT / "Pulumi.example-eks.yaml").read_text())
    cfg = parse_stack_config({k.split(":", 1)[1]: v for k, v in doc["config"].items()})
    rec = run_program(lambda: build_stack(cfg, ROOT, "rules: []\n", {}))
    groups = {
        g.inputs["nodeGroupName"]: g.inputs["scalingConfig"]["desiredSize"]
        for g in rec.of_type("aws:eks/nodeGroup:NodeGroup")
    }
    assert groups == {"autoheal-system": 2, "autoheal-h100": 18, "autoheal-a100": 9}
    assert len(rec.of_type("aws:eks/cluster:Cluster")) == 1
    # With the Prometheus Operator: custom resources instead of ConfigMaps for rules and route.
    assert rec.of_type("kubernetes:monitoring.coreos.com/v1alpha1:AlertmanagerConfig")
    violations = [
        msg for r in rec.resources for rule in RESOURCE_RULES.values() for msg in rule(r.type, r.inputs)
    ]
    assert violations == []


def test_the_runner_reaches_this_stacks_slurmctld_with_its_slurm_conf_and_munge_key(lab):
    """The stack wires SlurmCluster into RemediationRunner: the runner's copy of slurm.conf is the
    cluster's own text and its munge key the cluster's key (the same random bytes), so its Slurm
    client authenticates to that slurmctld; the plays are told where slurm.conf is."""
    import yaml

    cluster_conf = lab.one("kubernetes:core/v1:ConfigMap", "slurm-config").inputs["data"]["slurm.conf"]
    runner_conf = lab.one("kubernetes:core/v1:ConfigMap", "autoheal-runner-slurm").inputs["data"]
    assert runner_conf == {"slurm.conf": cluster_conf}
    cluster_key = lab.one("kubernetes:core/v1:Secret", "munge-key").inputs["data"]["munge.key"]
    runner_key = lab.one("kubernetes:core/v1:Secret", "autoheal-runner-munge").inputs["data"]["munge.key"]
    assert runner_key == cluster_key
    settings = yaml.safe_load(
        lab.one("kubernetes:core/v1:ConfigMap", "autoheal-runner-config").inputs["data"]["runner.yaml"]
    )
    assert settings["play_vars"]["autoheal_slurm_conf"] == "/etc/slurm/slurm.conf"
    deployment = lab.one("kubernetes:apps/v1:Deployment", "autoheal-runner")
    inits = [c["name"] for c in deployment.inputs["spec"]["template"]["spec"]["initContainers"]]
    assert "munged" in inits


HA_RUNNER = {
    "journal": "postgres",
    "replicas": 2,
    "postgres": {
        "url": "postgresql://autoheal@journal.db.svc:5432/autoheal?sslmode=verify-full",
        "password": {"name": "journal-db"},
    },
}


def test_the_stack_file_declares_an_ha_runner_with_a_postgres_journal():
    """autoheal:runner's journal, postgres and replicas reach RemediationRunner through runner_args:
    two replicas under leader election, the journal's URL in runner.yaml, the password a reference
    to a Secret in the runner's namespace (PGPASSWORD), never its value."""
    import yaml

    from components.config import parse_stack_config
    from components.stack import build_stack
    from remediation.config import parse_config
    from tests.components.harness import ROOT, env_of, lab_stack_raw, pod_spec, run_program

    raw = lab_stack_raw()
    cfg = parse_stack_config({**raw, "runner": {**raw.get("runner", {}), **HA_RUNNER}})

    def program():
        stack = build_stack(cfg, ROOT, "rules: []\n", {"gpu_fatal_xid.yml": "- hosts: localhost\n"})
        return {"webhook_url": stack.runner.webhook_url}

    rec = run_program(program)
    dep = rec.one("kubernetes:apps/v1:Deployment", "autoheal-runner")
    assert dep.inputs["spec"]["replicas"] == 2
    assert not [
        r for r in rec.of_type("kubernetes:core/v1:PersistentVolumeClaim") if "runner" in str(r.k8s_name)
    ]
    (container,) = pod_spec(dep)["containers"]
    assert env_of(container)["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "journal-db",
        "key": "password",
    }
    assert rec.one("kubernetes:policy/v1:PodDisruptionBudget", "autoheal-runner")
    assert rec.one("kubernetes:rbac.authorization.k8s.io/v1:Role", "autoheal-runner-leader-election")
    text = rec.one("kubernetes:core/v1:ConfigMap", "autoheal-runner-config").inputs["data"]["runner.yaml"]
    runner_cfg = parse_config(yaml.safe_load(text), "runner.yaml", ROOT, env={})
    assert runner_cfg.journal_dsn == HA_RUNNER["postgres"]["url"] and runner_cfg.journal_path is None
    assert runner_cfg.leader_election.enabled
    assert "journal-db" not in text  # the Secret is referenced by the pod, not copied into config

"""The lab stack as a whole: what it declares, that every object belongs to a component, and that
the policy pack accepts it."""

from __future__ import annotations

from collections import Counter

from policy.rules import RESOURCE_RULES, stack_has_remediation

COMPONENTS = {
    "autoheal:cluster:KubernetesCluster",
    "autoheal:nodepool:GpuNodePool",
    "autoheal:slurm:SlurmCluster",
    "autoheal:monitoring:GpuMonitoring",
    "autoheal:runner:RemediationRunner",
}


def test_lab_stack_declares_the_expected_resources(lab):
    counts = Counter(r.type for r in lab.resources)
    assert {t: counts[t] for t in COMPONENTS} == dict.fromkeys(COMPONENTS, 1)
    assert counts["kubernetes:core/v1:Namespace"] == 2
    assert counts["kubernetes:apps/v1:DaemonSet"] == 2  # slurmd-h100, dcgm-exporter
    assert counts["kubernetes:apps/v1:StatefulSet"] == 1
    assert counts["kubernetes:apps/v1:Deployment"] == 2  # login, runner
    assert counts["kubernetes:core/v1:ConfigMap"] == 7
    assert counts["kubernetes:core/v1:Secret"] == 3  # munge key, login host key, runner token
    assert counts["pulumi-python:dynamic:Resource"] == 3  # their generators
    assert counts["kubernetes:core/v1:PersistentVolumeClaim"] == 3
    assert counts["pulumi:providers:kubernetes"] == 1
    assert len(lab.resources) == 36


def test_every_resource_is_parented_to_its_component(lab):
    by_urn = {r.urn: r for r in lab.resources}
    for r in lab.resources:
        if r.type in COMPONENTS:
            assert r.parent.endswith("::autoheal-test")  # components sit at the stack's top
            continue
        parent = by_urn.get(r.parent)
        assert parent is not None and parent.type in COMPONENTS, (r.type, r.name, r.parent)
        # child names derive from the component's name
        assert r.name.startswith(parent.name), (r.name, parent.name)


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
    from policy import rules

    types = {r.type for r in lab.resources}
    assert rules.CONFIG_MAP in types
    assert types & rules.ROLE_TYPES
    labels = [(r.inputs.get("metadata") or {}).get("labels") or {} for r in lab.resources]
    assert any(lb.get(rules.COMPONENT_LABEL) == rules.NODE_POOL_COMPONENT for lb in labels)
    assert any(lb.get(rules.COMPONENT_LABEL) == "slurmctld" for lb in labels)
    assert any(lb.get(rules.COMPONENT_LABEL) == rules.RUNNER_COMPONENT for lb in labels)
    assert any(lb.get(rules.ALERTMANAGER_CONFIG_LABEL) == "true" for lb in labels)


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
    assert groups == {"autoheal-h100": 18, "autoheal-a100": 9}
    assert len(rec.of_type("aws:eks/cluster:Cluster")) == 1
    # With the Prometheus Operator: custom resources instead of ConfigMaps for rules and route.
    assert rec.of_type("kubernetes:monitoring.coreos.com/v1alpha1:AlertmanagerConfig")
    violations = [
        msg for r in rec.resources for rule in RESOURCE_RULES.values() for msg in rule(r.type, r.inputs)
    ]
    assert violations == []

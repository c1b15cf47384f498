"""The preflight's checks as pure functions over what the API returned (components/preflight/):
the corners a live cluster in tests/integration/test_preflight.py does not reach cheaply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from components import preflight as pf
from components.config import parse_stack_config
from components.preflight.objects import selector_matches, tolerates
from components.preflight.prometheus import selects

ROOT = Path(__file__).resolve().parents[2]


def node(
    name: str, pool: str | None = "h100", ready: bool = True, gpus: int = 8, **extra: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"autoheal.io/pool": pool} if pool else {}},
        "spec": extra.get("spec", {}),
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "nodeInfo": {"kubeletVersion": extra.get("kubelet", "v1.31.4")},
        },
    }


def view(nodes: list[dict[str, Any]], **kw: Any) -> pf.ClusterView:
    return pf.ClusterView(
        version={"gitVersion": kw.pop("server", "v1.31.4-eks-1")},
        nodes=nodes,
        storage_classes=[],
        crds=set(),
        **kw,
    )


def cfg(**over: Any):
    pool = {"name": "h100", "size": 2, "spares": 1, **over.pop("pool", {})}
    return parse_stack_config(
        {"cluster": {"backend": "kubeconfig", "kubeconfig": "kc"}, "pools": [pool], **over}
    )


def by_name(checks: list[pf.Check]) -> dict[str, pf.Check]:
    return {c.name: c for c in checks}


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("v1.31.2-eks-1234", (1, 31)),
        ("1.29", (1, 29)),
        ("v1.36.3+k3s1", (1, 36)),
        ("kwok-0.8.0", None),
        ("", None),
    ],
)
def test_parse_version(text: str, want: tuple[int, int] | None) -> None:
    assert pf.parse_version(text) == want


def test_an_old_or_odd_server_version() -> None:
    old = pf.check_server_version(view([], server="v1.28.9"))
    assert old.status == "fail" and old.fix == "upgrade the control plane to 1.29 or later"
    assert pf.check_server_version(view([], server="weird")).status == "warn"


def test_a_kubelet_newer_than_the_server_warns() -> None:
    c = pf.check_kubelet_versions(view([node("a", kubelet="v1.32.0")], server="v1.31.0"))
    assert c.status == "warn" and "skew" in c.detail


def test_pool_counts_spares_extras_and_not_ready() -> None:
    short = by_name(pf.check_pool_nodes(cfg(), view([node("a"), node("b")])))["pool h100: nodes"]
    assert short.status == "warn" and "fewer hot spares than declared" in short.detail
    extra = by_name(pf.check_pool_nodes(cfg(), view([node(n) for n in "abcd"])))["pool h100: nodes"]
    assert extra.status == "warn" and "more than size 2 + spares 1 = 3" in extra.detail
    down = by_name(
        pf.check_pool_nodes(cfg(), view([node("a"), node("b", ready=False), node("c", ready=False)]))
    )
    assert down["pool h100: nodes"].status == "fail" and "not Ready: b, c" in down["pool h100: nodes"].detail


def test_some_nodes_without_the_device_plugin_are_named() -> None:
    c = by_name(pf.check_pool_nodes(cfg(), view([node("a"), node("b", gpus=0), node("c", gpus=4)])))[
        "pool h100: GPUs"
    ]
    assert c.status == "fail"
    assert c.detail == (
        "b advertise no nvidia.com/gpu (the device plugin is not running there); "
        "c (4) advertise fewer than gpusPerNode 8"
    )


def test_the_spare_and_quarantine_taints_are_no_problem_on_pool_nodes() -> None:
    taints = [
        {"key": "autoheal.io/spare", "value": "true", "effect": "NoSchedule"},
        {"key": "autoheal.io/quarantine", "value": "reset", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
        {"key": "soft", "effect": "PreferNoSchedule"},
    ]
    nodes = [node(n, spec={"taints": taints}) for n in "abc"]
    assert by_name(pf.check_pool_nodes(cfg(), view(nodes)))["pool h100: labels, taints"].status == "pass"


def test_tolerations_by_value_and_effect() -> None:
    spec = cfg(runner={"tolerateTaints": [{"key": "gpu", "effect": "NoSchedule"}]}).runner.tolerate_taints
    assert tolerates(spec, {"key": "gpu", "value": "any", "effect": "NoSchedule"})  # Exists
    assert not tolerates(spec, {"key": "gpu", "effect": "NoExecute"})
    exact = cfg(runner={"tolerateTaints": [{"key": "gpu", "value": "x"}]}).runner.tolerate_taints
    assert not tolerates(exact, {"key": "gpu", "value": "y", "effect": "NoSchedule"})


def test_a_cordoned_or_not_ready_node_is_no_system_node() -> None:
    nodes = [node("a", pool=None, spec={"unschedulable": True}), node("b", pool=None, ready=False)]
    c = by_name(pf.check_system_nodes(cfg(), view(nodes)))["system node: runner"]
    assert c.status == "fail" and c.detail.endswith("a: cordoned; b: not Ready")
    assert c.fix == "add an untainted system node (a CPU node group)"


def test_named_and_default_storage_classes() -> None:
    classes = [
        {
            "metadata": {
                "name": "gp3",
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": "ebs.csi.aws.com",
        },
        {"metadata": {"name": "efs"}, "provisioner": "efs.csi.aws.com"},
    ]
    v = view([])
    v.storage_classes = classes
    checks = by_name(pf.check_storage(cfg(slurm={"storage": {"sharedStorageClass": "efs"}}), v))
    assert (
        checks["storage: efs"].detail == "provisioner efs.csi.aws.com (for slurm.storage.sharedStorageClass)"
    )
    assert checks["storage: default class"].detail == (
        "gp3 (for slurm.storage.stateStorageClass, runner.journalStorageClass unset)"
    )
    # checkpoints on a class of their own (FSx for Lustre): that class is asked for too
    fsx = by_name(pf.check_storage(cfg(slurm={"storage": {"checkpointStorageClass": "fsx"}}), v))
    assert (
        fsx["storage: fsx"].status == "fail"
        and "slurm.storage.checkpointStorageClass" in fsx["storage: fsx"].detail
    )
    # a PostgreSQL journal has no volume: its class is not asked for
    pg = {"journal": "postgres", "postgres": {"url": "postgresql://a@db/j"}, "journalStorageClass": "nope"}
    assert "storage: nope" not in by_name(pf.check_storage(cfg(runner=pg), v))


@pytest.mark.parametrize(
    ("selector", "labels", "want"),
    [
        (None, {"a": "1"}, False),
        ({}, {}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": "1"}, False),
    ],
)
def test_label_selectors(selector: Any, labels: dict[str, str], want: bool) -> None:
    assert selector_matches(selector, labels) is want


def test_a_prometheus_without_a_namespace_selector_looks_only_in_its_own_namespace() -> None:
    prom = {"metadata": {"name": "k8s", "namespace": "monitoring"}, "spec": {"ruleSelector": {}}}
    assert not selects(prom, "ruleSelector", "ruleNamespaceSelector", {}, "autoheal", {})
    assert selects(prom, "ruleSelector", "ruleNamespaceSelector", {}, "monitoring", {})
    everywhere = {**prom, "spec": {"ruleSelector": {}, "ruleNamespaceSelector": {}}}
    assert selects(everywhere, "ruleSelector", "ruleNamespaceSelector", {}, "autoheal", {})


def test_no_prometheus_object_warns() -> None:
    v = view([])
    v.crds = set(pf.OPERATOR_CRDS)
    v.prometheuses = []
    c = by_name(
        pf.check_prometheus_operator(cfg(monitoring={"prometheusOperator": True, "operatorLabels": {}}), v)
    )
    assert c["prometheus operator: selectors"].status == "warn"


def test_the_stack_file_is_read_as_the_program_reads_its_config(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    doc = {
        "config": {
            "autoheal:cluster": {"backend": "kubeconfig", "kubeconfig": "kc"},
            "pools": [{"name": "h100", "size": 1}],  # a key without the project: the project's
            "autoheal:waitForRollout": "false",
            "other:thing": "ignored",
            "autoheal:secretish": {"secure": "v1:abc"},
        }
    }
    (tmp_path / "Pulumi.s.yaml").write_text(yaml.safe_dump(doc))
    values = pf.stack_values(tmp_path, "s")
    assert "thing" not in values and "secretish" not in values and values["preflight"] == "true"
    spec = pf.load_stack(tmp_path, "s")
    assert spec.pools[0].name == "h100" and spec.wait_for_rollout is False and spec.preflight is True
    assert pf.kubeconfig_of(spec, tmp_path) == str(tmp_path / "kc")
    with pytest.raises(Exception, match="cannot read"):
        pf.load_stack(tmp_path, "missing")


def test_selectors_of_prometheus_and_alertmanager_objects() -> None:
    operator = {"prometheusOperator": True, "operatorLabels": {"release": "kps"}}
    v = view([])
    v.crds = set(pf.OPERATOR_CRDS)
    v.prometheuses = [
        {
            "metadata": {"name": "k8s", "namespace": "monitoring"},
            "spec": {
                "ruleSelector": {"matchLabels": {"release": "kps"}},
                "ruleNamespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "autoheal"}},
                "serviceMonitorSelector": {"matchLabels": {"release": "kps"}},
                "serviceMonitorNamespaceSelector": {},
            },
        }
    ]
    # an Alertmanager in the stack's namespace, without a namespace selector: its own namespace
    am = {"matchExpressions": [{"key": "autoheal.io/alertmanager-config", "operator": "Exists"}]}
    v.alertmanagers = [
        {"metadata": {"name": "main", "namespace": "autoheal"}, "spec": {"alertmanagerConfigSelector": am}}
    ]
    c = by_name(pf.check_prometheus_operator(cfg(monitoring=operator), v))["prometheus operator: selectors"]
    assert c.status == "pass", c
    assert c.detail == (
        "PrometheusRule by monitoring/k8s; ServiceMonitor by monitoring/k8s; AlertmanagerConfig by autoheal/main"
    )
    # the stack in another namespace: the rule's namespace selector and the Alertmanager miss it
    other = by_name(pf.check_prometheus_operator(cfg(namespace="gpu-ops", monitoring=operator), v))
    sel = other["prometheus operator: selectors"]
    assert sel.status == "fail" and sel.detail.startswith(
        "PrometheusRule (namespace gpu-ops) is selected by none"
    )
    assert "AlertmanagerConfig (namespace gpu-ops)" in sel.detail and "ServiceMonitor" not in sel.detail


def test_a_guaranteed_pool_needs_room_for_slurmds_request_on_every_node() -> None:
    """slurmd asks for the pool's cpus and realMemoryMb (plus its munge sidecar) as requests =
    limits: a node whose allocatable is smaller is named; a pool that is not Guaranteed has no row."""

    def sized(name: str, cpu: str, memory: str) -> dict[str, Any]:
        n = node(name)
        n["status"]["allocatable"].update(cpu=cpu, memory=memory)
        return n

    pool = {"cpus": 94, "realMemoryMb": 1_100_000, "guaranteed": True}
    nodes = [sized("big", "95690m", "1171186Mi"), sized("small", "94", "1100000Mi")]
    room = by_name(pf.check_pool_nodes(cfg(pool=pool), view(nodes)))["pool h100: room for slurmd"]
    assert room.status == "fail" and "small (94 CPUs" in room.detail and "big" not in room.detail
    assert "94.050 CPUs" in room.detail and "guaranteed: false" in (room.fix or "")
    fits = by_name(pf.check_pool_nodes(cfg(pool=pool), view(nodes[:1])))["pool h100: room for slurmd"]
    assert fits.status == "pass"
    assert "pool h100: room for slurmd" not in by_name(pf.check_pool_nodes(cfg(), view(nodes)))

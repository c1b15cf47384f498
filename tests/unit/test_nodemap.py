"""Kubernetes node -> Slurm node by the declared rule (autoheal/nodemap.py): each rule, and every
way a node fails to map (reported with its reason, never guessed)."""

from __future__ import annotations

from typing import Any

import pytest

from autoheal.errors import ConfigError
from autoheal.nodemap import NodeMapRule, map_nodes, parse_selector, selector_matches

SLINKY = "app.kubernetes.io/name=slurmd"


def node(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": annotations or {}}}


def pod(
    name: str,
    on: str | None,
    labels: dict[str, str] | None = None,
    hostname: str = "",
    phase: str = "Running",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": on} if on else {}
    if hostname:
        spec["hostname"] = hostname
    labels = {"app.kubernetes.io/name": "slurmd"} if labels is None else labels
    return {"metadata": {"name": name, "labels": labels}, "spec": spec, "status": {"phase": phase}}


def test_same_maps_each_node_to_its_own_name() -> None:
    m = map_nodes(NodeMapRule("same"), [node("gpu-1"), node("gpu-2")], slurm_nodes=["gpu-1", "gpu-2"])
    assert m.mapped == {"gpu-1": "gpu-1", "gpu-2": "gpu-2"}
    assert m.unmapped == {}
    assert m.kube_name("gpu-2") == "gpu-2"


def test_same_reports_a_node_slurm_does_not_have() -> None:
    m = map_nodes(NodeMapRule("same"), [node("gpu-1"), node("cpu-9")], slurm_nodes=["gpu-1"])
    assert m.mapped == {"gpu-1": "gpu-1"}
    assert m.unmapped == {"cpu-9": "Slurm has no node cpu-9 (rule same)"}


def test_pod_hostname_follows_statefulset_pods_named_nodeset_ordinal() -> None:
    """Slinky's StatefulSet mode: the Slurm node is the pod's name (its hostname), not the node's."""
    rule = NodeMapRule("pod-hostname", selector=SLINKY).check()
    pods = [
        pod("gpu-nodeset-0", "ip-10-0-1-7"),
        pod("gpu-nodeset-1", "ip-10-0-1-9"),
        pod("login-0", "ip-10-0-1-9", labels={"app.kubernetes.io/name": "login"}),  # not selected
        pod("gpu-nodeset-2", None),  # not scheduled yet
    ]
    m = map_nodes(
        rule,
        [node("ip-10-0-1-7"), node("ip-10-0-1-9"), node("ip-10-0-1-11")],
        pods,
        slurm_nodes=["gpu-nodeset-0", "gpu-nodeset-1", "gpu-nodeset-2"],
    )
    assert m.mapped == {"ip-10-0-1-7": "gpu-nodeset-0", "ip-10-0-1-9": "gpu-nodeset-1"}
    assert m.unmapped == {"ip-10-0-1-11": f"no slurmd pod ({SLINKY}) on it"}
    assert m.slurm_name("ip-10-0-1-9") == "gpu-nodeset-1"


def test_pod_hostname_prefers_spec_hostname_and_skips_ended_pods() -> None:
    rule = NodeMapRule("pod-hostname", selector=SLINKY)
    pods = [pod("x-abc12", "n1", hostname="gpu-7"), pod("old-0", "n1", phase="Failed")]
    assert map_nodes(rule, [node("n1")], pods).mapped == {"n1": "gpu-7"}


def test_pod_hostname_two_slurmd_pods_on_one_node_is_ambiguous() -> None:
    rule = NodeMapRule("pod-hostname", selector=SLINKY)
    m = map_nodes(rule, [node("n1")], [pod("a-0", "n1"), pod("b-0", "n1")])
    assert m.mapped == {}
    assert m.unmapped["n1"] == f"2 slurmd pods ({SLINKY}) on it: a-0, b-0"


def test_annotation_rule_and_its_failures() -> None:
    rule = NodeMapRule("annotation", annotation="example.org/slurm-node").check()
    nodes = [
        node("k1", {"example.org/slurm-node": "gpu-1"}),
        node("k2"),
        node("k3", {"example.org/slurm-node": "gpu[1-2]"}),  # hostlist syntax: not a node name
        node("k4", {"example.org/slurm-node": "gpu-4"}),
        node("k5", {"example.org/slurm-node": "gpu-4"}),  # two nodes claim gpu-4
    ]
    m = map_nodes(rule, nodes, slurm_nodes=["gpu-1", "gpu-4"])
    assert m.mapped == {"k1": "gpu-1"}
    assert m.unmapped == {
        "k2": "no annotation example.org/slurm-node",
        "k3": "'gpu[1-2]' is not a node name Slurm and Kubernetes both accept",
        "k4": "Slurm node gpu-4 is claimed by 2 nodes: k4, k5",
        "k5": "Slurm node gpu-4 is claimed by 2 nodes: k4, k5",
    }


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        (NodeMapRule("pod-hostname"), "slurm.node_map.selector"),
        (NodeMapRule("pod-hostname", selector="a=b,=c"), "slurm.node_map.selector"),
        (NodeMapRule("annotation"), "slurm.node_map.annotation"),
        (NodeMapRule("annotation", annotation="has space"), "slurm.node_map.annotation"),
        (NodeMapRule("hostname"), "slurm.node_map.rule"),  # type: ignore[arg-type]
    ],
)
def test_an_incomplete_rule_names_its_field(rule: NodeMapRule, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}:"):
        rule.check()


def test_selector_terms() -> None:
    assert parse_selector("a=b, c!=d,e,!f") == [
        ("=", "a", "b"),
        ("!=", "c", "d"),
        ("exists", "e", ""),
        ("!", "f", ""),
    ]
    assert selector_matches("a=b,!f", {"a": "b"})
    assert not selector_matches("a=b,!f", {"a": "b", "f": "1"})
    assert not selector_matches("c!=d", {"c": "d"})
    assert selector_matches("app.kubernetes.io/name==slurmd", {"app.kubernetes.io/name": "slurmd"})

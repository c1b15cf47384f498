"""Small builders for the Kubernetes argument objects the components repeat.

A pod spec written out in full is mostly nesting; these one-liners keep the builders of each
component about what differs (which volume, which port, which nodes) rather than about the shape
of the Kubernetes API. Each returns the same object the long form would, so the rendered
manifests do not change when a component switches to them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_kubernetes as k8s

from autoheal import labels as lb


def meta(
    name: str,
    namespace: pulumi.Input[str] | None,
    labels: Mapping[str, str],
    annotations: Mapping[str, pulumi.Input[str]] | None = None,
) -> k8s.meta.v1.ObjectMetaArgs:
    """Object metadata; an empty annotation map is left out (as Kubernetes would store it)."""
    return k8s.meta.v1.ObjectMetaArgs(
        name=name, namespace=namespace, labels=dict(labels), annotations=dict(annotations or {}) or None
    )


def selector(labels: Mapping[str, str]) -> k8s.meta.v1.LabelSelectorArgs:
    return k8s.meta.v1.LabelSelectorArgs(match_labels=dict(labels))


def mount(name: str, path: str, read_only: bool = False) -> k8s.core.v1.VolumeMountArgs:
    return k8s.core.v1.VolumeMountArgs(name=name, mount_path=path, read_only=read_only or None)


def tcp_probe(port: int, initial: int, period: int = 10) -> k8s.core.v1.ProbeArgs:
    return k8s.core.v1.ProbeArgs(
        tcp_socket=k8s.core.v1.TCPSocketActionArgs(port=port),
        initial_delay_seconds=initial,
        period_seconds=period,
        failure_threshold=6,
    )


def http_probe(path: str, port: int | str, period: int, initial: int | None = None) -> k8s.core.v1.ProbeArgs:
    return k8s.core.v1.ProbeArgs(
        http_get=k8s.core.v1.HTTPGetActionArgs(path=path, port=port),
        initial_delay_seconds=initial,
        period_seconds=period,
    )


def pvc_volume(name: str, claim: pulumi.Input[str]) -> k8s.core.v1.VolumeArgs:
    return k8s.core.v1.VolumeArgs(
        name=name,
        persistent_volume_claim=k8s.core.v1.PersistentVolumeClaimVolumeSourceArgs(claim_name=claim),
    )


def secret_volume(name: str, secret: pulumi.Input[str], mode: int = 0o400) -> k8s.core.v1.VolumeArgs:
    return k8s.core.v1.VolumeArgs(
        name=name, secret=k8s.core.v1.SecretVolumeSourceArgs(secret_name=secret, default_mode=mode)
    )


def config_map_volume(
    name: str, config_map: pulumi.Input[str], mode: int | None = None
) -> k8s.core.v1.VolumeArgs:
    return k8s.core.v1.VolumeArgs(
        name=name, config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=config_map, default_mode=mode)
    )


def empty_dir(name: str) -> k8s.core.v1.VolumeArgs:
    return k8s.core.v1.VolumeArgs(name=name, empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs())


def claim_spec(
    access_mode: str, size: str, storage_class: str | None
) -> k8s.core.v1.PersistentVolumeClaimSpecArgs:
    """A claim for `size` of storage (None: the cluster's default StorageClass)."""
    return k8s.core.v1.PersistentVolumeClaimSpecArgs(
        access_modes=[access_mode],
        storage_class_name=storage_class,
        resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": size}),
    )


def env(name: str, value: str) -> k8s.core.v1.EnvVarArgs:
    return k8s.core.v1.EnvVarArgs(name=name, value=value)


def field_env(name: str, field_path: str) -> k8s.core.v1.EnvVarArgs:
    """An environment variable from the pod's own fields (e.g. spec.nodeName)."""
    return k8s.core.v1.EnvVarArgs(
        name=name,
        value_from=k8s.core.v1.EnvVarSourceArgs(
            field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path=field_path)
        ),
    )


def required_node_affinity(
    expressions: Sequence[k8s.core.v1.NodeSelectorRequirementArgs],
) -> k8s.core.v1.AffinityArgs:
    """Pods go only to nodes matching every expression (one node selector term)."""
    return k8s.core.v1.AffinityArgs(
        node_affinity=k8s.core.v1.NodeAffinityArgs(
            required_during_scheduling_ignored_during_execution=k8s.core.v1.NodeSelectorArgs(
                node_selector_terms=[k8s.core.v1.NodeSelectorTermArgs(match_expressions=list(expressions))]
            )
        )
    )


def node_has(key: str, *values: str) -> k8s.core.v1.NodeSelectorRequirementArgs:
    """The node carries label `key` (with one of `values`, when given)."""
    if values:
        return k8s.core.v1.NodeSelectorRequirementArgs(key=key, operator="In", values=list(values))
    return k8s.core.v1.NodeSelectorRequirementArgs(key=key, operator="Exists")


def gpu_agents_running() -> k8s.core.v1.NodeSelectorRequirementArgs:
    """A GPU agent's DaemonSet (dcgm-exporter, slurmd) stays off a node whose agents the recovery
    ladder stopped (lb.GPU_AGENTS_LABEL=stopped) for a GPU reset or validation."""
    return k8s.core.v1.NodeSelectorRequirementArgs(
        key=lb.GPU_AGENTS_LABEL, operator="NotIn", values=[lb.GPU_AGENTS_STOPPED]
    )


def not_lent() -> k8s.core.v1.NodeSelectorRequirementArgs:
    """slurmd stays off a node lent to inference (remediation/lender.py: lb.LEND_LABEL lent or
    returning); it stays while the node is lending (its jobs end first) and comes back once the
    label is lifted."""
    return k8s.core.v1.NodeSelectorRequirementArgs(
        key=lb.LEND_LABEL, operator="NotIn", values=[lb.LEND_LENT, lb.LEND_RETURNING]
    )


def template(
    labels: Mapping[str, str],
    spec: k8s.core.v1.PodSpecArgs,
    annotations: Mapping[str, str] | None = None,
) -> k8s.core.v1.PodTemplateSpecArgs:
    """A pod template; its annotations (e.g. the config hash) roll the pods when they change."""
    return k8s.core.v1.PodTemplateSpecArgs(
        metadata=k8s.meta.v1.ObjectMetaArgs(labels=dict(labels), annotations=dict(annotations or {}) or None),
        spec=spec,
    )


def headless_service(labels: Mapping[str, str], port_name: str, port: int) -> k8s.core.v1.ServiceSpecArgs:
    """A Service with no cluster IP: stable DNS names for the selected pods (one port)."""
    return k8s.core.v1.ServiceSpecArgs(
        cluster_ip="None",
        selector=dict(labels),
        ports=[k8s.core.v1.ServicePortArgs(name=port_name, port=port)],
    )

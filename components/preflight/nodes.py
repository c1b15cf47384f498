"""Checks of the cluster as a whole: read access, the Kubernetes versions of the API server and
the kubelets, what the nodes run, and a node the system pods (slurmctld, login, runner) can use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from components.config import StackSpec, TaintSpec
from components.preflight.model import Check, ClusterView
from components.preflight.objects import (
    blocking_taints,
    is_ready,
    labels_of,
    listed,
    name_of,
    parse_version,
    version_text,
)

# Native sidecar containers (an init container with restartPolicy: Always) carry the runner's munge
# sidecar and Slurm's config reloader: beta and on by default since 1.29 (GA in 1.33).
MIN_KUBERNETES = (1, 29)


def check_access(view: ClusterView) -> list[Check]:
    """A read the checks needed and were refused (the checks that needed it say so too)."""
    if "nodes" in view.denied:
        return [
            Check(
                "read access",
                "fail",
                f"the kubeconfig's user may not list nodes ({view.denied['nodes']}): "
                "the node checks saw none",
                "use a kubeconfig whose user may list nodes (cluster-wide read)",
            )
        ]
    return []


def check_server_version(view: ClusterView) -> Check:
    text = str(view.version.get("gitVersion", ""))
    v = parse_version(text)
    minimum = version_text(MIN_KUBERNETES)
    if v is None:
        return Check("server version", "warn", f"the API server reports {text!r}, not a version", "")
    if v < MIN_KUBERNETES:
        return Check(
            "server version",
            "fail",
            f"Kubernetes {text}: autoheal needs {minimum} or later (native sidecar containers)",
            f"upgrade the control plane to {minimum} or later",
        )
    return Check("server version", "pass", f"Kubernetes {text} (at least {minimum})")


def check_kubelet_versions(view: ClusterView) -> Check:
    server = parse_version(str(view.version.get("gitVersion", "")))
    old: list[str] = []
    unknown: list[str] = []
    newer: list[str] = []
    seen: dict[str, int] = {}
    for node in view.nodes:
        text = str(node.get("status", {}).get("nodeInfo", {}).get("kubeletVersion", ""))
        v = parse_version(text)
        seen[text] = seen.get(text, 0) + 1
        if v is None:
            unknown.append(f"{name_of(node)} ({text or 'none'})")
        elif v < MIN_KUBERNETES:
            old.append(f"{name_of(node)} ({text})")
        elif server is not None and v > server:
            newer.append(f"{name_of(node)} ({text})")
    summary = ", ".join(f"{k or '?'} x{n}" for k, n in sorted(seen.items())) or "no nodes"
    minimum = version_text(MIN_KUBERNETES)
    if old:
        return Check(
            "kubelet versions",
            "fail",
            f"kubelets older than {minimum}: {listed(old)}",
            f"upgrade those nodes' kubelets to {minimum} or later (or drain and replace them)",
        )
    if newer:
        return Check(
            "kubelet versions",
            "warn",
            f"kubelets newer than the API server: {listed(newer)} (Kubernetes' skew policy forbids it)",
            "upgrade the control plane first",
        )
    if unknown:
        return Check(
            "kubelet versions",
            "warn",
            f"not a kubelet version: {listed(unknown)} (simulated nodes?)"
            + (f"; all: {summary}" if len(unknown) < len(view.nodes) else ""),
            "",
        )
    return Check("kubelet versions", "pass", summary)


def check_node_os(view: ClusterView) -> Check:
    """What the nodes run; the cgroup version only where the cluster shows it (a kubelet's
    CgroupV1 event): the Node object does not carry it."""
    kernels: dict[str, int] = {}
    images: dict[str, int] = {}
    runtimes: dict[str, int] = {}
    for node in view.nodes:
        info = node.get("status", {}).get("nodeInfo", {})
        for bucket, key in (
            (kernels, "kernelVersion"),
            (images, "osImage"),
            (runtimes, "containerRuntimeVersion"),
        ):
            value = str(info.get(key) or "?")
            bucket[value] = bucket.get(value, 0) + 1

    def show(bucket: dict[str, int]) -> str:
        return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(bucket.items())) or "-"

    facts = f"kernel {show(kernels)}; OS {show(images)}; runtime {show(runtimes)}"
    if view.cgroup_v1_nodes:
        return Check(
            "node OS, cgroups",
            "warn",
            f"cgroup v1 on {listed(view.cgroup_v1_nodes)} (their kubelets' CgroupV1 event); {facts}",
            "move those nodes to cgroup v2 (a distribution that boots with it, or "
            "systemd.unified_cgroup_hierarchy=1): kubelets from 1.35 refuse v1 by default",
        )
    return Check(
        "node OS, cgroups",
        "info",
        f"{facts}; cgroup version: not observable from the Kubernetes API (on a node: "
        "`stat -fc %T /sys/fs/cgroup` says cgroup2fs for v2; Slurm's cgroup.conf autodetects either)",
    )


def _system_pods(cfg: StackSpec) -> list[tuple[str, str, Mapping[str, str], Sequence[TaintSpec]]]:
    """(row, config key, nodeSelector, tolerations) of the pods that must run off the GPU pools."""
    return [
        ("system node: slurmctld, login", "slurm", cfg.slurm.node_selector, cfg.slurm.tolerate_taints),
        ("system node: runner", "runner", cfg.runner.node_selector, cfg.runner.tolerate_taints),
    ]


def _unusable(node: Mapping[str, Any], tolerations: Sequence[TaintSpec]) -> str:
    """Why a system pod cannot run on `node`; empty when it can."""
    spec = node.get("spec", {})
    if not is_ready(node):
        return "not Ready"
    if spec.get("unschedulable"):
        return "cordoned"
    return ", ".join(blocking_taints(spec.get("taints") or [], tolerations))


def check_system_nodes(cfg: StackSpec, view: ClusterView) -> list[Check]:
    out = []
    for row, key, selector, tolerations in _system_pods(cfg):
        matching = [n for n in view.nodes if all(labels_of(n).get(k) == v for k, v in selector.items())]
        usable, why_not = [], {}
        for node in matching:
            if why := _unusable(node, tolerations):
                why_not[name_of(node)] = why
            else:
                usable.append(name_of(node))
        sel = f" matching {key}.nodeSelector {dict(selector)}" if selector else ""
        if usable:
            out.append(Check(row, "pass", f"{len(usable)} Ready nodes{sel}, e.g. {listed(usable, 3)}"))
            continue
        if not matching:
            detail = f"no node{sel}" if selector else "the cluster has no nodes"
            fix = (
                f"label a node with {dict(selector)} or change {key}.nodeSelector"
                if selector
                else "add nodes"
            )
        else:
            taints = sorted({w for w in why_not.values() if w not in ("not Ready", "cordoned")})
            detail = (
                f"no Ready, schedulable node{sel} without a taint the pods do not tolerate: "
                + "; ".join(f"{n}: {w}" for n, w in sorted(why_not.items())[:5])
            )
            fix = "add an untainted system node (a CPU node group)"
            if taints:
                fix += f", or set {key}.tolerateTaints to tolerate {taints[0]}"
        out.append(Check(row, "fail", detail, fix))
    return out

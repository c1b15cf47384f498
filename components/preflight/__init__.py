"""Preflight: is an existing cluster fit for the stack, checked before anything is installed on it.

A `cluster.backend: kubeconfig` stack installs onto a cluster it did not build, so what the stack
takes for granted is read from the cluster first, and each check says what is wrong and how to fix
it: the pools' nodes (labelled, advertising their GPUs), the StorageClasses the volumes ask for,
the Prometheus Operator when the stack uses it, a node the system pods can run on, the Kubernetes
version, what the nodes run (kernel, runtime; the cgroup version where it can be seen).

`autoheal preflight --stack NAME` (components/cli.py) and the Pulumi program (`__main__.py`, which
fails the preview with the report) both call `preflight()`. The checks are pure functions over a
`ClusterView`, what a few reads of the API returned (plain JSON dicts), so tests can hand them any
cluster; `read_cluster` does the reads, with short timeouts and no retries, so an unreachable
cluster fails in seconds with its cause.

* `model`: Check, Report, ClusterView and the status words.
* `stackfile`: a stack's config from Pulumi.yaml and Pulumi.<stack>.yaml (`load_stack`).
* `kube`: the API client and `read_cluster`, the only I/O against the cluster.
* `objects`: small helpers over API objects (readiness, GPUs, taints, selectors, versions).
* `nodes`, `pools`, `storage`, `prometheus`: the checks, by subject.
* `run`: `preflight()` and `run_checks()`, every check in the report's order.
"""

from components.preflight.kube import CONNECT_TIMEOUT_S, Kube, Unreachable, read_cluster
from components.preflight.model import Check, ClusterView, Report, Status
from components.preflight.nodes import (
    MIN_KUBERNETES,
    check_access,
    check_kubelet_versions,
    check_node_os,
    check_server_version,
    check_system_nodes,
)
from components.preflight.objects import parse_version
from components.preflight.pools import check_pool_nodes
from components.preflight.prometheus import OPERATOR_CRDS, check_prometheus_operator
from components.preflight.run import kubeconfig_of, preflight, run_checks
from components.preflight.stackfile import load_stack, stack_values
from components.preflight.storage import check_storage

__all__ = [
    "CONNECT_TIMEOUT_S",
    "MIN_KUBERNETES",
    "OPERATOR_CRDS",
    "Check",
    "ClusterView",
    "Kube",
    "Report",
    "Status",
    "Unreachable",
    "check_access",
    "check_kubelet_versions",
    "check_node_os",
    "check_pool_nodes",
    "check_prometheus_operator",
    "check_server_version",
    "check_storage",
    "check_system_nodes",
    "kubeconfig_of",
    "load_stack",
    "parse_version",
    "preflight",
    "read_cluster",
    "run_checks",
    "stack_values",
]

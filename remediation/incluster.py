"""The runner's Kubernetes identity inside a pod: its ServiceAccount's projected token.

Every Kubernetes reader and writer of the runner takes a kubeconfig path: the policy's reads
(remediation.kubeview), the collection's modules and kubernetes.core in the plays (the runbook input
`autoheal_kubeconfig`; without it the plays skip every Kubernetes step). In a pod none is
configured, and the runner used to run without Kubernetes at all: no cordon, drain, opt-out or
per-pool budget, silently. So in a pod the runner writes a kubeconfig of its own that points at
the in-cluster API server and names the token *file* (`tokenFile`), not the token: the kubelet
rotates the projected token and each reader reads the file again (docs/architecture.md, "The
runner in the cluster").

The runner asks for this explicitly (`in_cluster: true`, set by the RemediationRunner component).
A pod is recognised by the `KUBERNETES_SERVICE_HOST`/`_PORT` variables the kubelet sets; outside a
pod, or in one without a mounted token (automountServiceAccountToken: false), it is an error naming
the fix, never a quiet fallback to no Kubernetes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from remediation.errors import KubeError

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
KUBECONFIG_NAME = "incluster.kubeconfig"


@dataclass(frozen=True)
class InCluster:
    """Where the API server is and which files prove who we are."""

    server: str
    token_file: Path
    ca_file: Path
    namespace: str


def in_pod(env: Mapping[str, str]) -> bool:
    return bool(env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT"))


def detect(env: Mapping[str, str], sa_dir: Path | None = None) -> InCluster | None:
    """The pod's in-cluster identity; None outside a pod; KubeError in a pod without a token."""
    if not in_pod(env):
        return None
    sa_dir = sa_dir or SA_DIR
    host, port = env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]
    token, ca = sa_dir / "token", sa_dir / "ca.crt"
    missing = [str(p) for p in (token, ca) if not p.is_file()]
    if missing:
        raise KubeError(
            f"running in a pod (KUBERNETES_SERVICE_HOST={host}) but missing {', '.join(missing)}: "
            "mount the ServiceAccount token (automountServiceAccountToken: true) or set `kubeconfig`"
        )
    namespace_file = sa_dir / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else "default"
    host = f"[{host}]" if ":" in host else host  # an IPv6 service address
    return InCluster(f"https://{host}:{port}", token, ca, namespace)


def write_kubeconfig(identity: InCluster, path: Path) -> Path:
    """A kubeconfig naming the token file and CA file (not their contents), mode 0600."""
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "in-cluster",
                "cluster": {"server": identity.server, "certificate-authority": str(identity.ca_file)},
            }
        ],
        "users": [{"name": "service-account", "user": {"tokenFile": str(identity.token_file)}}],
        "contexts": [
            {
                "name": "in-cluster",
                "context": {
                    "cluster": "in-cluster",
                    "user": "service-account",
                    "namespace": identity.namespace,
                },
            }
        ],
        "current-context": "in-cluster",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(cfg, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


def resolve_kubeconfig(
    configured: Path | None, state_dir: Path, env: Mapping[str, str] | None = None, sa_dir: Path | None = None
) -> Path:
    """The kubeconfig of an in-cluster runner: the configured one, else one written for the pod's
    ServiceAccount into `state_dir`; KubeError outside a pod."""
    if configured is not None:
        return configured
    environ = dict(os.environ) if env is None else env
    identity = detect(environ, sa_dir)
    if identity is None:
        raise KubeError(
            "in_cluster is set but this is not a pod (no KUBERNETES_SERVICE_HOST/PORT): "
            "set `kubeconfig` instead, or run the runner in its pod"
        )
    return write_kubeconfig(identity, state_dir / KUBECONFIG_NAME)

"""The names of the pool backends: how a pool's nodes are rebooted and retired (pools/).

One list for every layer that names one: the stack's pool declaration (components/config.py), the
runner's per-pool choice (remediation/config.py), the runbook's inputs (playbooks/specs/inputs.yml,
kept in step by a test) and `autoheal pool --backend` (pools/registry.py).
"""

from __future__ import annotations

from typing import Final, Literal

# lab: the lab's pool controller; aws: EC2 + Auto Scaling; karpenter: delete the NodeClaim;
# none: a human replaces the hardware (hot-spare swap only)
PoolBackendName = Literal["lab", "aws", "karpenter", "none"]
POOL_BACKENDS: Final[tuple[str, ...]] = ("lab", "aws", "karpenter", "none")


def default_backend(cluster: str) -> str:
    """A pool's backend when its declaration names none: the cloud's API on EKS; on a cluster the
    stack only connects to, nobody's (a human replaces the node) until the operator names one."""
    return "aws" if cluster == "eks" else "none"


# the cloud cluster whose machines `autoheal pool` may act on (AWS: the EKS cluster's name), as
# the runner's pod gets it from the stack (components/stack.py) and pools/cli.py reads it
POOL_CLUSTER_ENV: Final = "AUTOHEAL_POOL_CLUSTER"

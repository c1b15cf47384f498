"""What an EC2 instance type brings to Kubernetes: the node a node group of it becomes.

The EKS stack needs it twice: to decide what a pool's launch template carries (EFA interfaces
only where the type has them) and to prove, without an AWS account, that what the stack declares
fits the nodes it asks for (lab.schedulable shapes one KWOK node per instance). Figures are AWS's
published ones (vCPUs, memory, GPUs, EFA interfaces) and the `max-pods` of the EKS AMIs'
eni-max-pods table; a type not listed here is refused by name, not guessed.

Allocatable follows the EKS AMIs' bootstrap: kube-reserved CPU by GKE's sliding scale, kube-reserved
memory 255 MiB + 11 MiB per pod, and a 100 MiB hard eviction threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from autoheal import labels as lb

EFA_RESOURCE: Final = "vpc.amazonaws.com/efa"  # what the EFA device plugin advertises


@dataclass(frozen=True)
class InstanceType:
    name: str
    vcpus: int
    memory_gib: int
    max_pods: int
    gpus: int = 0
    gpu_product: str | None = None  # nvidia.com/gpu.product as NVIDIA's feature discovery labels it
    efa_interfaces: int = 0

    @property
    def has_efa(self) -> bool:
        return self.efa_interfaces > 0

    def capacity(self) -> dict[str, str]:
        """The node's capacity before any device plugin runs (cpu, memory, pods)."""
        return {"cpu": str(self.vcpus), "memory": f"{self.memory_gib}Gi", "pods": str(self.max_pods)}

    def allocatable(self) -> dict[str, str]:
        """Capacity less what the EKS AMI reserves for the kubelet and eviction."""
        cpu_m, memory_mi = self.allocatable_cpu_millis(), self.allocatable_memory_mi()
        return {"cpu": f"{cpu_m}m", "memory": f"{memory_mi}Mi", "pods": str(self.max_pods)}

    def allocatable_cpu_millis(self) -> int:
        return self.vcpus * 1000 - kube_reserved_cpu_millis(self.vcpus)

    def allocatable_memory_mi(self) -> int:
        return self.memory_gib * 1024 - (255 + 11 * self.max_pods) - 100

    def device_resources(self) -> dict[str, int]:
        """The extended resources device plugins advertise on this type, when they run there."""
        out: dict[str, int] = {}
        if self.gpus:
            out[lb.GPU_RESOURCE] = self.gpus
        if self.efa_interfaces:
            out[EFA_RESOURCE] = self.efa_interfaces
        return out


def kube_reserved_cpu_millis(vcpus: int) -> int:
    """6 % of the first core, 1 % of the second, 0.5 % of the next two, 0.25 % of the rest."""
    steps = ((1, 60), (1, 10), (2, 5))
    left, reserved = vcpus, 0.0
    for cores, millis_per_core in steps:
        used = min(left, cores)
        reserved += used * millis_per_core
        left -= used
    reserved += left * 2.5
    return int(reserved)


# What a GPU node keeps for the DaemonSets beside slurmd (aws-node, kube-proxy, the CSI node
# plugins, device plugins, dcgm-exporter, the XID watcher, slurmd's munge sidecar): a Guaranteed
# slurmd may take the rest of the node's allocatable, no more.
NODE_DAEMONS_CPU_MILLIS: Final = 1000
NODE_DAEMONS_MEMORY_MI: Final = 4096


def slurmd_fit_problem(itype: InstanceType, cpus: int, real_memory_mb: int) -> str | None:
    """Why a Guaranteed slurmd of `cpus` and `real_memory_mb` cannot run on `itype`, or None."""
    max_cpus = (itype.allocatable_cpu_millis() - NODE_DAEMONS_CPU_MILLIS) // 1000
    max_memory = itype.allocatable_memory_mi() - NODE_DAEMONS_MEMORY_MI
    if cpus > max_cpus:
        return (
            f"cpus {cpus} do not fit a {itype.name} (allocatable {itype.allocatable_cpu_millis()}m, "
            f"less {NODE_DAEMONS_CPU_MILLIS}m for the node's DaemonSets): at most {max_cpus}"
        )
    if real_memory_mb > max_memory:
        return (
            f"realMemoryMb {real_memory_mb} does not fit a {itype.name} (allocatable "
            f"{itype.allocatable_memory_mi()}Mi, less {NODE_DAEMONS_MEMORY_MI}Mi for the node's "
            f"DaemonSets): at most {max_memory}"
        )
    return None


_TYPES: Final = (
    # GPU pools
    InstanceType("p5.48xlarge", 192, 2048, 100, 8, "NVIDIA-H100-80GB-HBM3", 32),
    InstanceType("p5e.48xlarge", 192, 2048, 100, 8, "NVIDIA-H200", 32),
    InstanceType("p5en.48xlarge", 192, 2048, 100, 8, "NVIDIA-H200", 16),
    InstanceType("p4d.24xlarge", 96, 1152, 737, 8, "NVIDIA-A100-SXM4-40GB", 4),
    InstanceType("p4de.24xlarge", 96, 1152, 737, 8, "NVIDIA-A100-SXM4-80GB", 4),
    InstanceType("g5.48xlarge", 192, 768, 345, 8, "NVIDIA-A10G", 1),
    InstanceType("g5.12xlarge", 48, 192, 234, 4, "NVIDIA-A10G"),
    InstanceType("g5.xlarge", 4, 16, 58, 1, "NVIDIA-A10G"),
    # system node groups
    InstanceType("m5.large", 2, 8, 29),
    InstanceType("m5.xlarge", 4, 16, 58),
    InstanceType("m6i.xlarge", 4, 16, 58),
    InstanceType("m6i.2xlarge", 8, 32, 58),
    InstanceType("m7i.xlarge", 4, 16, 58),
    InstanceType("m7i.2xlarge", 8, 32, 58),
    InstanceType("m7i.4xlarge", 16, 64, 234),
)
INSTANCE_TYPES: Final = {t.name: t for t in _TYPES}


def instance_type(name: str) -> InstanceType:
    """The instance type `name`, or a ValueError naming the ones known."""
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        known = ", ".join(sorted(INSTANCE_TYPES))
        raise ValueError(
            f"instance type {name!r} is not in autoheal's table (components/instances.py): "
            f"add its vCPUs, memory, max pods, GPUs and EFA interfaces there, or use one of {known}"
        ) from None

"""SlurmSharedStorage: /home and /checkpoints, shared by the login node and every slurmd, and the
read-only software trees the researchers' jobs run.

A requeued job must find its checkpoint wherever it restarts, so both are PersistentVolumeClaims
with a shared access mode (ReadWriteMany by default), mounted at the same paths everywhere.

Software (a Python environment with PyTorch, CUDA, compilers) is what HPC sites keep on a shared
filesystem and mount on every node (`/sw`, `/opt/apps`; soperator's "jail" is the same idea): the
slurmd image stays Slurm only, and a new environment is a new tree, not a new image pushed to
every node. Each `SoftwareVolume` is an existing claim (an NFS or Lustre share) or, where there is
no shared filesystem (a single-host lab), a host path; it is mounted read-only at its path in the
login pod and every slurmd pod, so a job sees the same tree wherever it is requeued.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components import k8sargs
from components.common import SubComponent, base_labels


@dataclass(frozen=True)
class SlurmStorage:
    """Sizes and classes of Slurm's volumes (None: the cluster's default StorageClass)."""

    state_size: str = "10Gi"
    home_size: str = "100Gi"
    checkpoint_size: str = "1Ti"
    state_storage_class: str | None = None
    shared_storage_class: str | None = None
    shared_access_mode: str = "ReadWriteMany"
    # /checkpoints on a class of its own (a parallel filesystem: FSx for Lustre); None: the shared one
    checkpoint_storage_class: str | None = None

    def storage_class(self, volume: str) -> str | None:
        if volume == "checkpoints" and self.checkpoint_storage_class is not None:
            return self.checkpoint_storage_class
        return self.shared_storage_class


@dataclass(frozen=True)
class SoftwareVolume:
    """A read-only software tree mounted at `mount_path` in the login and slurmd pods: an existing
    PersistentVolumeClaim (`claim`, in Slurm's namespace) or a directory of the node (`host_path`)."""

    name: str
    mount_path: str
    claim: str | None = None
    host_path: str | None = None

    def validate(self) -> None:
        if (self.claim is None) == (self.host_path is None):
            raise ValueError(f"software volume {self.name!r}: give exactly one of claim and host_path")
        if not self.mount_path.startswith("/"):
            raise ValueError(
                f"software volume {self.name!r}: mount_path must be absolute, got {self.mount_path!r}"
            )

    def volume(self) -> k8s.core.v1.VolumeArgs:
        if self.claim is not None:
            return k8s.core.v1.VolumeArgs(
                name=self.name,
                persistent_volume_claim=k8s.core.v1.PersistentVolumeClaimVolumeSourceArgs(
                    claim_name=self.claim, read_only=True
                ),
            )
        return k8s.core.v1.VolumeArgs(
            name=self.name,
            host_path=k8s.core.v1.HostPathVolumeSourceArgs(path=str(self.host_path), type="Directory"),
        )


# (claim name, volume name, mount path, size attribute of SlurmStorage)
SHARED_VOLUMES = (
    ("slurm-home", "home", "/home", "home_size"),
    ("slurm-checkpoints", "checkpoints", "/checkpoints", "checkpoint_size"),
)


class SlurmSharedStorage(SubComponent):
    volumes: list[k8s.core.v1.VolumeArgs]
    mounts: list[k8s.core.v1.VolumeMountArgs]

    def __init__(
        self,
        name: str,
        owner: str,
        storage: SlurmStorage,
        namespace: pulumi.Input[str],
        annotations: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
        software: Sequence[SoftwareVolume] = (),
    ) -> None:
        super().__init__("autoheal:slurm:SlurmSharedStorage", name, owner, opts)
        self.volumes, self.mounts = [], []
        claims = {}
        for claim, volume, path, size in SHARED_VOLUMES:
            pvc = k8s.core.v1.PersistentVolumeClaim(
                f"{owner}-{claim}",
                metadata=k8sargs.meta(claim, namespace, base_labels(claim, "shared-storage"), annotations),
                spec=k8sargs.claim_spec(
                    storage.shared_access_mode, getattr(storage, size), storage.storage_class(volume)
                ),
                opts=self.adopt(),
            )
            claims[volume] = pvc.metadata.name
            self.volumes.append(k8sargs.pvc_volume(volume, pvc.metadata.name))
            self.mounts.append(k8sargs.mount(volume, path))
        for sw in software:
            sw.validate()
            self.volumes.append(sw.volume())
            self.mounts.append(k8sargs.mount(sw.name, sw.mount_path, read_only=True))
        self.register_outputs({"claims": claims, "software": [sw.mount_path for sw in software]})

"""SlurmSharedStorage: /home and /checkpoints, shared by the login node and every slurmd.

A requeued job must find its checkpoint wherever it restarts, so both are PersistentVolumeClaims
with a shared access mode (ReadWriteMany by default), mounted at the same paths everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components import kube
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
    ) -> None:
        super().__init__("autoheal:slurm:SlurmSharedStorage", name, owner, opts)
        self.volumes, self.mounts = [], []
        claims = {}
        for claim, volume, path, size in SHARED_VOLUMES:
            pvc = k8s.core.v1.PersistentVolumeClaim(
                f"{owner}-{claim}",
                metadata=kube.meta(claim, namespace, base_labels(claim, "shared-storage"), annotations),
                spec=kube.claim_spec(
                    storage.shared_access_mode, getattr(storage, size), storage.shared_storage_class
                ),
                opts=self.adopt(),
            )
            claims[volume] = pvc.metadata.name
            self.volumes.append(kube.pvc_volume(volume, pvc.metadata.name))
            self.mounts.append(kube.mount(volume, path))
        self.register_outputs({"claims": claims})

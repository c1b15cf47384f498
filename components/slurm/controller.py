"""SlurmController: slurmctld as a one-pod StatefulSet whose state survives the pod.

slurmctld's StateSaveLocation (the job queue, the node states the runbook set) is on a
PersistentVolumeClaim from a volumeClaimTemplate, retained when the StatefulSet is deleted or
scaled, so a restart or a reschedule loses nothing. A headless Service gives the pod the stable
DNS name slurm.conf names (`slurmctld-0.slurmctld.<namespace>.svc.cluster.local`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from autoheal import labels as lb
from components import kube
from components.common import SubComponent, base_labels
from components.slurm.config import SlurmPodParts
from components.slurm.layout import CONFIG_DIR, CONTROLLER_PORT, STATE_DIR
from components.slurm.storage import SlurmStorage


@dataclass(frozen=True)
class SlurmControllerArgs:
    namespace: pulumi.Input[str]
    image: str
    storage: SlurmStorage
    parts: SlurmPodParts
    annotations: dict[str, str]  # on the Service and the StatefulSet (e.g. skipAwait)


class SlurmController(SubComponent):
    def __init__(
        self, name: str, owner: str, args: SlurmControllerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("autoheal:slurm:SlurmController", name, owner, opts)
        labels = base_labels("slurmctld", lb.SLURMCTLD_COMPONENT)
        service = k8s.core.v1.Service(
            f"{owner}-slurmctld",
            metadata=kube.meta("slurmctld", args.namespace, labels, args.annotations),
            spec=kube.headless_service(labels, "slurmctld", CONTROLLER_PORT),
            opts=self.adopt(),
        )
        annotations = {lb.STATE_DIR_ANNOTATION: STATE_DIR, **args.annotations}
        k8s.apps.v1.StatefulSet(
            f"{owner}-slurmctld",
            metadata=kube.meta("slurmctld", args.namespace, labels, annotations),
            spec=k8s.apps.v1.StatefulSetSpecArgs(
                service_name=service.metadata.name,
                replicas=1,
                selector=kube.selector(labels),
                persistent_volume_claim_retention_policy=k8s.apps.v1.StatefulSetPersistentVolumeClaimRetentionPolicyArgs(
                    when_deleted="Retain", when_scaled="Retain"
                ),
                template=kube.template(
                    labels, _pod(args), {lb.CONFIG_HASH_ANNOTATION: args.parts.config_hash}
                ),
                volume_claim_templates=[_state_claim(args.storage)],
            ),
            opts=self.adopt(),
        )
        self.register_outputs({"service": service.metadata.name})


def _state_claim(storage: SlurmStorage) -> k8s.core.v1.PersistentVolumeClaimArgs:
    return k8s.core.v1.PersistentVolumeClaimArgs(
        metadata=k8s.meta.v1.ObjectMetaArgs(name="state"),
        spec=kube.claim_spec("ReadWriteOnce", storage.state_size, storage.state_storage_class),
    )


def _pod(args: SlurmControllerArgs) -> k8s.core.v1.PodSpecArgs:
    slurmctld = k8s.core.v1.ContainerArgs(
        name="slurmctld",
        image=args.image,
        command=["slurmctld", "-D", "-f", f"{CONFIG_DIR}/slurm.conf"],
        ports=[k8s.core.v1.ContainerPortArgs(name="slurmctld", container_port=CONTROLLER_PORT)],
        volume_mounts=[*args.parts.mounts, kube.mount("state", STATE_DIR)],
        readiness_probe=kube.tcp_probe(CONTROLLER_PORT, 5),
        liveness_probe=kube.tcp_probe(CONTROLLER_PORT, 30, 20),
    )
    return k8s.core.v1.PodSpecArgs(containers=[slurmctld, args.parts.munge], volumes=args.parts.volumes)

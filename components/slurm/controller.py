"""SlurmController: slurmctld as a one-pod StatefulSet whose state survives the pod.

slurmctld's StateSaveLocation (the job queue, the node states the runbook set) is on a
PersistentVolumeClaim from a volumeClaimTemplate, retained when the StatefulSet is deleted or
scaled, so a restart or a reschedule loses nothing. A headless Service gives the pod the stable
DNS name slurm.conf names (`slurmctld-0.slurmctld.<namespace>.svc.cluster.local`). slurmctld
starts as root and drops to SlurmUser, so the init container hands that user the state volume
and the pid directory (a fresh volume is root's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from autoheal import labels as lb
from components import k8sargs
from components.common import SubComponent, base_labels
from components.slurm import scripts
from components.slurm.config import SlurmPodParts
from components.slurm.layout import CONFIG_DIR, CONTROLLER_PORT, RUN_DIR, STATE_DIR
from components.slurm.scripts import ClusterUser
from components.slurm.storage import SlurmStorage


@dataclass(frozen=True)
class SlurmControllerArgs:
    namespace: pulumi.Input[str]
    image: str
    storage: SlurmStorage
    parts: SlurmPodParts
    annotations: dict[str, str]  # on the Service and the StatefulSet (e.g. skipAwait)
    slurm_user: str
    user: ClusterUser
    tolerations: list[k8s.core.v1.TolerationArgs]
    node_selector: dict[str, str] = field(default_factory=dict)


class SlurmController(SubComponent):
    def __init__(
        self, name: str, owner: str, args: SlurmControllerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("autoheal:slurm:SlurmController", name, owner, opts)
        labels = base_labels("slurmctld", lb.SLURMCTLD_COMPONENT)
        service = k8s.core.v1.Service(
            f"{owner}-slurmctld",
            metadata=k8sargs.meta("slurmctld", args.namespace, labels, args.annotations),
            spec=k8sargs.headless_service(labels, "slurmctld", CONTROLLER_PORT),
            opts=self.adopt(),
        )
        annotations = {lb.STATE_DIR_ANNOTATION: STATE_DIR, **args.annotations}
        k8s.apps.v1.StatefulSet(
            f"{owner}-slurmctld",
            metadata=k8sargs.meta("slurmctld", args.namespace, labels, annotations),
            spec=k8s.apps.v1.StatefulSetSpecArgs(
                service_name=service.metadata.name,
                replicas=1,
                selector=k8sargs.selector(labels),
                persistent_volume_claim_retention_policy=k8s.apps.v1.StatefulSetPersistentVolumeClaimRetentionPolicyArgs(
                    when_deleted="Retain", when_scaled="Retain"
                ),
                template=k8sargs.template(
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
        spec=k8sargs.claim_spec("ReadWriteOnce", storage.state_size, storage.state_storage_class),
    )


def _pod(args: SlurmControllerArgs) -> k8s.core.v1.PodSpecArgs:
    dirs = k8s.core.v1.ContainerArgs(
        name="state-owner",
        image=args.image,
        command=scripts.script(scripts.owned_dirs(args.slurm_user, STATE_DIR, RUN_DIR)),
        volume_mounts=[k8sargs.mount("state", STATE_DIR), k8sargs.mount("run", RUN_DIR)],
    )
    slurmctld = k8s.core.v1.ContainerArgs(
        name="slurmctld",
        image=args.image,
        # -D: foreground, its log copied to the container's output (`kubectl logs`)
        command=scripts.script(
            scripts.ensure_user(args.user),
            scripts.wait_for_munge(),
            f"exec slurmctld -D -f {CONFIG_DIR}/slurm.conf",
        ),
        ports=[k8s.core.v1.ContainerPortArgs(name="slurmctld", container_port=CONTROLLER_PORT)],
        volume_mounts=[*args.parts.mounts, k8sargs.mount("state", STATE_DIR), k8sargs.mount("run", RUN_DIR)],
        # `scontrol ping`, not a TCP probe: slurmctld logs every connection that sends nothing
        readiness_probe=_ping(period=3, failures=3),
        liveness_probe=_ping(period=20, failures=6),
    )
    return k8s.core.v1.PodSpecArgs(
        tolerations=args.tolerations,
        node_selector=args.node_selector or None,
        init_containers=[args.parts.munge_init, dirs, args.parts.munge],
        containers=[slurmctld],
        volumes=[*args.parts.volumes, k8sargs.empty_dir("run")],
    )


def _ping(period: int, failures: int) -> k8s.core.v1.ProbeArgs:
    return k8s.core.v1.ProbeArgs(
        exec_=k8s.core.v1.ExecActionArgs(command=["sh", "-c", "scontrol ping | grep -q ' is UP'"]),
        period_seconds=period,
        timeout_seconds=10,
        failure_threshold=failures,
    )

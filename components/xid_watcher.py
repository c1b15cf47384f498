"""The XID watcher DaemonSet: `autoheal watch` on every GPU node, posting to Alertmanager directly.

GpuMonitoring builds it beside dcgm-exporter (same node selection: every node of a GPU pool,
whatever its taints). The pod reads the node's kernel log from /dev/kmsg (a read-only hostPath
mount; the container is privileged, the one setting that lets it open the device: see
`kmsg_security_context` and docs/operations.md, "Privileges"), maps bus ids to GPUs
from /proc/driver/nvidia (the driver's procfs is not namespaced), and keeps its cursor and
undelivered alerts in a hostPath directory, so a restarted or rescheduled pod on the same node
neither re-posts old lines nor loses alerts it had not delivered. It also reads the node's sysfs
(the host's /sys, read-only at SYSFS_ROOT) for degraded links: flapping InfiniBand/RoCE ports,
climbing NIC error counters, PCIe links trained down (watcher/links.py). Its /metrics and /healthz are
on WATCHER_PORT (scraped by annotation; /healthz is the liveness probe). It runs from the
runner's image, which carries the whole autoheal package.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from autoheal import __version__
from autoheal import labels as lb
from components import k8sargs
from components.common import base_labels, child

WATCHER_PORT = 9402
KMSG = "/dev/kmsg"
STATE_HOST_DIR = "/var/lib/autoheal/xid-watcher"
STATE_DIR = "/var/lib/autoheal-watcher"
# the runner's image (autoheal is installed there), tagged with the release's one version
DEFAULT_WATCHER_IMAGE = f"ghcr.io/autoheal/runner:{__version__}"
# The Prometheus Operator's Service in front of its Alertmanagers; set it to your Alertmanager.
DEFAULT_ALERTMANAGER_URL = "http://alertmanager-operated.monitoring.svc:9093"
WATCHER_LABELS = base_labels("xid-watcher", "xid-watcher")


KERNEL_LOG_DIR = "/var/run/autoheal-kernel-log"  # where kernel_log_dir is mounted in the pod
SYSFS_ROOT = "/host/sys"  # where the node's /sys is mounted in the pod (read-only)


@dataclass(frozen=True)
class XidWatcherArgs:
    namespace: pulumi.Input[str]
    alertmanager_url: pulumi.Input[str] = DEFAULT_ALERTMANAGER_URL
    image: str = DEFAULT_WATCHER_IMAGE
    # None: the node's kernel log (/dev/kmsg). A directory of the node holding <node>/kmsg and
    # <node>/gpus.csv instead: where a GPU simulator writes each node's driver lines (the lab)
    kernel_log_dir: str | None = None
    resend_seconds: float = 60.0  # re-post a still-active alert this often
    hold_seconds: float = 300.0  # an alert ends this long after its last kernel line


def xid_watcher(
    parent: pulumi.Resource, name: str, args: XidWatcherArgs, skip: dict[str, str]
) -> k8s.apps.v1.DaemonSet:
    """The DaemonSet (see the module docstring); `skip` are the await annotations."""
    host = k8s.core.v1.HostPathVolumeSourceArgs
    pod = k8s.core.v1.PodSpecArgs(
        affinity=k8sargs.required_node_affinity([k8sargs.node_has(lb.POOL_LABEL)]),
        tolerations=[k8s.core.v1.TolerationArgs(operator="Exists")],
        containers=[_container(args)],
        volumes=[
            k8s.core.v1.VolumeArgs(
                name="kmsg",
                host_path=host(path=KMSG, type="CharDevice")
                if args.kernel_log_dir is None
                else host(path=args.kernel_log_dir, type="Directory"),
            ),
            k8s.core.v1.VolumeArgs(
                name="state", host_path=host(path=STATE_HOST_DIR, type="DirectoryOrCreate")
            ),
            # a simulated node's sysfs lies in its kernel-log folder (lab.kernlog)
            *(
                [k8s.core.v1.VolumeArgs(name="sys", host_path=host(path="/sys", type="Directory"))]
                if args.kernel_log_dir is None
                else []
            ),
        ],
    )
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(WATCHER_PORT)}
    return k8s.apps.v1.DaemonSet(
        f"{name}-xid-watcher",
        metadata=k8sargs.meta("xid-watcher", args.namespace, WATCHER_LABELS, skip),
        spec=k8s.apps.v1.DaemonSetSpecArgs(
            selector=k8sargs.selector(WATCHER_LABELS), template=k8sargs.template(WATCHER_LABELS, pod, scrape)
        ),
        opts=child(parent),
    )


def _sources(args: XidWatcherArgs) -> tuple[str, str, str, str]:
    """(where /dev/kmsg's volume is mounted, the kernel log path, the GPU map, the sysfs root) of
    the container. A kernel-log directory holds one folder per node: $(NODE_NAME) is expanded by
    the kubelet."""
    if args.kernel_log_dir is None:
        return KMSG, KMSG, "auto", SYSFS_ROOT
    node = f"{KERNEL_LOG_DIR}/$(NODE_NAME)"
    return KERNEL_LOG_DIR, f"{node}/kmsg", f"file:{node}/gpus.csv", f"{node}/sys"


def _container(args: XidWatcherArgs) -> k8s.core.v1.ContainerArgs:
    mount, path, gpu_map, sysfs = _sources(args)
    return k8s.core.v1.ContainerArgs(
        name="xid-watcher",
        image=args.image,
        command=[
            "autoheal",
            "watch",
            f"--resend-seconds={args.resend_seconds:g}",
            f"--hold-seconds={args.hold_seconds:g}",
        ],
        env=[
            k8sargs.field_env("NODE_NAME", "spec.nodeName"),
            k8s.core.v1.EnvVarArgs(name="AUTOHEAL_ALERTMANAGER", value=args.alertmanager_url),
            k8sargs.env("AUTOHEAL_WATCH_SOURCE", "kmsg"),
            k8sargs.env("AUTOHEAL_WATCH_PATH", path),
            k8sargs.env("AUTOHEAL_WATCH_GPU_MAP", gpu_map),
            k8sargs.env("AUTOHEAL_WATCH_STATE", f"{STATE_DIR}/state.json"),
            k8sargs.env("AUTOHEAL_WATCH_LISTEN", f"0.0.0.0:{WATCHER_PORT}"),
            k8sargs.env("AUTOHEAL_WATCH_SYSFS_ROOT", sysfs),
        ],
        ports=[k8s.core.v1.ContainerPortArgs(name="metrics", container_port=WATCHER_PORT)],
        security_context=kmsg_security_context() if args.kernel_log_dir is None else _file_security_context(),
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": "10m", "memory": "64Mi"}, limits={"memory": "256Mi"}
        ),
        liveness_probe=k8sargs.http_probe("/healthz", WATCHER_PORT, period=20, initial=10),
        # the state folder is per node even where nodes share one filesystem (the lab's)
        volume_mounts=[
            k8sargs.mount("kmsg", mount, read_only=True),
            k8s.core.v1.VolumeMountArgs(name="state", mount_path=STATE_DIR, sub_path_expr="$(NODE_NAME)"),
            *([k8sargs.mount("sys", SYSFS_ROOT, read_only=True)] if args.kernel_log_dir is None else []),
        ],
    )


def kmsg_security_context() -> k8s.core.v1.SecurityContextArgs:
    """The least a pod spec alone can ask for that opens a node's /dev/kmsg for reading (narrower
    needs a device plugin handing out /dev/kmsg, which no cluster has by default), measured on real
    kubelet + containerd 2.4 + runc 1.5 nodes (tests/nodes/test_xid_watcher_kmsg.py;
    docs/operations.md, "Privileges").

    Opening /dev/kmsg takes three things: the device node in the container (the hostPath mount),
    the container's device cgroup allowing char 1:11 read, and CAP_SYSLOG in the effective set
    where `kernel.dmesg_restrict=1` (the kernel's check_syslog_permissions; DAC: the node is root's,
    0644). A non-privileged container gets none of the device cgroup: the runtime allows only its
    default devices (null, zero, full, random, urandom, tty, ptmx, pts, tun) plus those a device
    plugin, CDI or DRA hands it, and a hostPath mount of a device adds nothing to that list. So with
    capabilities {drop: ALL, add: SYSLOG} the open fails with EPERM; it also fails (EPERM) with the
    device allowed but without CAP_SYSLOG, and as any uid but 0 (Kubernetes gives a non-root
    container no effective capabilities). Hence `privileged`: it is what allows the device. It also
    brings every capability and no seccomp filter whatever `capabilities` and `seccompProfile` say
    (measured: CapEff 000001fffeffffff, Seccomp 0 with drop ALL and RuntimeDefault), so neither is
    set here (they would only look like a restriction), and `allowPrivilegeEscalation: false` is
    refused beside it by the API server. The read-only mount does not stop an open for writing (a
    read-only mount guards the file system, not the device). What still restricts: a read-only
    root file system, no host namespaces (PID, network, IPC), and the image's one command."""
    return k8s.core.v1.SecurityContextArgs(
        privileged=True,
        run_as_user=0,  # uid 0: the only uid a Kubernetes container has capabilities as
        read_only_root_filesystem=True,
    )


def _file_security_context() -> k8s.core.v1.SecurityContextArgs:
    """A kernel log written to a file (the lab's simulator): no device, so no privileged (the
    capability set is the one the lab's watchers were proven with; a file needs no CAP_SYSLOG)."""
    return k8s.core.v1.SecurityContextArgs(
        run_as_user=0,  # the node's state folder is root's
        read_only_root_filesystem=True,
        allow_privilege_escalation=False,
        capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"], add=["SYSLOG"]),
    )

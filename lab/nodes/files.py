"""The configuration files of one real node: containerd, CNI, kubelet, kube-proxy; and CoreDNS's.

Each setting that departs from a stock node says why: most follow from several nodes sharing one
host (own roots, sockets, cgroup root, IPs) or from this machine kind (cgroup v1, no
CAP_SYS_RESOURCE, no registry).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

CLUSTER_DOMAIN = "cluster.local"
DNS_SERVICE_IP = "10.96.0.10"  # in the control plane's service range (lab/controlplane.py SERVICE_CIDR)
KUBELET_PORT = 10250
CONTAINERD_DIR = "containerd"  # in a node's folder: containerd's image store and state
# every node sees the whole host's disk: its kubelet evicts (and taints disk-pressure) below this
EVICTION_DISK_PERCENT = 2


@dataclass(frozen=True)
class NodePaths:
    """Where one node keeps its state. `sock_dir` is short (UNIX socket paths fit 108 bytes)."""

    dir: Path  # <run_dir>/nodes/<node>
    sock_dir: Path  # <lab socket dir>/n<index>

    @property
    def containerd_root(self) -> Path:
        return self.dir / CONTAINERD_DIR

    @property
    def containerd_sock(self) -> Path:
        return self.sock_dir / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        # it holds the kubelet's own sockets (pod-resources, plugins): a short path
        return self.sock_dir / "kubelet"

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni" / "net.d"

    @property
    def device_plugins(self) -> Path:
        return self.dir / "device-plugins"

    @property
    def gpu_dev_dir(self) -> Path:
        return self.dir / "dev"

    @property
    def etc(self) -> Path:
        return self.dir / "etc"


# Paths the kubelet and libcni hard-code: each node's mount namespace binds its own copy over them
# (several kubelets would otherwise share one device-plugin socket and checkpoint, and delete each
# other's container log links). /run is a fresh tmpfs per node: containerd's state, shim sockets
# and pinned pod network namespaces stay private and vanish with the node.
PRIVATE_DIRS = {
    "/var/lib/kubelet/device-plugins": "device-plugins",
    "/var/log/containers": "container-logs",
    "/var/lib/cni": "cni/cache",
}


def containerd_config(paths: NodePaths, cni_bin: Path, runc: Path, sandbox_image: str) -> str:
    return f"""# containerd of a lab node (written by lab/nodes/files.py)
version = 3
root = "{paths.containerd_root / "root"}"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{paths.containerd_sock}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{paths.containerd_root / "opt"}"

[plugins."io.containerd.cri.v1.runtime"]
  # this VM lacks CAP_SYS_RESOURCE: no process may lower its oom_score_adj, which the pause
  # container (-998) would otherwise try and fail
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{paths.cni_conf_dir}"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{sandbox_image}"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def cni_config(pod_cidr: str, ipam_dir: Path) -> str:
    conf = {
        "cniVersion": "1.0.0",
        "name": "autoheal",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,  # pod IPs are routable on the lab network; nothing leaves it
                "hairpinMode": True,  # a pod reaching itself through a Service
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(conf, indent=1)


def kubelet_config(
    paths: NodePaths,
    node_ip: str,
    cgroup_root: str,
    taints: list[dict[str, str]],
    ca_file: Path,
) -> str:
    conf = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # cgroup v1 only on this machine kind; kubelet >= 1.35 refuses it unless told
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": "/" + cgroup_root,
        "address": node_ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [DNS_SERVICE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        # no host resolv.conf: a pod resolves cluster names only, never through the host's DNS
        "resolvConf": "",
        "containerRuntimeEndpoint": f"unix://{paths.containerd_sock}",
        "podLogsDir": str(paths.dir / "pod-logs"),
        "registerWithTaints": [{k: v for k, v in t.items() if v} for t in taints],
        "failSwapOn": False,
        "serializeImagePulls": False,
        # the images are imported, never pulled: garbage-collecting them would strand the node
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # every node sees the whole host's memory and disk: only evict when really short
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": f"{EVICTION_DISK_PERCENT}%",
            "imagefs.available": f"{EVICTION_DISK_PERCENT}%",
            "nodefs.inodesFree": f"{EVICTION_DISK_PERCENT}%",
        },
        "maxPods": 110,
        "shutdownGracePeriod": "0s",
        "logging": {"format": "text"},
    }
    return yaml.safe_dump(conf, sort_keys=False)


def kube_proxy_config(kubeconfig: Path, node: str, cluster_cidr: str) -> str:
    conf = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node,
        "mode": "iptables",
        "clusterCIDR": cluster_cidr,
        "detectLocalMode": "ClusterCIDR",
        # 0: leave the conntrack sysctls alone (they are the host's, shared by every node)
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"localhostNodePorts": False},
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
    }
    return yaml.safe_dump(conf, sort_keys=False)


def corefile(listen: str, kubeconfig: Path, health_port: int, ready_port: int) -> str:
    """Cluster DNS answering only for the cluster: no `forward`, so no query leaves the machine."""
    return f""".:53 {{
    bind {listen}
    errors
    health {listen}:{health_port}
    ready {listen}:{ready_port}
    cache 5
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        ttl 5
    }}
}}
"""

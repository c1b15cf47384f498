"""Real Kubernetes nodes for the lab: containerd, kubelet, kube-proxy, CNI, CoreDNS, GPU plugin.

Each node is a pair of Linux namespaces (mount + network) holding its own containerd, kubelet,
kube-proxy and device plugin, placed in a cgroup of its own, and wired to the lab's bridge by a
veth pair (`net`). The lab's control plane stays on loopback; nodes reach it through a forwarder
on the bridge address (`apiproxy`), and cluster DNS (CoreDNS) listens there too (`cluster`).
KWOK nodes keep playing the thousands of nodes the scale work needs, side by side.
"""

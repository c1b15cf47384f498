"""The XID watcher DaemonSet GpuMonitoring declares: on every GPU node, reading /dev/kmsg
read-only, its state on the node, posting to Alertmanager; it runs `autoheal watch` with settings
the watcher's own config accepts."""

from __future__ import annotations

from tests.components.harness import pod_spec
from watcher.config import WatcherConfig


def test_watcher_runs_on_every_gpu_node_with_the_kernel_log_and_node_state(lab):
    ds = lab.one("kubernetes:apps/v1:DaemonSet", "xid-watcher")
    spec = pod_spec(ds)
    dcgm = pod_spec(lab.one("kubernetes:apps/v1:DaemonSet", "dcgm-exporter"))
    # where dcgm-exporter runs, and also while the ladder has stopped the GPU agents (the watcher
    # reads the kernel log, not the GPUs: an XID during a reset is still seen)
    pool_only = dcgm["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    pool_only["nodeSelectorTerms"][0]["matchExpressions"] = [
        e
        for e in pool_only["nodeSelectorTerms"][0]["matchExpressions"]
        if e["key"] != "autoheal.io/gpu-agents"
    ]
    assert spec["affinity"] == dcgm["affinity"] and spec["tolerations"] == [{"operator": "Exists"}]
    (c,) = spec["containers"]
    assert c["command"] == ["autoheal", "watch", "--resend-seconds=60", "--hold-seconds=300"]
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"]}
    assert volumes["kmsg"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert volumes["state"]["type"] == "DirectoryOrCreate"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["kmsg"].get("readOnly") is True and not mounts["state"].get("readOnly")
    # privileged is the one setting that opens /dev/kmsg on a real node; capabilities and seccomp
    # would be ignored beside it (docs/operations.md, "Privileges"; tests/nodes/test_xid_watcher_kmsg.py)
    assert c["securityContext"] == {"privileged": True, "runAsUser": 0, "readOnlyRootFilesystem": True}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert (
        next(e for e in c["env"] if e["name"] == "NODE_NAME")["valueFrom"]["fieldRef"]["fieldPath"]
        == "spec.nodeName"
    )
    # the environment the pod gets is a valid watcher configuration
    cfg = WatcherConfig.model_validate(
        {
            "node": "gpu-1",
            "source": env["AUTOHEAL_WATCH_SOURCE"],
            "path": env["AUTOHEAL_WATCH_PATH"],
            "alertmanagers": [env["AUTOHEAL_ALERTMANAGER"]],
            "state_file": env["AUTOHEAL_WATCH_STATE"],
            "gpu_map": env["AUTOHEAL_WATCH_GPU_MAP"],
            "listen": env["AUTOHEAL_WATCH_LISTEN"],
        }
    )
    assert str(cfg.state_file).startswith(mounts["state"]["mountPath"])
    port = int(cfg.listen.rsplit(":", 1)[1])
    assert c["ports"] == [{"name": "metrics", "containerPort": port}]
    assert ds.inputs["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(port)


def test_a_simulated_kernel_log_dir_replaces_dev_kmsg_per_node_and_state_is_per_node():
    """The lab's GPU simulator writes <dir>/<node>/kmsg and gpus.csv: the watcher reads its own
    node's (the kubelet expands $(NODE_NAME)); nodes sharing one disk keep separate state."""
    from components.xid_watcher import KERNEL_LOG_DIR, XidWatcherArgs, xid_watcher
    from tests.components.harness import run_program

    def program() -> None:
        import pulumi

        class Parent(pulumi.ComponentResource):
            def __init__(self) -> None:
                super().__init__("t:x:P", "p")

        args = XidWatcherArgs("autoheal", kernel_log_dir="/lab/gpunodes", resend_seconds=5, hold_seconds=20)
        xid_watcher(Parent(), "m", args, {})

    spec = pod_spec(run_program(program).one("kubernetes:apps/v1:DaemonSet", "xid-watcher"))
    (c,) = spec["containers"]
    assert c["command"][2:] == ["--resend-seconds=5", "--hold-seconds=20"]
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"]}
    assert volumes["kmsg"] == {"path": "/lab/gpunodes", "type": "Directory"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["AUTOHEAL_WATCH_PATH"] == f"{KERNEL_LOG_DIR}/$(NODE_NAME)/kmsg"
    assert env["AUTOHEAL_WATCH_GPU_MAP"] == f"file:{KERNEL_LOG_DIR}/$(NODE_NAME)/gpus.csv"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["state"]["subPathExpr"] == "$(NODE_NAME)"
    assert not c["securityContext"].get("privileged")  # a file needs no device
    assert [e["name"] for e in c["env"]].index("NODE_NAME") == 0  # defined before it is used

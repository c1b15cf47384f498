"""The watcher DaemonSet reads the node's sysfs for degraded links (issue 36): the host's /sys
read-only on a real node, the simulated node's tree beside its kernel log in the lab; the pod's
environment is a valid watcher configuration that turns the link checks on."""

from __future__ import annotations

from typing import Any

from components.xid_watcher import KERNEL_LOG_DIR, SYSFS_ROOT, XidWatcherArgs, xid_watcher
from tests.components.harness import pod_spec, run_program
from watcher.config import WatcherConfig


def _spec(**args: Any) -> dict[str, Any]:
    def program() -> None:
        import pulumi

        class Parent(pulumi.ComponentResource):
            def __init__(self) -> None:
                super().__init__("t:x:P", "p")

        xid_watcher(Parent(), "m", XidWatcherArgs("autoheal", **args), {})

    spec: dict[str, Any] = pod_spec(run_program(program).one("kubernetes:apps/v1:DaemonSet", "xid-watcher"))
    return spec


def _env(spec: dict[str, Any]) -> dict[str, str]:
    (c,) = spec["containers"]
    return {e["name"]: e.get("value") for e in c["env"]}


def test_a_real_node_mounts_its_sys_read_only_and_the_watcher_reads_it() -> None:
    spec = _spec()
    (c,) = spec["containers"]
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"]}
    assert volumes["sys"] == {"path": "/sys", "type": "Directory"}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["sys"]["mountPath"] == SYSFS_ROOT and mounts["sys"]["readOnly"] is True
    env = _env(spec)
    cfg = WatcherConfig.model_validate(
        {
            "node": "gpu-1",
            "alertmanagers": [env["AUTOHEAL_ALERTMANAGER"]],
            "state_file": env["AUTOHEAL_WATCH_STATE"],
            "sysfs_root": env["AUTOHEAL_WATCH_SYSFS_ROOT"],
        }
    )
    assert str(cfg.sysfs_root) == SYSFS_ROOT


def test_the_lab_reads_each_simulated_nodes_tree_beside_its_kernel_log() -> None:
    spec = _spec(kernel_log_dir="/lab/gpunodes")
    assert "sys" not in {v["name"] for v in spec["volumes"]}
    assert _env(spec)["AUTOHEAL_WATCH_SYSFS_ROOT"] == f"{KERNEL_LOG_DIR}/$(NODE_NAME)/sys"

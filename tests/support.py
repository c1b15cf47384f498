"""Helpers every test package shares: one `wait_for`, and port blocks that can be shifted.

`AUTOHEAL_TEST_PORT_OFFSET` moves every fixed port block the suites use, so two checkouts can run
their lab tests on one machine at the same time without fighting over loopback ports; each of
`make test`'s workers adds its own shift to it at its start (tests/workers.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lab.config import LabConfig

PORT_OFFSET = int(os.environ.get("AUTOHEAL_TEST_PORT_OFFSET", "0"))


def port_base(base: int) -> int:
    """`base` shifted by $AUTOHEAL_TEST_PORT_OFFSET (which holds the worker's shift too)."""
    return base + PORT_OFFSET


def wait_for(
    pred: Callable[[], Any], timeout: float = 60.0, what: str = "condition", interval: float = 0.2
) -> Any:
    """Poll `pred` until it returns something truthy (returned), or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie has exited: it only waits to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def processes_pointing_into(*dirs: Path | str) -> dict[int, str]:
    """Live processes that point into one of `dirs` by their command line, working directory,
    open files or environment: PID -> command line. Read from /proc here, not through the code
    under test (a detached slurmstepd shows itself only by its open log and its SLURM_CONF)."""
    roots = [str(d).rstrip("/") for d in dirs]

    def inside(text: str) -> bool:
        return any(r in text for r in roots)

    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid() or not pid_alive(int(entry.name)):
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (entry / "environ").read_bytes().decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
            files = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if inside(cmd) or inside(env) or inside(cwd) or any(inside(f) for f in files):
            found[int(entry.name)] = cmd.strip() or f"[{cwd}]"
    return found


def free_port() -> int:
    """A loopback port nothing listens on now (for servers a test starts; a fixed port may be taken)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pinned_deployment(
    name: str, node: str, replicas: int, namespace: str = "default", tolerations: list[Any] | None = None
) -> dict[str, Any]:
    """A Deployment of `replicas` fake pods held on one node (KWOK runs them): what a drain evicts."""
    pod_spec: dict[str, Any] = {"nodeSelector": {"kubernetes.io/hostname": node}}
    if tolerations:
        pod_spec["tolerations"] = tolerations
    pod_spec["containers"] = [{"name": "c", "image": "fake"}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec},
        },
    }


def lab_slurm(cfg: LabConfig, *argv: str, check: bool = True) -> str:
    """A Slurm command against a host-Slurm lab; its environment read at call time (tests may set
    variables). Fails naming the command and its stderr when `check`."""
    env = dict(os.environ, **cfg.slurm_env())
    res = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise AssertionError(f"{argv}: {res.stderr}")
    return res.stdout

"""ssh to a pods lab's login node, as a researcher does: the lab's Slurm client when Slurm runs
as pods.

A host lab's Slurm answers the host's own `scontrol`; a pods lab's slurmctld speaks Slurm 24.11
inside the cluster, which the host's Debian 12 client (22.05) cannot talk to. So the demo and the
lab's checks go where a researcher goes: `ssh researcher@<login Service>` (its NodePort on a live
real node), with the lab's key (lab.stack.ssh_key, declared in the stack's authorizedKeys) and the
host key the stack generated, checked strictly. One ssh master connection is shared by the calls
(ControlMaster), so a poll costs a channel, not a handshake.
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

from autoheal.errors import LabError
from lab import controlplane
from lab.config import LabConfig

NAMESPACE = "slurm"
SERVICE = "slurm-login"
HOST_KEY_SECRET = "slurm-login-hostkey"  # noqa: S105 (a name, not a secret)
USER = "researcher"


def _get(cfg: LabConfig, path: str) -> Any:
    with controlplane.http_client(cfg.kubeconfig, pool=1, timeout=10) as http:
        r = http.get(path)
        if r.status_code != 200:
            raise LabError(f"login: GET {path}: {r.status_code} {r.text[:200]}")
        return r.json()


class Login:
    """`run(command)` as the researcher on the login pod; `hosts` are the live real nodes' IPs."""

    def __init__(self, cfg: LabConfig) -> None:
        from lab import stack
        from lab.nodes import cluster, net

        svc = _get(cfg, f"/api/v1/namespaces/{NAMESPACE}/services/{SERVICE}")
        self.port = int(svc["spec"]["ports"][0]["nodePort"])
        state = json.loads(cluster.state_file(cfg.run_dir).read_text())
        lab_net = net.LabNet(**state["net"])
        nodes = sorted(state["nodes"].items(), key=lambda kv: kv[0] != cluster.SYSTEM_NODE)  # it stays
        self.hosts = [lab_net.node_ip(int(rec["index"])) for _, rec in nodes]
        secret = _get(cfg, f"/api/v1/namespaces/{NAMESPACE}/secrets/{HOST_KEY_SECRET}")
        kind, key = base64.b64decode(secret["data"]["ssh_host_ed25519_key.pub"]).decode().split()[:2]
        self.key = stack.ssh_key(cfg)  # made with its folder when the stack declared it
        self.known_hosts = self.key.parent / "known_hosts"
        self.known_hosts.write_text("".join(f"[{h}]:{self.port} {kind} {key}\n" for h in self.hosts))
        # a socket path must fit in 108 bytes: the lab's short socket folder, %C a hash of the target
        cfg.socket_dir.mkdir(parents=True, exist_ok=True)
        self.control = cfg.socket_dir / "ssh-%C"

    def _argv(self, host: str, command: str) -> list[str]:
        opts = {
            "UserKnownHostsFile": str(self.known_hosts),
            "StrictHostKeyChecking": "yes",
            "BatchMode": "yes",
            "ConnectTimeout": "10",
            "ControlMaster": "auto",
            "ControlPath": str(self.control),
            "ControlPersist": "120",
            "LogLevel": "ERROR",
        }
        argv = ["ssh", "-i", str(self.key), "-p", str(self.port)]
        for k, v in opts.items():
            argv += ["-o", f"{k}={v}"]
        return [*argv, f"{USER}@{host}", command]

    def run(self, command: str, stdin: str = "", timeout: float = 60, check: bool = True) -> str:
        """The command's stdout; with `check`, a LabError naming the command and its stderr when
        it fails. Tries each live node's NodePort until one answers (nodes come and go)."""
        res: subprocess.CompletedProcess[str] | None = None
        for host in self.hosts:
            res = subprocess.run(
                self._argv(host, command),
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            if res.returncode != 255:  # 255: ssh itself failed (that node is gone): try the next
                break
        if res is None:
            raise LabError("login: the lab has no real node to reach the login Service on")
        if check and res.returncode != 0:
            raise LabError(f"login: `{command}` exit {res.returncode}: {res.stderr.strip()[-400:]}")
        return res.stdout

    def put(self, path: str, text: str, mode: str = "0644") -> None:
        """Write a file into the researcher's home (or any path they may write)."""
        q = shlex.quote(path)
        self.run(f"mkdir -p $(dirname {q}) && cat > {q} && chmod {mode} {q}", stdin=text)

    def close(self) -> None:
        for host in self.hosts:
            subprocess.run(
                [*self._argv(host, "")[:-2], "-O", "exit", f"{USER}@{host}"],
                capture_output=True,
                timeout=10,
                check=False,
            )


def upload(login: Login, files: dict[str, Path]) -> None:
    """Copy local files to paths on the login node (the researcher's own scripts)."""
    for dest, src in files.items():
        login.put(dest, src.read_text(), "0755" if src.suffix in (".sh", ".sbatch") else "0644")

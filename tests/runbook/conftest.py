"""Fixtures for the runbook tests: a real lab (Slurm, KWOK Kubernetes, pool controller), helpers
to run the autoheal.cluster modules and the playbooks against it, and a webhook sink.

The lab is started with the CLI (`autoheal lab up --name ... --port-base ...`) in a temporary root
and is ALWAYS torn down (`autoheal lab down`) in the finalizer. Destructive tests ask for
`fresh_lab`, which restarts the same lab from scratch (a lab always starts from empty state).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support import port_base

REPO = Path(__file__).resolve().parents[2]
COLLECTIONS = REPO / "collections"
PLUGINS = "ansible_collections.autoheal.cluster.plugins"
MODULE_UTILS = COLLECTIONS / "ansible_collections/autoheal/cluster/plugins/module_utils"
# The collection's Python imports itself as ansible_collections.autoheal.cluster...; with
# collections/ on sys.path those names resolve to this checkout (the folders are namespace
# packages, merged with the ansible package's own ansible_collections).
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))


def plugin(path: str) -> ModuleType:
    """A Python file of the collection by its dotted path under plugins/ (e.g. "filter.runbook"),
    for tests that need no cluster: module_utils, filters and plugin_utils import nothing of
    Ansible's."""
    return importlib.import_module(f"{PLUGINS}.{path}")


def module_utils(name: str) -> ModuleType:
    return plugin(f"module_utils.{name}")


VENV_BIN = Path(sys.executable).parent
AUTOHEAL = str(VENV_BIN / "autoheal")
LAB_NAME = "runbook"
PORT_BASE = port_base(25000)
SINK_PORT = PORT_BASE + 60
KUBECTL_CANDIDATES = [Path.home() / ".cache/autoheal/bin/kubectl"]
# Flags slurmctld sets and clears on its own from its pings of the slurmds (every SlurmdTimeout/3):
# on a loaded 2-core machine a ping of one of the host's many slurmds can miss its MessageTimeout
# and NOT_RESPONDING comes and goes between two reads (CI saw it on gpu-1 and gpu-4). No play
# writes them, so a test of what a play did compares the other flags.
CONTROLLER_FLAGS = frozenset({"NOT_RESPONDING"})
GRACE = 20  # Slurm KillWait of the test lab; the runbook's own grace is given per test


def ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_DEPRECATION_WARNINGS="false",
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        ANSIBLE_NOCOLOR="1",
        PATH=f"{VENV_BIN}:{env.get('PATH', '')}",
    )
    env.pop("SLURM_CONF", None)  # every call names its slurm.conf: no accidental default cluster
    return env


@dataclass
class Lab:
    name: str
    root: Path
    slurm_conf: Path
    kubeconfig: Path | None
    run_dir: Path
    journal: Path
    starts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    # -- Slurm ------------------------------------------------------------------------------
    def slurm(self, *argv: str, check: bool = True) -> str:
        env = dict(os.environ, SLURM_CONF=str(self.slurm_conf))
        res = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=30)
        if check and res.returncode != 0:
            raise AssertionError(f"{argv}: rc={res.returncode} {res.stderr}")
        return res.stdout

    def nodes(self) -> dict[str, dict[str, Any]]:
        data = json.loads(self.slurm("sinfo", "--json"))
        return {n["name"]: n for n in data["nodes"]}

    def node(self, name: str) -> dict[str, Any]:
        return self.nodes()[name]

    def flags(self, name: str) -> list[str]:
        """The node's state flags that a play or an admin sets: without those slurmctld sets on its
        own from its pings of the slurmds, which no play writes (see CONTROLLER_FLAGS)."""
        return [f for f in self.node(name)["state_flags"] if f not in CONTROLLER_FLAGS]

    def jobs(self) -> dict[int, dict[str, Any]]:
        data = json.loads(self.slurm("squeue", "--json"))
        return {j["job_id"]: j for j in data["jobs"]}

    def sbatch(self, *args: str) -> int:
        out = self.slurm("sbatch", "--parsable", *args)
        return int(out.strip().split(";")[0])

    # -- Kubernetes -------------------------------------------------------------------------
    def kubectl(self, *argv: str, check: bool = True, stdin: str | None = None) -> str:
        assert self.kubeconfig is not None
        exe = next((str(p) for p in KUBECTL_CANDIDATES if p.exists()), "kubectl")
        res = subprocess.run(
            [exe, f"--kubeconfig={self.kubeconfig}", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            input=stdin,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {argv}: {res.stderr}")
        return res.stdout

    def kube_node(self, name: str) -> dict[str, Any] | None:
        out = self.kubectl("get", "node", name, "-o", "json", check=False)
        node: dict[str, Any] | None = json.loads(out) if out.strip() else None
        return node

    # -- the lab's pool controller ----------------------------------------------------------
    def pool_status(self) -> dict[str, Any]:
        out = subprocess.run(
            [AUTOHEAL, "lab", "pool", "status", "--name", self.name, "--root", str(self.root), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        status: dict[str, Any] = json.loads(out)
        return status

    # -- running the automation -------------------------------------------------------------
    def base_vars(self) -> dict[str, Any]:
        v: dict[str, Any] = {
            "autoheal_slurm_conf": str(self.slurm_conf),
            "autoheal_lab_name": self.name,
            "autoheal_lab_root": str(self.root),
            "autoheal_journal_events": str(self.journal),
        }
        if self.kubeconfig is not None:
            v["autoheal_kubeconfig"] = str(self.kubeconfig)
        return v

    def journal_lines(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        return [json.loads(line) for line in self.journal.read_text().splitlines() if line.strip()]


@dataclass
class PlayResult:
    rc: int
    output: str
    changed: int
    failed: int
    seconds: float


RECAP_RE = re.compile(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")


def run_playbook(
    name: str, extra: dict[str, Any], *, check: bool = False, tmp: Path, timeout: int = 600
) -> PlayResult:
    vars_file = tmp / f"vars-{name}-{time.monotonic_ns()}.json"
    vars_file.write_text(json.dumps(extra))
    argv = [str(VENV_BIN / "ansible-playbook"), f"playbooks/{name}.yml", "-e", f"@{vars_file}"]
    if check:
        argv += ["--check", "--diff"]
    t0 = time.monotonic()
    res = subprocess.run(argv, cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=timeout)
    out = res.stdout + res.stderr
    m = RECAP_RE.search(out)
    changed = int(m.group(2)) if m else -1
    failed = int(m.group(4)) if m else -1
    return PlayResult(res.returncode, out, changed, failed, time.monotonic() - t0)


def run_module(module: str, args: dict[str, Any], *, check: bool = False) -> dict[str, Any]:
    argv = [
        str(VENV_BIN / "ansible"),
        "localhost",
        "-m",
        f"autoheal.cluster.{module}",
        "-a",
        json.dumps(args),
    ]
    if check:
        argv += ["--check", "--diff"]
    res = subprocess.run(argv, cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=300)
    out = res.stdout
    start = out.find("{", out.find("=>"))
    if start < 0:
        raise AssertionError(f"no module result in: {out}\n{res.stderr}")
    data: dict[str, Any] = json.JSONDecoder().raw_decode(out[start:])[0]
    data["_rc"] = res.returncode
    data.setdefault("failed", res.returncode != 0)
    return data


def _lab_cmd(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AUTOHEAL, "lab", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def _kube_built() -> bool:
    return all((Path.home() / ".cache/autoheal/bin" / t).exists() for t in ("kube-apiserver", "kwok", "etcd"))


@pytest.fixture(scope="package")
def lab(tmp_path_factory) -> Any:
    if shutil.which("slurmctld") is None:
        pytest.skip("Slurm is not installed")
    root = tmp_path_factory.mktemp("rblabs")
    journal_dir = tmp_path_factory.mktemp("rbjournal")
    state = Lab(
        name=LAB_NAME,
        root=root,
        slurm_conf=root / LAB_NAME / "slurm" / "slurm.conf",
        kubeconfig=None,
        run_dir=root / LAB_NAME,
        journal=journal_dir / "events.jsonl",
    )

    def start() -> None:
        args = [
            "up",
            "--name",
            LAB_NAME,
            "--root",
            str(root),
            "--port-base",
            str(PORT_BASE),
            "--grace",
            str(GRACE),
            "--provision-delay",
            "3",
            "--headroom",
            "6",
        ]
        res = _lab_cmd(*args)
        if res.returncode != 0:
            raise AssertionError(f"autoheal lab up failed: {res.stdout}\n{res.stderr}")
        kc = state.run_dir / "kubeconfig"
        state.kubeconfig = kc if kc.exists() else None
        state.starts += 1
        if state.journal.exists():
            state.journal.unlink()

    state.extra["start"] = start
    try:
        start()
        yield state
    finally:
        _lab_cmd("down", "--name", LAB_NAME, "--root", str(root), timeout=120)


@pytest.fixture
def fresh_lab(lab) -> Any:
    """The folder's lab, restarted from empty state (for tests that retire nodes or change spares)."""
    res = _lab_cmd("down", "--name", lab.name, "--root", str(lab.root), timeout=120)
    assert res.returncode == 0, res.stderr
    lab.extra["start"]()
    return lab


@pytest.fixture
def kube_lab(lab) -> Any:
    if lab.kubeconfig is None:
        pytest.skip("the lab has no Kubernetes control plane (tools not built)")
    return lab


class Sink:
    """Records the JSON bodies POSTed to it (the notify role's webhook)."""

    def __init__(self, port: int) -> None:
        self.bodies: list[dict[str, Any]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                try:
                    sink.bodies.append(json.loads(self.rfile.read(n)))
                except ValueError:
                    sink.bodies.append({"invalid": True})
                self.send_response(204)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{port}/notify"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[str]:
        return [b.get("event", "") for b in self.bodies]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sink():
    s = Sink(SINK_PORT)
    yield s
    s.stop()


CHECKPOINT_JOB = r"""#!/bin/bash
#SBATCH --requeue
# A training job in miniature: one step every 0.5 s, a checkpoint on SIGTERM, resume on restart.
CK="{ckpt}"
LOG="{log}"
step=0
if [ -f "$CK" ]; then step=$(cat "$CK"); echo "resumed from $step on $SLURM_JOB_NODELIST restart=${{SLURM_RESTART_COUNT:-0}}" >> "$LOG"; fi
echo "start $(date +%s.%N) $SLURM_JOB_NODELIST restart=${{SLURM_RESTART_COUNT:-0}}" >> "$LOG"
trap 'echo "$step" > "$CK.tmp" && mv "$CK.tmp" "$CK"; echo "SIGTERM at step $step $(date +%s.%N), checkpoint written" >> "$LOG"; exit 0' TERM
while true; do
  step=$((step + 1))
  sleep 0.5 & wait $!
done
"""


@pytest.fixture
def checkpoint_job(tmp_path):
    """Write the checkpointing batch script; returns (script, checkpoint file, log file)."""
    ck = tmp_path / "ckpt"
    log = tmp_path / "job.log"
    script = tmp_path / "train.sh"
    script.write_text(CHECKPOINT_JOB.format(ckpt=ck, log=log))
    script.chmod(0o755)
    return script, ck, log


def trap_job_script(tmp: Path) -> tuple[Path, Path]:
    """(a batch script that logs "TERM <job id>" to the returned log and exits on SIGTERM, the log):
    a job that checkpoints at once."""
    log = tmp / "trap.log"
    script = tmp / "trap.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"trap 'echo TERM $SLURM_JOB_ID >> {log}; exit 0' TERM\n"
        "while true; do sleep 0.5 & wait $!; done\n"
    )
    script.chmod(0o755)
    return script, log


def in_fresh_interpreter(code: str, *argv: str) -> list[Any]:
    """Run `code` in a fresh interpreter, as the warm fence process runs (it installs the
    collection loader); each line it prints is JSON."""
    out = subprocess.run(
        [sys.executable, "-c", code, str(REPO), *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith(("{", "["))]

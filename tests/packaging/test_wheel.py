"""The wheel as a user installs it (issue 19): `python -m build` carries everything the CLI, the
runner and the lab read (catalogue, playbooks, roles, collection, monitoring files, config,
examples, the Pulumi project), and the wheel installed into a fresh virtualenv outside the
checkout runs `autoheal --version`, `autoheal xids`, `autoheal serve` and a play in check mode
from its own files."""

from __future__ import annotations

import json
import signal
import subprocess
import tarfile
import zipfile
from pathlib import Path

import httpx
import pytest
import yaml

from tests.packaging.conftest import REPO, VERSION, Dist, Installed, run
from tests.support import free_port, wait_for

pytestmark = pytest.mark.timeout(600)

# what the shipped code opens through autoheal.paths.data_root() or ships for users
DATA = [
    "ansible.cfg",
    "Pulumi.yaml",
    "Pulumi.lab.yaml",
    "__main__.py",
    "playbooks/gpu_fatal_xid.yml",
    "playbooks/fence.yml",
    "playbooks/specs/inputs.yml",
    "roles/slurm_node/tasks/main.yml",
    "collections/requirements.yml",
    "collections/ansible_collections/autoheal/cluster/galaxy.yml",
    "collections/ansible_collections/autoheal/cluster/plugins/modules/slurm_node.py",
    "collections/ansible_collections/autoheal/cluster/plugins/action/runbook_inputs.py",
    "config/rules.yaml",
    "config/runner.yaml",
    "inventory/hosts.yml",
    "examples/train.py",
    "monitoring/xid.rules.yml",
    "monitoring/alertmanager.yml",
]
PACKAGE_FILES = [
    "autoheal/data/xid_catalog.yaml",
    "autoheal/cli.py",
    "remediation/app.py",
    "lab/kwok-stages/node-initialize.yaml",
    "review/run.py",
    "policy/rules.py",
    "policy/PulumiPolicy.yaml",
    "watcher/daemon.py",
    "images/build.py",
    "components/runner.py",
]


def _tracked(prefix: str) -> set[str]:
    """Files git tracks under `prefix` (the release must carry each one)."""
    out = subprocess.run(
        ["git", "ls-files", prefix], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return {line for line in out.splitlines() if "/tests/output/" not in line}


def test_wheel_and_sdist_carry_the_data_root(dist: Dist) -> None:
    names = set(zipfile.ZipFile(dist.wheel).namelist())
    share = f"autoheal-{VERSION}.data/data/share/autoheal/"
    data = {n[len(share) :] for n in names if n.startswith(share)}
    missing = [p for p in DATA if p not in data] + [p for p in PACKAGE_FILES if p not in names]
    assert not missing, f"the wheel lacks {missing}"
    for tree in ("playbooks", "roles", "collections", "monitoring", "config", "examples"):
        lost = _tracked(tree) - data
        assert not lost, f"the wheel lacks tracked files {sorted(lost)[:10]}"
    assert not [n for n in names if "__pycache__" in n or "/tests/output/" in n]
    with tarfile.open(dist.sdist) as tar:
        top = f"autoheal-{VERSION}/"
        sdist = {m.name[len(top) :] for m in tar.getmembers() if m.isfile()}
    assert not [p for p in [*DATA, *PACKAGE_FILES, "setup.py", "MANIFEST.in"] if p not in sdist]


def test_installed_cli_runs_from_the_wheel(installed: Installed, tmp_path: Path) -> None:
    env = installed.env()
    out = run([installed.autoheal, "--version"], cwd=tmp_path, env=env)
    assert out.strip() == f"autoheal {VERSION}"
    where = run(
        [
            installed.python,
            "-c",
            "import autoheal, autoheal.paths as p; print(autoheal.__file__); print(p.data_root())",
        ],
        cwd=tmp_path,
        env=env,
    ).split()
    # the code and the data both come from the fresh venv, not from the checkout
    assert where[0].startswith(str(installed.venv)) and Path(where[1]) == installed.share
    xids = run([installed.autoheal, "xids"], cwd=tmp_path, env=env)
    assert "79" in xids and "fallen off the bus" in xids.lower()


def _runner_config(installed: Installed, tmp: Path, **play_vars: str) -> Path:
    """A runner config as a user writes one, pointing at the installed rules and playbooks."""
    (tmp / "token").write_text("t0ken-for-the-test\n")
    cfg = tmp / "runner.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "listen_port": free_port(),
                "token_file": "token",
                "journal_path": "journal.sqlite",
                "state_dir": "state",
                "rules_file": str(installed.share / "config" / "rules.yaml"),
                "playbook_dir": str(installed.share / "playbooks"),
                "play_vars": play_vars,
            }
        )
    )
    return cfg


def test_installed_serve_answers_healthz(installed: Installed, tmp_path: Path) -> None:
    cfg = _runner_config(installed, tmp_path)
    port = yaml.safe_load(cfg.read_text())["listen_port"]
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [installed.autoheal, "serve", "--config", str(cfg)],
        cwd=tmp_path,
        env=installed.env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def healthy() -> bool:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, 60, "autoheal serve (installed) to answer /healthz")
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM), (tmp_path / "serve.log").read_text()


def test_installed_play_in_check_mode(installed: Installed, slurm_lab: Path, tmp_path: Path) -> None:
    """`autoheal run fence.yml --check` from the installed files against a real slurmctld: the
    play runs from <venv>/share/autoheal (playbooks, roles, collection) and changes nothing."""
    cfg = _runner_config(installed, tmp_path, autoheal_slurm_conf=str(slurm_lab))
    argv = [
        installed.autoheal,
        "run",
        "fence.yml",
        "--node",
        "gpu-1",
        "--check",
        "--json",
        "--config",
        str(cfg),
    ]
    out = run(argv, cwd=tmp_path, env=installed.env(), timeout=300)
    assert json.loads(out)["state"] == "completed", out
    sinfo = subprocess.run(
        ["sinfo", "-h", "-N", "-n", "gpu-1", "-o", "%T"],
        env={"SLURM_CONF": str(slurm_lab), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "drain" not in sinfo, f"check mode drained gpu-1: {sinfo}"
    # every task ran from the installed data root, and the drain was reported, not made
    events = [json.loads(p.read_text()) for p in (tmp_path / "state").rglob("job_events/*.json")]
    tasks = [e["event_data"] for e in events if e["event"] in ("runner_on_ok", "runner_on_failed")]
    assert tasks and all(t["task_path"].startswith(str(installed.share)) for t in tasks), tasks
    drain = [t for t in tasks if t["task"] == "Set the Slurm state of the batch to drain"]
    assert drain and drain[0]["res"]["changed_nodes"] == ["gpu-1"], drain


def test_the_runner_image_carries_the_data_root_the_wheel_installs() -> None:
    """setup.py DATA (the wheel's share/autoheal) and images/python.py data_items() (the runner
    image's) are one list: the image once lacked examples/ and monitoring/."""
    import ast

    from images.python import data_items

    tree = ast.parse((REPO / "setup.py").read_text())
    (data,) = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "DATA" for t in node.targets)
    ]
    assert data_items(REPO) == tuple(data) and {"examples", "monitoring"} <= set(data)

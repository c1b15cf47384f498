"""The README and docs, run as a newcomer pastes them (issue 21): every marked shell block of
README.md and docs/*.md runs from the root of a fresh copy of the checkout against one lab this
test starts and tears down, one shell per document (a later block sees what an earlier one
exported, as in a terminal). Unmarked blocks fail; `run: no` needs a reason, and a reason naming
the test that covers the block must name a file that exists. See tests/docs/mdblocks.py."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.mdblocks import Block, documents, shell_blocks, synopsis_commands
from tests.support import port_base

# ~4 minutes on a quiet 2-core machine (one lab up, ~10 plays in check mode); far more when
# other suites share the CPUs
pytestmark = pytest.mark.timeout(2400)

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
PORTS = port_base(27000)
# the README's default pool (gpu-1..gpu-4, spares gpu-5/gpu-6) with one FUTURE node and no XID
# watchers (no block needs them): a lighter lab, the same names
LAB_ARGS = "--nodes 4 --spares 2 --headroom 1 --no-watchers"
BLOCKS = [b for doc in documents(REPO) for b in shell_blocks(doc)]
_RESULT = re.compile(r"^@@block (\S+) (\d+) (\d+)$", re.M)


def test_every_shell_block_carries_a_mark() -> None:
    assert BLOCKS, "no shell block found: the extraction is broken"
    unmarked = [b.where for b in BLOCKS if b.kind is None]
    assert not unmarked, f"shell blocks without a <!-- run: ... --> mark: {unmarked}"
    unexplained = [b.where for b in BLOCKS if b.kind == "no" and not b.reason]
    assert not unexplained, (
        f"'run: no' needs a reason, e.g. <!-- run: no (needs an AWS account) -->: {unexplained}"
    )
    missing = [(b.where, t) for b in BLOCKS for t in b.tested_by if not (REPO / t).is_file()]
    assert not missing, f"marks name tests that do not exist: {missing}"


# one interpreter answers every --help (a fresh `autoheal` process costs seconds of imports each)
_HELP = """
import json, sys
from typer.testing import CliRunner
from autoheal.cli import app, register_plugins
register_plugins(app)
runner = CliRunner()
print(json.dumps([[runner.invoke(app, [*argv, "--help"]).exit_code, argv] for argv in json.loads(sys.argv[1])]))
"""


def test_synopsis_commands_exist() -> None:
    """Summaries such as `autoheal incident show ID`: every command they name answers --help."""
    commands = []
    for block in (b for b in BLOCKS if b.kind == "synopsis"):
        for words in synopsis_commands(block.code):
            assert words and words[0] == "autoheal", (
                f"{block.where}: only autoheal synopses are checked: {words}"
            )
            commands.append(words[1:])
    assert commands
    res = subprocess.run(
        [sys.executable, "-c", _HELP, json.dumps(commands)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert res.returncode == 0, res.stderr
    answers = json.loads(res.stdout.strip().splitlines()[-1])
    assert not [argv for code, argv in answers if code != 0], f"not commands of autoheal: {answers}"
    # and the check can fail: a command that does not exist is refused
    bogus = subprocess.run(
        [sys.executable, "-c", _HELP, json.dumps([["incidnets"]])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(bogus.stdout.strip().splitlines()[-1])[0][0] != 0


def _checkout_copy(dest: Path) -> Path:
    """The working tree's files that git does not ignore (a fresh clone, with today's edits), and
    the project's virtualenv as `make` leaves it."""
    names = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, names):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    (dest / ".venv").symlink_to(VENV)
    return dest


def _env() -> dict[str, str]:
    """A newcomer's shell: no AUTOHEAL_* settings, the venv not activated."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AUTOHEAL_", "VIRTUAL_ENV", "PYTHONPATH"))
    }
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if p and Path(p) != VENV / "bin")
    return env


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A copy of the checkout with the lab `default` up in its .lab/ (on the test's ports, no XID
    watchers: no block needs them), torn down at the end whatever the blocks did."""
    if shutil.which("slurmctld") is None:
        pytest.skip("Slurm is not installed")
    root = _checkout_copy(tmp_path_factory.mktemp("docs") / "autoheal")
    try:
        yield root
    finally:
        subprocess.run(
            [str(VENV / "bin" / "autoheal"), "lab", "down", "--root", str(root / ".lab")],
            cwd=root,
            capture_output=True,
            timeout=300,
            check=False,
        )


def _script(root: Path, blocks: list[Block]) -> str:
    """One shell for a document: each block as written, then the harness's own lines (a marker
    naming the block that passed, and the lab back up if the block took it down)."""
    autoheal = shlex.quote(str(VENV / "bin" / "autoheal"))
    lab = f"--root {shlex.quote(str(root / '.lab'))}"
    reup = (
        f"( cd {shlex.quote(str(root))} && {{ {autoheal} lab status {lab} >/dev/null 2>&1 || "
        f"{autoheal} lab up {lab} --port-base {PORTS} {LAB_ARGS} >/dev/null; }} )"
    )
    parts = ["set -eo pipefail", reup]
    for b in blocks:
        parts += [
            f"echo '@@start {b.doc.name} {b.line}'",
            # what a block writes under /tmp goes to the run's temporary folder (TMPDIR,
            # tests/scratch.py), which the run removes: nothing a run creates outlives it
            b.code.rstrip("\n").replace("/tmp/", '"${TMPDIR:-/tmp}"/'),
            f'echo "@@block {b.doc.name} {b.line} $SECONDS"',
        ]
        parts.append(reup)
    return "\n".join(parts) + "\n"


def _takes_the_lab_down(block: Block) -> bool:
    return "lab down" in block.code


def _run_order(docs: list[Path]) -> list[Path]:
    """The README last, and in each document a block that stops the lab after the others: the
    lab then starts once (it takes most of a minute), not again after the README's `lab down`."""
    return sorted(docs, key=lambda d: any(_takes_the_lab_down(b) for b in shell_blocks(d)))


def test_runnable_blocks_work_as_written(checkout: Path, tmp_path: Path) -> None:
    runnable = [b for b in BLOCKS if b.kind in ("lab", "yes")]
    assert runnable
    report = []
    for doc in _run_order(documents(REPO)):
        blocks = sorted((b for b in runnable if b.doc == doc), key=_takes_the_lab_down)
        if not blocks:
            continue
        script = tmp_path / f"{doc.stem}.sh"
        script.write_text(_script(checkout, blocks))
        log = tmp_path / f"{doc.stem}.log"
        t0 = time.monotonic()
        with log.open("w") as sink:  # a file, so a block that hangs still shows how far it got
            res = subprocess.run(
                ["bash", str(script)],
                cwd=checkout,
                env=_env(),
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=1500,
            )
        out = log.read_text()
        ends = {f"{d}:{n}": int(t) for d, n, t in _RESULT.findall(out)}
        passed = set(ends)
        failed = [b.where for b in blocks if b.where not in passed]
        assert res.returncode == 0 and not failed, (
            f"{doc.name}: block {failed[:1]} failed as written (rc={res.returncode}):\n{out[-6000:]}"
        )
        report.append(
            f"{doc.name}: {len(blocks)} blocks in {time.monotonic() - t0:.0f}s (each ends at s: {ends})"
        )
    print("\n[docs] " + "; ".join(report))

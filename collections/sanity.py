"""Run `ansible-test sanity` on the autoheal.cluster collection, offline but for PyPI.

`make test` runs this. ansible-test must run from the collection's own folder
(collections/ansible_collections/autoheal/cluster), and without Docker it runs with `--local`:
each test that needs tools (pylint, validate-modules, yamllint, ...) gets a virtualenv of its own
under ~/.ansible/test/venv, created once and reused.

ansible-test creates those virtualenvs without pip and bootstraps pip with a script it downloads
from ci-files.testing.ansible.com, which is not reachable here. It takes the script from its cache
when the file is there, so this writes an equivalent into the cache first: the interpreter's own
ensurepip, then pip from PyPI at the version ansible-test pins. Every test ansible-test offers
runs; the few it skips on its own (no PowerShell or shell scripts here) say so in its output.
Ignored findings, with the reason for each: tests/sanity/ignore-<ansible-core version>.txt.

    .venv/bin/python collections/sanity.py [--test NAME ...]
"""

from __future__ import annotations

import argparse
import inspect
import re
import subprocess
import sys
from pathlib import Path

COLLECTION = Path(__file__).resolve().parent / "ansible_collections" / "autoheal" / "cluster"
CACHE = Path.home() / ".ansible" / "test" / "cache"

GET_PIP = '''\
"""Written by autoheal's collections/sanity.py: an offline stand-in for get-pip.py.

ansible-test runs it in a new virtualenv with pip's options (e.g. pip==24.2). ensurepip runs in
a process of its own: in this one it would set PIP_CONFIG_FILE=/dev/null for what follows and
drop the machine's pip settings (its CA bundle among them).
"""
import subprocess
import sys

ARGS = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"])
subprocess.check_call([sys.executable, "-m", "pip", "install", *ARGS])
'''


def pinned_pip() -> str:
    """The pip version ansible-test installs into its virtualenvs (the bootstrap script's name)."""
    from ansible_test._internal import python_requirements

    m = re.search(r"pip='([0-9.]+)'", inspect.getsource(python_requirements.get_venv_packages))
    if not m:
        raise SystemExit("cannot find the pip version ansible-test pins (get_venv_packages changed?)")
    return m.group(1)


def install_bootstrap() -> Path:
    path = CACHE / f"get_pip_{pinned_pip().replace('.', '_')}.py"
    if not path.exists() or path.read_text() != GET_PIP:
        CACHE.mkdir(parents=True, exist_ok=True)
        path.write_text(GET_PIP)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--test", action="append", default=[], help="run only this sanity test (repeatable)")
    args = parser.parse_args(argv)
    install_bootstrap()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    cmd = [str(Path(sys.executable).with_name("ansible-test")), "sanity", "--local", "--python", python]
    cmd += ["--color", "no"] + [f"--test={t}" for t in args.test]
    print("+", " ".join(cmd), f"(in {COLLECTION})", flush=True)
    return subprocess.run(cmd, cwd=COLLECTION, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())

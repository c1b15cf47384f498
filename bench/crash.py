"""Crash anywhere, the full matrix (issue 17): `kill -9` of the runner at every journal boundary
and in the middle of every runbook step (fence, signal, promote, requeue, drain, retire), each
followed by a restart that must complete the incident exactly once without repeating a finished
step. CI runs a subset of tests/faults/test_crash.py; this runs all of it and prints one line per
case (outcome, seconds) and the total.

    python -m bench.crash            # exit status 1 if any case failed
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    env = {**os.environ, "AUTOHEAL_CRASH_MATRIX": "full"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--durations=0",
            "-rA",
            "tests/faults/test_crash.py",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    cases = re.findall(r"^([\d.]+)s call\s+tests/faults/test_crash.py::(\S+)$", proc.stdout, re.MULTILINE)
    results = {
        name: word
        for word, name in re.findall(
            r"^(PASSED|FAILED) tests/faults/test_crash.py::(\S+)", proc.stdout, re.MULTILINE
        )
    }
    print(f"{'case':<70} {'result':<7} seconds")
    for secs, name in sorted(cases, key=lambda c: c[1]):
        print(f"{name:<70} {results.get(name, '?'):<7} {float(secs):.1f}")
    failed = sum(1 for r in results.values() if r == "FAILED")
    print(f"{len(results)} cases, {failed} failed")
    if proc.returncode and not results:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
    return 1 if proc.returncode else 0


if __name__ == "__main__":
    sys.exit(main())

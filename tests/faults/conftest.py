"""Fault tests: the runner as a real process (killed, starved of its dependencies), with the stub
runbook of tests/remediation/playbooks."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remediation"))

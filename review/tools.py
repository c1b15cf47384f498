"""The review's tool checks: ansible-lint of the runbook, promtool and amtool on monitoring/.

Each returns what it found and raises CannotRun when its tool or its files are missing, so a
check that did not run is never mistaken for one that passed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from review.model import CannotRun, LintFinding

LINT_TARGETS = ("playbooks", "roles")


def _tool(name: str, env: Mapping[str, str], hint: str) -> str:
    found = shutil.which(name, path=env.get("PATH", ""))
    if found is None:
        raise CannotRun(f"{name} is not installed ({hint})")
    return found


def ansible_lint(project: Path, env: Mapping[str, str]) -> tuple[bool, list[LintFinding]]:
    """ansible-lint over playbooks/ and roles/: (passed, findings)."""
    targets = [t for t in LINT_TARGETS if (project / t).is_dir()]
    if not targets:
        raise CannotRun("no playbooks/ or roles/ to lint")
    lint = _tool("ansible-lint", env, "pip install -e '.[dev]'")
    argv = [lint, "--offline", "--nocolor", "-q", "-f", "codeclimate", *targets]
    returncode, rows = _json_report("ansible-lint", argv, project, env, empty="[]")
    findings = [_finding(r) for r in rows]
    return returncode == 0, findings


def _json_report(
    name: str, argv: list[str], project: Path, env: Mapping[str, str], empty: str = ""
) -> tuple[int, Any]:
    """Run a tool that prints a JSON report in `project`: (its exit code, the report); a
    RuntimeError naming it when it printed none (`empty`: what no output stands for)."""
    res = subprocess.run(
        argv, cwd=project, env=dict(env), capture_output=True, text=True, timeout=900, check=False
    )
    try:
        return res.returncode, json.loads(res.stdout or empty)
    except json.JSONDecodeError as exc:
        tail = (res.stdout + res.stderr).strip()[-500:]
        raise RuntimeError(f"{name} printed no report (exit {res.returncode}): {tail}") from exc


def _dig(value: object, *keys: str) -> object:
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _finding(row: Mapping[str, object]) -> LintFinding:
    """One entry of ansible-lint's Code Climate report."""
    line = _dig(row, "location", "lines", "begin")
    line = _dig(line, "line") if isinstance(line, dict) else line
    return LintFinding(
        rule=str(row.get("check_name", "?")),
        path=str(_dig(row, "location", "path") or "?"),
        line=line if isinstance(line, int) else 0,
        message=str(row.get("description", "")).strip(),
        severity=str(row.get("severity", "")),
    )


def monitoring(project: Path, env: Mapping[str, str]) -> list[str]:
    """promtool and amtool on the shipped rules, rule tests, Prometheus and Alertmanager config;
    returns the failures (each with the tool's words)."""
    mon = project / "monitoring"
    if not mon.is_dir():
        raise CannotRun("no monitoring/ folder")
    promtool = _tool("promtool", env, "Debian: apt-get install prometheus")
    amtool = _tool("amtool", env, "Debian: apt-get install prometheus-alertmanager")
    rules = sorted(p.name for p in mon.glob("*.rules.y*ml"))
    tests = sorted(str(p.relative_to(mon)) for p in (mon / "tests").glob("*.y*ml"))
    runs = [[promtool, "check", "rules", *rules]] if rules else []
    runs += [[promtool, "test", "rules", *tests]] if tests else []
    runs += (
        [[promtool, "check", "config", "--syntax-only", "prometheus.yml"]]
        if (mon / "prometheus.yml").exists()
        else []
    )
    runs += [[amtool, "check-config", "alertmanager.yml"]] if (mon / "alertmanager.yml").exists() else []
    if not runs:
        raise CannotRun("monitoring/ has no rules or configuration to check")
    failures = []
    for argv in runs:
        res = subprocess.run(
            argv, cwd=mon, env=dict(env), capture_output=True, text=True, timeout=300, check=False
        )
        if res.returncode != 0:
            words = (res.stdout + res.stderr).strip().splitlines()[-5:]
            failures.append(f"{Path(argv[0]).name} {' '.join(argv[1:3])}: " + " / ".join(words))
    return failures


def schedulable(project: Path, stack: str, env: Mapping[str, str]) -> tuple[bool, str]:
    """`autoheal lab schedulable` on the change's stack (the proof lives in the lab, a sibling
    layer: run, not imported): (schedulable, its findings in one line)."""
    autoheal = _tool("autoheal", env, "pip install -e .")
    argv = [autoheal, "lab", "schedulable", "--stack", stack, "--project", str(project), "--json"]
    _, report = _json_report("autoheal lab schedulable", argv, project, env)
    pods = report["pods"]
    findings = [f"{f['object']}: {f['problem']}" for f in report["findings"]]
    summary = f"{pods['bound']} of {pods['total']} pods bound"
    return bool(report["ok"]), "; ".join([summary, *findings[:10]])

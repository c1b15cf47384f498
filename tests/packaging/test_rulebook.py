"""The routing rules as ansible-rulebook sees them (issue 19): every shipped rules file, and every
rulebook shown in the docs, passes ansible-rulebook's own loader (its JSON schema, then its rule
and condition parser), and the exact command a user runs gets past validation.

ansible-rulebook is pinned in the dev extras; it runs in a subprocess because its engine starts
a JVM (drools_jpy). The alertmanager source plugin is in the ansible.eda collection, which only
Galaxy distributes: with it missing, a valid rulebook stops at "Could not find source plugin",
after validation; an invalid one stops before, with "Invalid rulebook".
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from remediation.errors import RulesError
from remediation.rules import load_rules, parse_rules

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# ansible-rulebook looks for ansible-galaxy on PATH (the venv's, with no activation needed)
ENV = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
# ansible-rulebook's own loading path (ansible_rulebook.app.load_rulebook): schema, then parser
_LOADER = """
import argparse, json, sys
from ansible_rulebook.app import load_rulebook
out = {}
for path in sys.argv[1:]:
    try:
        out[path] = [r.name for r in load_rulebook(argparse.Namespace(rulebook=path))]
    except Exception as exc:
        out[path] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""
_FENCE = re.compile(r"^```ya?ml\n(.*?)^```", re.S | re.M)


def _is_rulebook(doc: Any) -> bool:
    return isinstance(doc, list) and bool(doc) and all(isinstance(s, dict) and "rules" in s for s in doc)


def shipped_rules_files() -> list[Path]:
    """YAML files under config/ and examples/ that are rulebooks (a list of rulesets with rules)."""
    found = []
    for path in sorted([*REPO.glob("config/**/*.y*ml"), *REPO.glob("examples/**/*.y*ml")]):
        if _is_rulebook(yaml.safe_load(path.read_text())):
            found.append(path)
    return found


def documented_rulebooks(tmp: Path) -> list[Path]:
    """The rulebooks shown in README.md and docs/*.md, each written to a file of its own."""
    out = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for i, block in enumerate(_FENCE.findall(doc.read_text())):
            data = yaml.safe_load(block)
            if _is_rulebook(data):
                path = tmp / f"{doc.stem}-{i}.yml"
                path.write_text(block)
                out.append(path)
    return out


def rulebook_load(paths: list[Path]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", _LOADER, *map(str, paths)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def old_shape(tmp: Path) -> Path:
    """config/rules.yaml with its routing settings back in the pre-0.3 `autoheal:` block."""
    data = yaml.safe_load((REPO / "config" / "rules.yaml").read_text())
    rule = data[0]["rules"][0]
    rule["autoheal"] = rule["action"]["run_playbook"]["extra_vars"].pop("autoheal_routing")
    path = tmp / "old-rules.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_every_shipped_and_documented_rulebook_passes_ansible_rulebook(tmp_path):
    shipped = shipped_rules_files()
    assert REPO / "config" / "rules.yaml" in shipped
    documented = documented_rulebooks(tmp_path)
    assert documented, "the README shows a rulebook; the extraction found none"
    bad = old_shape(tmp_path)
    results = rulebook_load([*shipped, *documented, bad])
    for path in [*shipped, *documented]:
        assert isinstance(results[str(path)], list) and results[str(path)], (path, results[str(path)])
    # the test can fail: the shape ansible-rulebook refused in issue 19 is refused here too
    assert "'autoheal' was unexpected" in results[str(bad)], results[str(bad)]


def test_runner_reads_the_same_files_and_refuses_the_old_shape(tmp_path):
    for path in [*shipped_rules_files(), *documented_rulebooks(tmp_path)]:
        rules = load_rules(path)
        assert rules.rules and all(r.fault_class for r in rules.rules)
        assert all("autoheal_routing" not in r.extra_vars for r in rules.rules), path
    with pytest.raises(RulesError, match=r"autoheal: move this block to action\.run_playbook\.extra_vars"):
        parse_rules(yaml.safe_load(old_shape(tmp_path).read_text()), "old-rules.yaml")


def test_ansible_rulebook_cli_as_a_user_runs_it(tmp_path):
    """The command from issue 19, cwd = the checkout: validation passes; only the event source
    (ansible.eda, from Galaxy) is missing here. The old shape fails where issue 19 saw it fail."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n")

    def run(rules: Path) -> str:
        proc = subprocess.run(
            [str(BIN / "ansible-rulebook"), "--rulebook", str(rules), "-i", str(inventory)],
            cwd=REPO,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return proc.stdout + proc.stderr

    good = run(Path("config/rules.yaml"))
    assert "Invalid rulebook" not in good, good
    assert "Could not find source plugin for ansible.eda.alertmanager" in good, good
    assert "Invalid rulebook: Additional properties are not allowed ('autoheal' was unexpected)" in run(
        old_shape(tmp_path)
    )


def test_a_play_run_by_ansible_rulebook_stops_at_its_input_check(tmp_path):
    """What README.md's "Installing" says: under ansible-rulebook a play gets the rule's extra vars
    (autoheal_routing included) and the raw event, not the inputs the runner derives from the
    alert, and refuses to start, naming the missing input."""
    rule = yaml.safe_load((REPO / "config" / "rules.yaml").read_text())[0]["rules"][0]
    extra = {
        **rule["action"]["run_playbook"]["extra_vars"],
        "ansible_eda": {"event": {"alert": {"labels": {"alertname": "GpuXidFatal", "Hostname": "gpu-2"}}}},
    }
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            rule["action"]["run_playbook"]["name"],
            "--check",
            "-e",
            json.dumps(extra),
        ],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "missing required arguments: autoheal_nodes" in proc.stdout + proc.stderr

"""Every validating pattern is a full match (issue 17, Deliver 5): `re.match` with `^...$` lets a
trailing newline through ("gpu-1\\n", "79\\n"), so validators use `fullmatch`; checked on the
source and on the behaviour."""

from __future__ import annotations

import ast
import json
import re
import tempfile
from pathlib import Path

import pytest

from autoheal.xid import load_catalog
from remediation.executor import read_events
from remediation.incidents import Incident, Rejected, normalise
from remediation.models import Alert
from remediation.rules import load_rules
from tests.remediation.remhelp import alert, make_config

SOURCES = sorted((Path(__file__).resolve().parents[2] / "remediation").glob("*.py"))


def _anchored_patterns(tree: ast.Module) -> set[str]:
    """Names bound at module level to re.compile("^...$")."""
    names = set()
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "compile"
            and node.value.args
        ):
            arg = node.value.args[0]
            text = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else ""
            if isinstance(arg, ast.JoinedStr):  # rf"^...$": look at its literal ends
                parts = [v.value for v in arg.values if isinstance(v, ast.Constant)]
                text = "".join(str(p) for p in parts)
            if text.startswith("^") or text.endswith("$"):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_anchored_patterns_are_only_used_as_full_matches(path):
    source = path.read_text()
    tree = ast.parse(source)
    for name in _anchored_patterns(tree):
        assert not re.search(rf"\b{name}\.(match|search)\(", source), f"{path.name}: {name} needs fullmatch"
    assert not re.search(r"\bre\.match\(r?[\"']\^", source), f"{path.name}: re.match with ^...$"


# the rules are read once, at import; their folder is not needed after (one was left per run)
with tempfile.TemporaryDirectory(prefix="autoheal-fullmatch-") as _tmp:
    _RULES = load_rules(make_config(Path(_tmp)).rules_file)


def _normalise(**labels: str) -> Incident | Rejected:
    a = Alert.model_validate(alert(**labels))
    rule = _RULES.route(a.labels)
    assert rule is not None
    return normalise(a, rule, load_catalog())


@pytest.mark.parametrize("node", ["gpu-1\n", "gpu-1\r\n", "gpu-1 ", " gpu-1"])
def test_a_node_name_with_a_trailing_newline_or_space_is_rejected(node):
    assert isinstance(_normalise(node=node), Rejected)


@pytest.mark.parametrize("xid", ["79\n", " 79", "\u0667\u0669"])  # Arabic-Indic digits: int() takes them
def test_an_xid_that_is_not_plain_ascii_digits_is_rejected(xid):
    assert isinstance(_normalise(xid=xid), Rejected)


def test_a_gpu_or_source_with_a_newline_is_dropped_not_kept():
    inc = _normalise(gpu="3\n", source="watcher\n")
    assert isinstance(inc, Incident) and inc.gpu is None and inc.source == ""


def test_a_phase_event_with_a_newline_in_its_phase_is_ignored(tmp_path):
    path = tmp_path / "events.jsonl"
    good = {"incident": "inc-0123456789ab", "node": "gpu-1", "phase": "fenced", "status": "ok", "ts": 1.0}
    bad = {**good, "phase": "fenced\n"}
    badid = {**good, "incident": "inc-0123456789ab\n"}
    path.write_text("".join(json.dumps(e) + "\n" for e in (bad, badid, good)))
    events, _ = read_events(path, 0, {"inc-0123456789ab": "gpu-1"})
    assert [e.phase for e in events] == ["fenced"]

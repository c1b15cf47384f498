"""The shape issue 12 asked for, kept: short functions in components/, and only Pulumi's public API
in the component tests and the review's mocks (a private name like `_sync_await` changes without
notice between SDK releases)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.components.harness import ROOT

MAX_FUNCTION_LINES = 60


def _modules(*folders: str) -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text())) for f in folders for p in sorted((ROOT / f).rglob("*.py"))]


def _length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1


def test_no_function_in_components_is_longer_than_60_lines():
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({_length(node)} lines)"
        for path, tree in _modules("components")
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _length(node) > MAX_FUNCTION_LINES
    ]
    assert long == []


def _private_pulumi_uses(tree: ast.Module) -> list[str]:
    """Names starting with `_` imported from, or read off, a pulumi module."""
    pulumi_names = {"pulumi"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pulumi":
            found += [f"from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")]
            pulumi_names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            pulumi_names |= {a.asname or a.name for a in node.names if a.name.split(".")[0] == "pulumi"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in pulumi_names:
                found.append(f"{ast.unparse(node)}")
    return found


def test_tests_and_the_review_use_only_public_pulumi_api():
    uses = [
        f"{path.relative_to(ROOT)}: {use}"
        for path, tree in _modules("tests/components", "review", "components")
        for use in _private_pulumi_uses(tree)
    ]
    assert uses == []


def test_the_private_api_check_can_fail():
    tree = ast.parse(
        "from pulumi.runtime.sync_await import _sync_await\nimport pulumi\npulumi.runtime._x()\n"
    )
    assert _private_pulumi_uses(tree) == [
        "from pulumi.runtime.sync_await import _sync_await",
        "pulumi.runtime._x",
    ]

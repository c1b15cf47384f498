"""The layering contract (docs/architecture.md, "Layers"), enforced by the test suite.

Imports run one way: the shared core (`autoheal`) <- the runner (`remediation`), the Pulumi
components and the policy pack <- the lab <- the benchmarks. import-linter reads every import
(also those inside functions) from the contracts in pyproject.toml; a violation fails here with
its report. The Ansible collection runs on managed hosts where none of the project's packages is
installed, so its Python may import none of them: a contract and an AST scan check that. The
contracts see the collection too (collections/ on the path): outside it, only the warm fence
imports it, and only its plugin_utils/warm_fence.py.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("autoheal", "remediation", "pools", "components", "policy", "images", "watcher", "lab", "bench")
COLLECTION = REPO / "collections" / "ansible_collections" / "autoheal" / "cluster"


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: pip install -e '.[dev]' (import-linter)")
    # --no-cache: nothing written into the checkout; cwd first on sys.path: this tree is analysed;
    # collections/ on the path: the collection is a root package (ansible_collections.autoheal.cluster)
    env = {**os.environ, "PYTHONPATH": str(cwd / "collections")}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(cwd / "pyproject.toml")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def copy_tree(tmp_path: Path) -> None:
    """The packages, the collection and the contracts, to break one on purpose."""
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        COLLECTION,
        tmp_path / COLLECTION.relative_to(REPO),
        ignore=shutil.ignore_patterns("__pycache__", "tests"),
    )
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")


def test_import_layers_hold() -> None:
    res = lint_imports(REPO)
    assert res.returncode == 0, f"lint-imports found a layering violation:\n{res.stdout}\n{res.stderr}"
    assert "0 broken" in res.stdout, res.stdout


def test_layer_contract_catches_an_upward_import(tmp_path: Path) -> None:
    """The contract is not vacuous: the core importing the runner (even lazily) breaks it."""
    copy_tree(tmp_path)
    with (tmp_path / "autoheal" / "errors.py").open("a") as fh:
        fh.write("\n\ndef _upward() -> None:\n    import remediation.journal  # noqa: F401\n")
    res = lint_imports(tmp_path)
    assert res.returncode != 0, res.stdout
    assert "autoheal.errors -> remediation.journal" in res.stdout, res.stdout


def test_the_runner_reaches_the_collection_only_through_the_warm_fence_interface(tmp_path: Path) -> None:
    """The contracts see the collection: the warm fence importing a module of it directly, as it
    once did, breaks them; so does the collection importing the core."""
    copy_tree(tmp_path)
    with (tmp_path / "remediation" / "warmfence.py").open("a") as fh:
        fh.write(
            "\n\ndef _direct() -> None:\n"
            "    from ansible_collections.autoheal.cluster.plugins.modules import fence  # noqa: F401\n"
        )
    names = tmp_path / COLLECTION.relative_to(REPO) / "plugins" / "module_utils" / "contract.py"
    with names.open("a") as fh:
        fh.write("\n\ndef _core() -> None:\n    import autoheal.labels  # noqa: F401\n")
    res = lint_imports(tmp_path)
    assert res.returncode != 0, res.stdout
    out = " ".join(res.stdout.split())  # the report wraps long lines
    assert "remediation.warmfence -> ansible_collections.autoheal.cluster.plugins.modules.fence" in out, out
    assert "ansible_collections.autoheal.cluster.plugins.module_utils.contract -> autoheal.labels" in out, out
    assert "Contracts: 4 kept, 3 broken." in out, out


def _project_imports(path: Path, root: Path = REPO) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [
            f"{path.relative_to(root)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in PACKAGES
        ]
    return found


def test_collection_imports_none_of_the_project_packages() -> None:
    files = sorted(COLLECTION.rglob("*.py"))
    assert files, f"no Python under {COLLECTION}"
    bad = [hit for f in files for hit in _project_imports(f)]
    assert not bad, "the collection runs on managed hosts without the project installed:\n" + "\n".join(bad)


def test_collection_scan_sees_a_project_import(tmp_path: Path) -> None:
    """The AST scan is not vacuous: it reports `import`, `from ... import` and lazy imports."""
    sample = tmp_path / "module.py"
    sample.write_text(
        "import os\nfrom autoheal.names import is_node_name\n\ndef f():\n    import lab.controlplane\n"
    )
    hits = _project_imports(sample, tmp_path)
    assert [h.rsplit(": ", 1)[1] for h in hits] == ["autoheal.names", "lab.controlplane"]

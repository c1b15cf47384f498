"""One definition of the names autoheal owns: the node-name grammar (autoheal/names.py) and the
labels, taints, annotations and Slurm reasons (autoheal/labels.py). The collection runs where the
autoheal package is not installed, so it carries a generated copy (module_utils/contract.py) and
the roles repeat the names as YAML defaults; these tests keep every copy in step with the core."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from autoheal import labels, names
from tests.runbook.conftest import COLLECTIONS, REPO, module_utils

COLLECTION = COLLECTIONS / "ansible_collections/autoheal/cluster"
validate = module_utils("validate")


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_contract", COLLECTIONS / "gen_contract.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_generated_contract_is_current():
    gen = generator()
    assert gen.TARGET.read_text() == gen.render(), "stale: run .venv/bin/python collections/gen_contract.py"


def test_the_generator_reports_a_stale_copy(tmp_path, monkeypatch):
    gen = generator()
    stale = tmp_path / "contract.py"
    stale.write_text(gen.render().replace("autoheal.io/quarantine", "autoheal.io/old"))
    monkeypatch.setattr(gen, "TARGET", stale)
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
    assert stale.read_text() == gen.render()


def test_the_collection_runs_the_cores_backoff_unchanged():
    """One retry backoff (autoheal/backoff.py): the collection's module_utils/backoff.py is that
    file, byte for byte, below a two-line header; and so it behaves the same."""
    gen = generator()
    copy = gen.BACKOFF_TARGET.read_text()
    assert copy.startswith(gen.BACKOFF_HEADER), copy[:300]
    core = (REPO / "autoheal" / "backoff.py").read_text()
    assert copy[len(gen.BACKOFF_HEADER) :] == core, "stale: run .venv/bin/python collections/gen_contract.py"

    import random

    from autoheal.backoff import Backoff

    theirs = module_utils("backoff").Backoff
    for jitter in (0.0, 0.5, 1.0):
        a = Backoff(0.5, 4.0, jitter=jitter, rng=random.Random(3))
        b = theirs(0.5, 4.0, jitter=jitter, rng=random.Random(3))
        assert [a.failed() for _ in range(8)] == [b.failed() for _ in range(8)]


def test_the_generator_reports_a_stale_backoff_copy(tmp_path, monkeypatch):
    gen = generator()
    stale = tmp_path / "backoff.py"
    stale.write_text(gen.render_backoff().replace("2.0 **", "3.0 **"))
    monkeypatch.setattr(gen, "BACKOFF_TARGET", stale)
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
    assert stale.read_text() == gen.render_backoff()


def test_the_copy_holds_the_core_values():
    contract = module_utils("contract")
    assert names.NODE_NAME_RE.pattern == contract.NODE_NAME_PATTERN
    assert contract.MAX_NODE_NAME == names.MAX_NODE_NAME
    for name in generator().LABEL_NAMES:
        assert getattr(contract, name) == getattr(labels, name), name


EDGE_CASES = [
    "gpu-1",
    "a",
    "a" * 63,
    "a" * 64,
    "a." * 126 + "a",
    "a." * 127,
    "gpu-1\n",
    "gpu-1.",
    ".gpu",
    "-a",
    "a-",
]


@pytest.mark.parametrize("value", EDGE_CASES)
def test_the_grammars_agree_on_edge_cases(value):
    assert validate.is_node_name(value) == names.is_node_name(value)


@given(st.text(alphabet="ab0-.\n_A[],", max_size=70))
def test_the_grammars_agree_on_any_text(value):
    assert validate.is_node_name(value) == names.is_node_name(value)


# role variable -> the autoheal.labels name it repeats
ROLE_NAMES = {
    "k8s_node_taint_key": "QUARANTINE_TAINT_KEY",
    "k8s_node_state_label": "STATE_LABEL",
    "k8s_node_opt_out_label": "OPT_OUT_LABEL",
    "k8s_node_incident_annotation": "INCIDENT_ANNOTATION",
    "node_pool_spare_reason": "SPARE_REASON",
    "node_pool_spare_label": "SPARE_LABEL",
    "node_pool_spare_taint": "SPARE_TAINT_KEY",
    "node_pool_state_label": "STATE_LABEL",
    "node_pool_pool_label": "POOL_LABEL",
    "node_pool_replaces_annotation": "REPLACES_ANNOTATION",
    "ladder_validation_annotation": "VALIDATION_ANNOTATION",
    "ladder_spare_reason": "SPARE_REASON",
    "ladder_agents_label": "GPU_AGENTS_LABEL",
    "slurm_rollout_reason": "ROLLOUT_REASON",
    "slurm_rollout_spare_reason": "SPARE_REASON",
}


def role_values() -> list[tuple[str, str, Any]]:
    """(file, variable, value) for every role default and argument-spec default."""
    out = []
    for path in sorted((REPO / "roles").glob("*/defaults/main.yml")):
        out += [
            (str(path.relative_to(REPO)), k, v) for k, v in (yaml.safe_load(path.read_text()) or {}).items()
        ]
    for path in sorted((REPO / "roles").glob("*/meta/argument_specs.yml")):
        for entry in (yaml.safe_load(path.read_text())["argument_specs"] or {}).values():
            for k, opt in (entry.get("options") or {}).items():
                if "default" in opt:
                    out.append((f"{path.relative_to(REPO)}", k, opt["default"]))
    return out


def test_role_defaults_repeat_the_core_names():
    seen = set()
    for where, var, value in role_values():
        if var in ROLE_NAMES:
            assert value == getattr(labels, ROLE_NAMES[var]), f"{where}: {var}"
            seen.add(var)
        elif isinstance(value, str):
            # a name of ours that this test does not know would escape it
            assert not value.startswith((labels.DOMAIN + "/", labels.REASON_PREFIX)), (
                f"{where}: {var}={value}"
            )
    assert seen == set(ROLE_NAMES)


def test_a_changed_core_name_fails_the_role_check(monkeypatch):
    monkeypatch.setattr(labels, "QUARANTINE_TAINT_KEY", "autoheal.io/renamed")
    with pytest.raises(AssertionError, match="k8s_node_taint_key"):
        test_role_defaults_repeat_the_core_names()


def code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a Python file's code: not the docs ansible-doc reads, not docstrings."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in ("DOCUMENTATION", "EXAMPLES", "RETURN") for t in node.targets
        ):
            skip.add(id(node.value))
        if isinstance(node, ast.ClassDef) and node.name == "ModuleDocFragment":
            skip.update(id(n) for n in ast.walk(node))
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skip.add(id(body[0].value))  # a docstring
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    ]


def test_the_collection_code_spells_no_name_of_ours_but_in_the_contract():
    found = [
        f"{path.relative_to(COLLECTION)}:{line}: {text!r}"
        for path in sorted((COLLECTION / "plugins").rglob("*.py"))
        if path.name != "contract.py"
        for line, text in code_strings(path)
        if labels.DOMAIN + "/" in text or text.startswith(labels.REASON_PREFIX)
    ]
    assert not found, "use module_utils/contract.py:\n" + "\n".join(found)


def test_plays_take_our_names_from_the_role_defaults():
    found = [
        f"{path.relative_to(REPO)}:{n}"
        for path in sorted((REPO / "playbooks").rglob("*.yml"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if labels.DOMAIN + "/" in line or labels.SPARE_REASON in line
    ]
    assert not found, found


def test_the_runbook_takes_the_cores_pool_backends():
    """The runbook's input, the role's argument and a task file per backend: the names the stack and
    the runner use (autoheal/backends.py)."""
    from autoheal.backends import POOL_BACKENDS

    inputs = yaml.safe_load((REPO / "playbooks/specs/inputs.yml").read_text())
    choices = next(spec["choices"] for spec in _specs(inputs) if spec.get("_name") == "autoheal_backend")
    assert choices == ["", *POOL_BACKENDS]
    role = yaml.safe_load((REPO / "roles/node_pool/meta/argument_specs.yml").read_text())
    opts = role["argument_specs"]["main"]["options"]
    assert opts["node_pool_backend"]["choices"] == list(POOL_BACKENDS)
    for backend in POOL_BACKENDS:
        for op in ("reboot", "retire"):
            assert (REPO / f"roles/node_pool/tasks/backends/{backend}/{op}.yml").is_file(), (backend, op)


def _specs(doc: Any) -> list[dict[str, Any]]:
    """Every option spec in a YAML document of argument specs, with its name as `_name`."""
    found: list[dict[str, Any]] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            if isinstance(value, dict) and "type" in value:
                found.append({**value, "_name": key})
            found.extend(_specs(value))
    elif isinstance(doc, list):
        for item in doc:
            found.extend(_specs(item))
    return found

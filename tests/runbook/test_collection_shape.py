"""The collection stays readable and shippable: short functions, galaxy metadata that matches the
modules, a changelog that names every module and filter, and requirements for what the roles use."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml
from packaging.version import Version

from tests.runbook.conftest import COLLECTIONS, REPO, plugin

COLLECTION = COLLECTIONS / "ansible_collections/autoheal/cluster"
PLUGINS = COLLECTION / "plugins"
MAX_FUNCTION_LINES = 60


def functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    return [
        (n.name, (n.end_lineno or n.lineno) - n.lineno + 1)
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def test_no_function_of_the_collection_is_longer_than_a_screen():
    long = [
        f"{path.relative_to(COLLECTION)}: {name} ({lines} lines)"
        for path in sorted(PLUGINS.rglob("*.py"))
        for name, lines in functions(path)
        if lines > MAX_FUNCTION_LINES
    ]
    assert not long, long


def doc(path: Path) -> dict:
    tree = ast.parse(path.read_text())
    text = next(
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.Constant)
        and getattr(n.targets[0], "id", "") == "DOCUMENTATION"
    )
    return yaml.safe_load(str(text))


def test_galaxy_version_is_the_newest_version_added_and_the_changelog_names_everything():
    galaxy = yaml.safe_load((COLLECTION / "galaxy.yml").read_text())
    modules = {p.stem: str(doc(p)["version_added"]) for p in (PLUGINS / "modules").glob("*.py")}
    filters = {
        p.stem: str(yaml.safe_load(p.read_text())["DOCUMENTATION"]["version_added"])
        for p in (PLUGINS / "filter").glob("*.yml")
    }
    assert galaxy["version"] == str(max(map(Version, [*modules.values(), *filters.values()])))
    assert "example" not in galaxy["repository"] and galaxy["repository"].startswith("https://")
    releases = yaml.safe_load((COLLECTION / "changelogs/changelog.yaml").read_text())["releases"]
    assert galaxy["version"] in releases
    listed_modules = {m["name"]: v for v, r in releases.items() for m in r.get("modules", [])}
    listed_filters = {
        f["name"]: v for v, r in releases.items() for f in r.get("plugins", {}).get("filter", [])
    }
    assert listed_modules == modules, "changelogs/changelog.yaml: modules and their release"
    assert listed_filters == filters, "changelogs/changelog.yaml: filters and their release"


def test_every_filter_is_documented():
    names = set()
    for path in (PLUGINS / "filter").glob("*.py"):
        names |= set(plugin(f"filter.{path.stem}").FilterModule().filters())
    assert names == {p.stem for p in (PLUGINS / "filter").glob("*.yml")}


def collections_used() -> set[str]:
    """Collection names of the FQCN modules and filters the plays and roles use."""
    found = set()
    for path in [*REPO.glob("playbooks/*.yml"), *REPO.glob("roles/*/tasks/**/*.yml")]:
        text = path.read_text()
        found |= set(re.findall(r"^\s+-? ?([a-z_]+\.[a-z_]+)\.[a-z_0-9]+:", text, re.M))
        found |= set(re.findall(r"\| ([a-z_]+\.[a-z_]+)\.[a-z_0-9]+", text))
    return found - {"ansible.builtin", "autoheal.cluster"}


def test_requirements_name_the_collections_the_roles_use_in_versions_the_ansible_package_has():
    import importlib.metadata

    reqs = {
        c["name"]: c["version"]
        for c in yaml.safe_load((COLLECTIONS / "requirements.yml").read_text())["collections"]
    }
    assert set(reqs) == collections_used()
    for name, spec in reqs.items():
        manifest = Path(
            str(
                importlib.metadata.distribution("ansible").locate_file(
                    f"ansible_collections/{name.replace('.', '/')}/MANIFEST.json"
                )
            )
        )
        have = Version(__import__("json").loads(manifest.read_text())["collection_info"]["version"])
        for clause in spec.split(","):
            op, ver = re.match(r"\s*([<>=!]+)\s*(\S+)", clause).groups()
            assert {
                ">=": have >= Version(ver),
                "<": have < Version(ver),
                "<=": have <= Version(ver),
                ">": have > Version(ver),
                "==": have == Version(ver),
            }[op], f"{name} {have} does not satisfy {spec}"

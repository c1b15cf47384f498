"""The Python side of the runner image: a wheelhouse for its base layer, the project for its top.

The runner image runs Debian's Python (trixie: 3.13), not the build host's, so third-party wheels
are fetched for that interpreter with `pip download --python-version` and installed inside the
image with `--no-index`. Versions are pinned to those of the environment running the build (the
one the tests pass in), so the image runs what was tested.

The project itself goes into a separate, small top layer: editing a playbook or a module rebuilds
only that layer (seconds), not the Debian base with its dependencies (minutes).
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

from autoheal.paths import data_root
from images.debian import BuildError

# Ansible collections the runbook uses (kubernetes.core's k8s modules, community.general filters).
# The `ansible` package ships them among ~90 others (~470 MB): only these two go into the image.
COLLECTIONS = ("kubernetes/core", "community/general")
# the `ansible` distribution is replaced by ansible-core plus the collections above
FULL_ANSIBLE = "ansible"
PREFIX = "/opt/autoheal"
_SKIP = ("__pycache__", ".pyc", ".mypy_cache", ".pytest_cache", ".ruff_cache")


def data_items(root: Path) -> tuple[str, ...]:
    """The data root the runner image carries: setup.py's DATA, read from the checkout, so the
    image holds exactly what a wheel user gets (it once lacked examples/ and monitoring/)."""
    tree = ast.parse((root / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "DATA" for t in node.targets
        ):
            return tuple(ast.literal_eval(node.value))
    raise BuildError(f"runner image: {root / 'setup.py'} defines no DATA (the data root to ship)")


def project_root() -> Path:
    """The checkout the runner image is built from (it must hold pyproject.toml)."""
    root = data_root()
    if not (root / "pyproject.toml").is_file():
        raise BuildError(
            f"runner image: {root} has no pyproject.toml; the runner image is built from a checkout "
            "of the project (set AUTOHEAL_DATA_ROOT to one)"
        )
    return root


def _pyproject(root: Path) -> dict[str, object]:
    with (root / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def _dist_name(req: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    if not m:
        raise BuildError(f"pyproject.toml: cannot read the requirement {req!r}")
    return re.sub(r"[-_.]+", "-", m.group(1)).lower()


def requirements(root: Path) -> list[str]:
    """The project's runtime requirements for the image, `ansible` swapped for ansible-core."""
    project = _pyproject(root)["project"]
    assert isinstance(project, dict)
    reqs = [str(r) for r in project.get("dependencies", [])]
    out = [r for r in reqs if _dist_name(r) != FULL_ANSIBLE]
    if len(out) != len(reqs):
        out.append(f"ansible-core=={metadata.version('ansible-core')}")
    return sorted(out)


def constraints() -> list[str]:
    """name==version of every distribution installed here: the image gets the tested versions."""
    pins = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and _dist_name(name) not in ("autoheal", "pip", "setuptools", "wheel"):
            pins[_dist_name(name)] = f"{_dist_name(name)}=={dist.version}"
    return sorted(pins.values())


def _pip(args: list[str], log: Path, what: str) -> None:
    with log.open("a") as out:
        out.write("$ pip " + " ".join(args) + "\n")
        out.flush()
        res = subprocess.run(
            [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=1800,
            check=False,
        )
    if res.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
        raise BuildError(f"runner image: {what} failed (pip exit {res.returncode}); see {log}: {tail}")


def wheelhouse(dest: Path, reqs: list[str], pins: list[str], python: str, log: Path) -> None:
    """Download wheels of `reqs` (pinned by `pins`) for CPython `python` on manylinux x86_64."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "requirements.txt").write_text("\n".join(reqs) + "\n")
    (dest / "constraints.txt").write_text("\n".join(pins) + "\n")
    abi = "cp" + python.replace(".", "")
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 28, 34, 39)]
    platforms += ["--platform=manylinux2014_x86_64", "--platform=linux_x86_64"]
    _pip(
        [
            "download",
            "--quiet",
            "--only-binary=:all:",
            f"--python-version={python}",
            "--implementation=cp",
            f"--abi={abi}",
            "--abi=abi3",
            "--abi=none",
            *platforms,
            "-d",
            str(dest),
            "-r",
            str(dest / "requirements.txt"),
            "-c",
            str(dest / "constraints.txt"),
        ],
        log,
        f"downloading wheels for Python {python}",
    )


def collections_version() -> str:
    return metadata.version(FULL_ANSIBLE)


def extract_collections(dest: Path, log: Path) -> None:
    """Unpack COLLECTIONS from the `ansible` wheel of the version installed here (pip's cache
    makes the download a one-off) into dest/ansible_collections/."""
    with tempfile.TemporaryDirectory() as tmp:
        _pip(
            [
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                tmp,
                f"ansible=={collections_version()}",
            ],
            log,
            "downloading the ansible wheel (for its collections)",
        )
        wheels = list(Path(tmp).glob("ansible-*.whl"))
        if not wheels:
            raise BuildError(f"runner image: pip left no ansible wheel; see {log}")
        prefixes = tuple(f"ansible_collections/{c}/" for c in COLLECTIONS)
        with zipfile.ZipFile(wheels[0]) as zf:
            for name in zf.namelist():
                if name.startswith(prefixes) and not name.endswith("/"):
                    target = dest / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(name) as src, target.open("wb") as out:
                        shutil.copyfileobj(src, out)


# --- the project layer ----------------------------------------------------------------------


def _packages(root: Path) -> list[str]:
    """Top-level packages the wheel would include ([tool.setuptools.packages.find] include)."""
    tool = _pyproject(root).get("tool", {})
    assert isinstance(tool, dict)
    patterns = tool.get("setuptools", {}).get("packages", {}).get("find", {}).get("include", [])
    return sorted(
        p.name
        for p in root.iterdir()
        if (p / "__init__.py").is_file() and any(fnmatch.fnmatch(p.name, pat) for pat in patterns)
    )


def _files(root: Path, items: list[str]) -> list[Path]:
    out: list[Path] = []
    for item in items:
        path = root / item
        if path.is_file():
            out.append(path)
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP and not d.startswith("."))
            out += [Path(dirpath) / f for f in sorted(filenames) if not f.endswith(_SKIP)]
    return out


def project_items(root: Path) -> list[str]:
    return [
        "pyproject.toml",
        "README.md",
        *_packages(root),
        *(i for i in data_items(root) if (root / i).exists()),
    ]


def project_hash(root: Path) -> str:
    """A digest of every file that goes into the project layer."""
    h = hashlib.sha256()
    for path in _files(root, project_items(root)):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _tar_add_tree(tar: tarfile.TarFile, src: Path, arcname: str) -> None:
    """Add a tree owned by root with mtime 0, in sorted order: the same files, the same tar."""

    def norm(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        return info

    paths = [src, *sorted(src.rglob("*"))]
    for path in paths:
        if any(part in _SKIP for part in path.parts) or path.name.endswith(".pyc"):
            continue
        name = arcname if path == src else f"{arcname}/{path.relative_to(src)}"
        tar.add(path, name, recursive=False, filter=norm)


def project_layer(root: Path, python: str, out_tar: Path, log: Path) -> None:
    """A tar holding the project under PREFIX: its packages in the venv's site-packages (built as
    a wheel, so entry points and metadata are real), the `autoheal` command and the data root."""
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        src = tmp / "src"
        for item in project_items(root):
            if (root / item).is_dir():
                shutil.copytree(root / item, src / item, ignore=shutil.ignore_patterns(*_SKIP, "*.pyc"))
            else:
                src.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / item, src / item)
        # built from a copy: setuptools writes build/ and *.egg-info next to its sources
        _pip(
            ["wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(tmp / "whl"), str(src)],
            log,
            "building the project wheel",
        )
        wheel = next((tmp / "whl").glob("*.whl"))
        site = tmp / "tree" / f"lib/python{python}/site-packages"
        _pip(
            ["install", "--quiet", "--no-deps", "--no-compile", "--target", str(site), str(wheel)],
            log,
            "unpacking the project wheel",
        )
        shutil.rmtree(site / "bin", ignore_errors=True)  # host-interpreter scripts: written below
        bindir = tmp / "tree" / "bin"
        bindir.mkdir()
        script = bindir / "autoheal"
        script.write_text(
            f"#!{PREFIX}/bin/python3\nimport sys\nfrom autoheal.cli import main\nsys.exit(main())\n"
        )
        script.chmod(0o755)
        share = tmp / "tree" / "share" / "autoheal"
        share.mkdir(parents=True)
        for item in data_items(root):
            if (root / item).is_dir():
                shutil.copytree(root / item, share / item, ignore=shutil.ignore_patterns(*_SKIP, "*.pyc"))
            elif (root / item).is_file():
                shutil.copy2(root / item, share / item)
        with tarfile.open(out_tar, "w", format=tarfile.PAX_FORMAT) as tar:
            for d in ("opt",):
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            _tar_add_tree(tar, tmp / "tree", PREFIX.lstrip("/"))


def tar_bytes(files: dict[str, bytes]) -> bytes:
    """A small tar of in-memory files (mode 0644, root, mtime 0)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()

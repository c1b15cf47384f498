"""Root filesystems from Debian packages, with mmdebstrap: no registry, no base image to pull.

mmdebstrap builds a Debian tree from the archive alone and writes it as a tar, which is already
an OCI layer. Downloaded .deb files are kept in a cache shared by every build of one suite (the
sync-in/sync-out recipe of mmdebstrap's manual), so rebuilding an image after an input changed
downloads nothing again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from autoheal.errors import ConfigError

MIRROR_ENV = "AUTOHEAL_DEBIAN_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
# documentation and translations are dead weight in a container; license files stay
SLIM = (
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/info/*",
)


class BuildError(ConfigError):
    """An image failed to build; the message names the image, the step and the log file."""


def mirror() -> str:
    """The Debian mirror: $AUTOHEAL_DEBIAN_MIRROR, else the host's own (deb822 sources), else
    deb.debian.org. Using the host's mirror keeps a machine behind a local mirror working."""
    if env := os.environ.get(MIRROR_ENV):
        return env.rstrip("/")
    try:
        text = _SOURCES.read_text()
    except OSError:
        return DEFAULT_MIRROR
    for m in re.finditer(r"^URIs:\s*(\S+)", text, re.MULTILINE):
        if m.group(1).rstrip("/").endswith("/debian"):
            return m.group(1).rstrip("/")
    return DEFAULT_MIRROR


def check_tools() -> None:
    if shutil.which("mmdebstrap") is None:
        raise BuildError(
            "images: mmdebstrap is not installed; run scripts/bootstrap.sh (apt-get install mmdebstrap)"
        )


def mmdebstrap(
    suite: str,
    packages: Sequence[str],
    out_tar: Path,
    deb_cache: Path,
    log: Path,
    *,
    variant: str = "essential",
    hooks: Sequence[str] = (),
    slim: bool = True,
    timeout: float = 1800,
    apt_options: Sequence[str] = (),
) -> None:
    """Build a `suite` root filesystem holding `packages` into `out_tar` (a tar, uncompressed).

    `hooks` are shell commands run after the packages are installed, with the tree's path as $1
    (mmdebstrap's --customize-hook); they run as root on the host, so they may chroot into it.
    `apt_options` are apt settings, e.g. `Acquire::Check-Valid-Until "false"` for a mirror whose
    testing Release is past its Valid-Until (forky's was, by 28 days, on 2026-12-04).
    """
    check_tools()
    deb_cache.mkdir(parents=True, exist_ok=True)
    argv = [
        "mmdebstrap",
        f"--variant={variant}",
        "--mode=root",
        "--format=tar",
        "--skip=essential/unlink",
        # hard links: the cache and the build tree share a filesystem in the usual set-up
        f'--setup-hook=mkdir -p "$1"/var/cache/apt/archives && '
        f'(cp -al {deb_cache}/. "$1"/var/cache/apt/archives/ 2>/dev/null'
        f' || cp -a {deb_cache}/. "$1"/var/cache/apt/archives/)',
    ]
    argv += [f"--aptopt={o}" for o in apt_options]
    if packages:
        argv.append("--include=" + ",".join(packages))
    if slim and variant != "extract":
        argv += SLIM
    if variant != "extract":
        argv.append(
            f'--customize-hook=cp -aln "$1"/var/cache/apt/archives/*.deb {deb_cache}/ 2>/dev/null || true'
        )
    # the extract variant runs no customize hooks: its tree is done once the packages are unpacked
    stage = "extract" if variant == "extract" else "customize"
    argv += [f"--{stage}-hook={h}" for h in hooks]
    argv += [suite, str(out_tar), f"deb {mirror()} {suite} main"]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        try:
            res = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise BuildError(f"mmdebstrap {suite}: no result after {timeout:.0f}s; see {log}") from exc
    if res.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-6:])
        raise BuildError(
            f"mmdebstrap {suite} ({', '.join(packages)}): exit {res.returncode}; see {log}: {tail}"
        )

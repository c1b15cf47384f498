"""Push built images to a user's registry with skopeo (Debian's package), digests unchanged.

skopeo copies an OCI layout to a registry blob by blob, so the manifest digest a pod references
here is the digest the registry serves: `autoheal images build --push REGISTRY` is how a user gets
the lab's exact images into their cluster.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from images.build import BuiltImage
from images.debian import BuildError

_REGISTRY = re.compile(r"^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*$")


def destination(registry: str, img: BuiltImage) -> str:
    """`REGISTRY/autoheal-<name>:<tag>`; REGISTRY may carry a path (`host:5000/team`)."""
    if not _REGISTRY.match(registry):
        raise BuildError(
            f"--push: {registry!r} is not a registry: host[:port][/path], e.g. registry.example.com:5000/team"
        )
    return f"{registry}/autoheal-{img.name}:{img.tag}"


def push(img: BuiltImage, registry: str, tls_verify: bool = True, timeout: float = 1800) -> str:
    """Copy `img` to `registry`; returns the pushed reference by digest."""
    if shutil.which("skopeo") is None:
        raise BuildError("--push: skopeo is not installed; apt-get install skopeo")
    dest = destination(registry, img)
    argv = [
        "skopeo",
        "copy",
        "--quiet",
        "--preserve-digests",  # fail rather than push an image whose digest would change
        f"--dest-tls-verify={'true' if tls_verify else 'false'}",
        f"oci:{img.layout}:{img.tag}",
        f"docker://{dest}",
    ]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if res.returncode != 0:
        raise BuildError(
            f"--push {img.name} to {dest}: skopeo exit {res.returncode}: {res.stderr.strip()[-500:]}"
        )
    return f"{dest.rsplit(':', 1)[0]}@{img.digest}"

"""Images: OCI layouts that verify, content-addressed (same input, same digest), cached (a second
build does nothing), and pushed to a registry with their digests unchanged."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import httpx
import pytest

from autoheal import __version__
from images import oci
from images.build import build
from images.debian import BuildError
from images.push import destination, push
from tests.support import free_port, wait_for


def _tar(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_layout_is_content_addressed_and_verifies(tmp_path: Path) -> None:
    rootfs = _tar(tmp_path / "l.tar", {"etc/hello": b"hi\n"})
    digests = []
    for n in (1, 2):
        layout = tmp_path / f"layout{n}"
        layer = oci.add_layer(layout, rootfs)
        man = oci.write_image(
            layout, [layer], oci.RuntimeConfig(cmd=["/bin/true"]), "localhost/autoheal/t", "x"
        )
        oci.verify(layout)
        digests.append(man.digest)
    assert digests[0] == digests[1]  # no timestamps anywhere: the same input, the same image
    _, manifest = oci.read_manifest(tmp_path / "layout1")
    index = json.loads((tmp_path / "layout1" / "index.json").read_text())
    assert index["manifests"][0]["annotations"][oci.CONTAINERD_NAME] == "localhost/autoheal/t:x"
    blob = oci.blob_path(tmp_path / "layout1", manifest["layers"][0]["digest"])
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # corrupt the layer: verify must notice
    blob.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"does not match its digest"):
        oci.verify(tmp_path / "layout1")


def test_a_registry_name_is_checked() -> None:
    img = (
        build(["pause"])[0] if shutil.which("mmdebstrap") else pytest.skip("IMAGES NOT BUILT: no mmdebstrap")
    )
    assert destination("registry.example.com:5000/team", img).startswith(
        "registry.example.com:5000/team/autoheal-pause:"
    )
    with pytest.raises(BuildError, match="not a registry"):
        destination("https://registry.example.com", img)


def test_images_build_once_then_come_from_the_cache() -> None:
    if shutil.which("mmdebstrap") is None:
        pytest.skip("IMAGES NOT BUILT: mmdebstrap is not installed (scripts/bootstrap.sh installs it)")
    first = {i.name: i for i in build()}
    t0 = time.monotonic()
    again = {i.name: i for i in build()}
    took = time.monotonic() - t0
    assert all(i.cached for i in again.values()) and took < 10, took
    assert {n: i.digest for n, i in again.items()} == {n: i.digest for n, i in first.items()}
    for img in again.values():
        oci.verify(Path(img.layout))
        assert img.ref == f"localhost/autoheal/{img.name}@{img.digest}"
        # issue 19: the image says which release built it, in its tag and in its manifest
        assert img.tag == f"{__version__}-{img.key[:12]}", img.tag
        index = json.loads((Path(img.layout) / "index.json").read_text())
        manifest_blob = index["manifests"][0]["digest"].split(":", 1)[1]
        manifest = json.loads((Path(img.layout) / "blobs" / "sha256" / manifest_blob).read_text())
        assert manifest["annotations"]["org.opencontainers.image.version"] == __version__
    sizes = {n: round(i.size / 1e6, 1) for n, i in again.items()}
    print(f"\n[images] sizes (MB, compressed): {sizes}; cached build of all three: {took:.1f}s")


def test_push_copies_an_image_to_a_registry_with_its_digest(tmp_path: Path) -> None:
    for tool in ("skopeo", "docker-registry", "mmdebstrap"):
        if shutil.which(tool) is None:
            pytest.skip(f"PUSH NOT TESTED: {tool} is not installed (scripts/bootstrap.sh installs it)")
    img = build(["pause"])[0]
    port = free_port()  # a fixed port may be held by anything on a shared CI machine
    config = tmp_path / "registry.yml"
    config.write_text(
        "version: 0.1\nlog: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {tmp_path / 'store'}}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
    )
    log = tmp_path / "registry.log"
    with log.open("wb") as out:
        reg = subprocess.Popen(
            ["docker-registry", "serve", str(config)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            # A registry that exited (port taken, bad config) fails at once with its own words.
            assert reg.poll() is None, f"docker-registry exited {reg.returncode}: {log.read_text()[-800:]}"
            try:
                return httpx.get(f"{base}/v2/", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, 60, "the registry")
        pushed = push(img, f"127.0.0.1:{port}/team", tls_verify=False)
        assert pushed == f"127.0.0.1:{port}/team/autoheal-pause@{img.digest}"
        r = httpx.get(
            f"{base}/v2/team/autoheal-pause/manifests/{img.tag}",
            headers={"Accept": oci.MANIFEST},
            timeout=5,
        )
        assert r.status_code == 200 and r.headers["Docker-Content-Digest"] == img.digest
    finally:
        reg.terminate()
        reg.wait(timeout=10)

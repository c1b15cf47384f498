"""One lab for this folder's tests: started once, always torn down (when the last of them ends, so it
never idles under the other folders' tests), in a temporary root."""

from __future__ import annotations

import pytest

from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from lab.sink import WebhookSink
from tests.support import lab_slurm, port_base

PORT_BASE = port_base(27000)


@pytest.fixture(scope="package")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("labs")
    cfg = LabConfig(
        name="itest",
        root=root,
        port_base=PORT_BASE,
        pools=[PoolConfig(size=4, spares=2, headroom=2)],
        webhook_url=f"http://127.0.0.1:{PORT_BASE + 6}/webhook",
        kube=False,
        runner=False,
        grace_seconds=30,
        provision_delay=1,
    )
    try:
        labmod.up(cfg)
        yield cfg
    finally:
        labmod.down(cfg)


@pytest.fixture(scope="package")
def sink(lab):
    token = (lab.run_dir / "runner.token").read_text().strip()
    s = WebhookSink(lab.port("sink"), token).start()
    yield s
    s.stop()


@pytest.fixture
def slurm(lab):
    def run(*argv: str, check: bool = True) -> str:
        return lab_slurm(lab, *argv, check=check)

    return run

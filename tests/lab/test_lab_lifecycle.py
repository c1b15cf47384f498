"""Lab up/down behave: no second copy, no-op down, clean failure with nothing left behind."""

import socket

import pytest

from autoheal.errors import LabError
from lab import lab as labmod
from lab import procs
from lab.config import LabConfig, PoolConfig
from tests.support import pid_alive, port_base

pytestmark = pytest.mark.lab


def small(tmp_path, name, port_base):
    return LabConfig(
        name=name,
        root=tmp_path,
        port_base=port_base,
        pools=[PoolConfig(size=1, spares=0, headroom=0)],
        kube=False,
        runner=False,
    )


def test_up_twice_starts_no_second_copy_and_down_leaves_nothing(tmp_path):
    cfg = small(tmp_path, "twice", port_base(27300))
    try:
        labmod.up(cfg)
        first = {n: p.pid for n, p in procs.running(cfg.run_dir).items()}
        assert set(first) >= {
            "munged",
            "slurmctld",
            "slurmd-gpu-1",
            "prometheus",
            "alertmanager",
            "simulator",
        }
        assert labmod.status(cfg).healthy
        labmod.up(cfg)
        assert {n: p.pid for n, p in procs.running(cfg.run_dir).items()} == first
    finally:
        labmod.down(cfg)
    assert procs.running(cfg.run_dir) == {}
    for pid in first.values():
        assert not pid_alive(pid)


def test_down_on_nothing_is_a_noop(tmp_path):
    assert labmod.down(small(tmp_path, "never", port_base(27350))) == []


def test_port_in_use_fails_clearly_and_tears_down_what_started(tmp_path):
    cfg = small(tmp_path, "busy", port_base(27400))
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", cfg.port("prometheus")))
    blocker.listen()
    try:
        with pytest.raises(LabError, match=rf"prometheus: port {cfg.port('prometheus')} is in use"):
            labmod.up(cfg)
        assert procs.running(cfg.run_dir) == {}
    finally:
        blocker.close()


def test_daemon_dying_at_start_names_service_and_log(tmp_path, monkeypatch):
    cfg = small(tmp_path, "dies", port_base(27450))
    monkeypatch.setattr("lab.prom.ALERTMANAGER", "false")  # exits 1 at once
    with pytest.raises(LabError, match=r"alertmanager: exited during start; see .*alertmanager\.log"):
        labmod.up(cfg)
    assert procs.running(cfg.run_dir) == {}

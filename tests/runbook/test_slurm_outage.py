"""slurmctld unreachable during a step (issue 17, Deliver 3): the Slurm modules wait for it with a
growing pause (controller_wait) instead of failing the step at once, and fail, naming the option,
when it stays away longer. Real slurmctld of the runbook lab, stopped and started again."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from lab import procs, slurm
from lab.config import LabConfig, load_lab
from tests.runbook.conftest import LAB_NAME, run_module

pytestmark = pytest.mark.timeout(300)


def _cfg(lab: Any) -> LabConfig:
    cfg = load_lab(LAB_NAME, lab.root)
    assert cfg is not None, f"the runbook lab is not up under {lab.root}"
    return cfg


def _restart_later(lab: Any, after: float) -> threading.Thread:
    cfg = _cfg(lab)

    def restart() -> None:
        time.sleep(after)
        slurm.start_slurmctld(cfg)

    t = threading.Thread(target=restart, daemon=True)
    t.start()
    return t


def _ensure_up(lab: Any) -> None:
    if not procs.read_proc(lab.run_dir, "slurmctld") or "UP" not in lab.slurm(
        "scontrol", "ping", check=False
    ):
        slurm.start_slurmctld(_cfg(lab))
    slurm.wait_nodes_registered(_cfg(lab), ["gpu-1"])


def test_a_slurmctld_restart_during_a_step_delays_the_step_and_it_completes(lab):
    args = {"nodes": ["gpu-1"], "slurm_conf": str(lab.slurm_conf)}
    assert procs.stop(lab.run_dir, "slurmctld")
    try:
        # the client itself tries for ~9 s before "Unable to contact": come back after that, so
        # the module's own retry is what carries the step over
        restarter = _restart_later(lab, 12.0)
        t0 = time.monotonic()
        res = run_module("slurm_node_info", args)
        took = time.monotonic() - t0
        restarter.join(60)
    finally:
        _ensure_up(lab)
    assert not res["failed"], res
    assert "gpu-1" in res["nodes"] and res["missing_nodes"] == []
    assert took >= 12.0, f"answered in {took:.1f}s: slurmctld was down, the module must have waited"


def test_slurmctld_away_longer_than_controller_wait_fails_the_step_naming_the_option(lab):
    args = {"nodes": ["gpu-1"], "slurm_conf": str(lab.slurm_conf), "controller_wait": 1}
    assert procs.stop(lab.run_dir, "slurmctld")
    try:
        res = run_module("slurm_node_info", args)
    finally:
        _ensure_up(lab)
    assert res["failed"], res
    assert "Unable to contact slurm controller" in res["msg"] and "controller_wait" in res["msg"], res["msg"]
    # and with the controller back, the same call works (nothing left behind)
    assert not run_module("slurm_node_info", args)["failed"]

"""The example training job runs on two lab nodes, checkpoints on SIGTERM and resumes when requeued."""

import json
import re
import sys
import time
from pathlib import Path

import pytest

from tests.support import wait_for

pytestmark = pytest.mark.lab
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def progress(ckpt):
    p = ckpt / "progress.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def test_two_rank_job_checkpoints_on_requeue_and_resumes_from_that_step(slurm, tmp_path, monkeypatch):
    ckpt, out = tmp_path / "ckpt", tmp_path / "train.out"
    monkeypatch.setenv("CKPT_DIR", str(ckpt))
    monkeypatch.setenv("PYTHON", sys.executable)
    monkeypatch.setenv("AUTOHEAL_EXAMPLES", str(EXAMPLES))
    monkeypatch.setenv("TRAIN_ARGS", "--step-time 0.05 --ckpt-every 1000")
    job = slurm("sbatch", "--parsable", "-o", str(out), str(EXAMPLES / "train.sbatch")).strip()
    try:
        wait_for(
            lambda: any(e["event"] == "step" and e["step"] >= 30 for e in progress(ckpt)),
            120,
            "training progress",
            0.5,
        )
        slurm("scontrol", "requeue", job)
        saved = wait_for(
            lambda: next((e["step"] for e in progress(ckpt) if e.get("reason") == "sigterm"), None),
            60,
            "SIGTERM checkpoint",
        )
        assert saved >= 30
        wait_for(lambda: "resumed from step" in out.read_text(), 120, "resume", 0.5)
        m = re.search(r"resumed from step (\d+) \(restart (\d+)\)", out.read_text())
        assert m and int(m.group(1)) == saved and int(m.group(2)) >= 1
        starts = wait_for(
            lambda: (
                [e["step"] for e in progress(ckpt) if e["event"] == "start"][1:]
                and [e["step"] for e in progress(ckpt) if e["event"] == "start"]
            ),
            10,
            "start record",
        )
        assert starts == [0, saved]
    finally:
        slurm("scancel", job, check=False)
        time.sleep(0.5)

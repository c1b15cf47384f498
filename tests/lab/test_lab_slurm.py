"""The lab's Slurm is real: jobs with GPUs run, drain/resume show in sinfo --json, requeue works."""

import json
import re
import textwrap

import pytest

from tests.support import wait_for

pytestmark = pytest.mark.lab


def job_state(slurm, job_id):
    out = slurm("scontrol", "show", "job", job_id, "-o", check=False)
    m = re.search(r"JobState=(\S+)", out)
    return m.group(1) if m else "GONE"


def sinfo_node(slurm, node):
    data = json.loads(slurm("sinfo", "--json"))
    n = next(n for n in data["nodes"] if n["name"] == node)
    return (
        n["state"].upper() if isinstance(n["state"], str) else n["state"],
        n.get("state_flags", []),
        n.get("reason", ""),
    )


def test_two_node_job_with_eight_gpus_each_runs(slurm, tmp_path):
    out = tmp_path / "job.out"
    job = slurm(
        "sbatch",
        "--parsable",
        "-N2",
        "--gres=gpu:8",
        "-o",
        str(out),
        "--wrap",
        "srun bash -c 'echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES'",
    ).strip()
    wait_for(lambda: job_state(slurm, job) in ("COMPLETED", "GONE"), 60, "job to complete")
    lines = sorted(out.read_text().split("\n")[:-1])
    assert len(lines) == 2
    assert all(line.endswith(" 0,1,2,3,4,5,6,7") for line in lines)
    assert len({line.split()[0] for line in lines}) == 2


def test_spares_start_drained_with_our_reason(slurm):
    _, flags, reason = sinfo_node(slurm, "gpu-5")
    assert "DRAIN" in flags and reason == "autoheal: hot spare"


def test_drain_and_resume_are_visible_through_sinfo_json(slurm):
    slurm("scontrol", "update", "nodename=gpu-4", "state=drain", "reason=itest drain")
    state, flags, reason = sinfo_node(slurm, "gpu-4")
    assert "DRAIN" in flags and reason == "itest drain"
    slurm("scontrol", "update", "nodename=gpu-4", "state=resume")
    state, flags, reason = sinfo_node(slurm, "gpu-4")
    assert "DRAIN" not in flags and state == "IDLE"


CHECKPOINTING_JOB = textwrap.dedent("""\
    #!/bin/bash
    #SBATCH --requeue
    #SBATCH --open-mode=append
    ckpt={ckpt}
    step=0
    if [[ -f $ckpt ]]; then step=$(cat $ckpt); echo "resumed from step $step restart=${{SLURM_RESTART_COUNT:-0}}"; fi
    trap 'echo $step > $ckpt.tmp && mv $ckpt.tmp $ckpt; echo "checkpoint at step $step"; exit 0' TERM
    while true; do step=$((step+1)); echo "step $step" > {progress}; sleep 0.2 & wait $!; done
""")


def test_requeued_job_checkpoints_on_sigterm_and_resumes(slurm, tmp_path):
    ckpt, progress, out = tmp_path / "ckpt", tmp_path / "progress", tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text(CHECKPOINTING_JOB.format(ckpt=ckpt, progress=progress))
    job = slurm("sbatch", "--parsable", "-N1", "-o", str(out), str(script)).strip()
    wait_for(lambda: progress.exists() and int(progress.read_text().split()[1]) >= 5, 60, "progress")
    slurm("scontrol", "requeue", job)
    saved = int(wait_for(lambda: ckpt.exists() and ckpt.read_text().strip(), 30, "checkpoint"))
    assert saved >= 5
    wait_for(lambda: "resumed from step" in out.read_text(), 90, "resume after requeue", interval=0.5)
    m = re.search(r"resumed from step (\d+) restart=(\d+)", out.read_text())
    assert m and int(m.group(1)) == saved and int(m.group(2)) >= 1
    slurm("scancel", job)

"""Lab up/down behave: no second copy, no-op down, clean failure with nothing left behind."""

import socket

import pytest

from autoheal.errors import LabError
from lab import lab as labmod
from lab import procs, slurm
from lab.config import LabConfig, PoolConfig
from tests.support import pid_alive, port_base, processes_pointing_into, wait_for

pytestmark = pytest.mark.lab


def small(tmp_path, name, port_base, size=1):
    return LabConfig(
        name=name,
        root=tmp_path,
        port_base=port_base,
        pools=[PoolConfig(size=size, spares=0, headroom=0)],
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
    done = labmod.down(small(tmp_path, "never", port_base(27350)))
    assert (done.services, done.jobs, done.job_processes) == ([], [], 0)


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


def _keep_a_job_running(cfg):
    """A two-node job whose step loops forever, as `lab demo --keep` leaves its training job:
    a batch script, srun, and one slurmstepd + task per node."""
    workdir = cfg.run_dir / "job"
    workdir.mkdir()
    # each task names its own node (escaped: the batch script must not expand it for them)
    loop = 'srun bash -c "while true; do date > step-\\$SLURMD_NODENAME; sleep 1; done"'
    job = slurm.run(
        cfg, ["sbatch", "--parsable", "-N", "2", "-D", str(workdir), "-o", "out.txt", "--wrap", loop]
    ).strip()
    wait_for(lambda: len(list(workdir.glob("step-*"))) == 2, 60, f"job {job} running on both nodes")
    steps = [c for c in processes_pointing_into(cfg.run_dir).values() if c.startswith("slurmstepd:")]
    assert len(steps) == 3, steps  # [job.batch] and [job.0] on each node, detached from slurmd
    return job


def test_down_ends_the_jobs_the_lab_ran_and_nothing_of_another_lab(tmp_path):
    """Issue 20: `lab down` after `lab demo --keep` left the job's slurmstepd and tasks running."""
    mine = small(tmp_path, "jobs-mine", port_base(27500), size=2)
    other = small(tmp_path, "jobs-other", port_base(27550), size=2)
    try:
        labmod.up(mine)
        labmod.up(other)
        job = _keep_a_job_running(mine)
        _keep_a_job_running(other)
        # the other job's loop starts a `sleep 1` (and a `date`) every second: only what lives on counts
        others = {
            pid
            for pid, cmd in processes_pointing_into(other.run_dir, other.socket_dir).items()
            if not cmd.startswith(("sleep ", "date"))
        }
        done = labmod.down(mine)
        assert done.jobs == [job]
        assert done.job_processes >= 5, done  # 3 slurmstepd, the batch script, srun, 2 tasks
        assert "cancelled 1 job, ended " in done.summary()
        left = processes_pointing_into(mine.run_dir, mine.socket_dir)
        assert left == {}, left
        assert set(processes_pointing_into(other.run_dir, other.socket_dir)) >= others
    finally:
        labmod.down(mine)
        labmod.down(other)
    assert processes_pointing_into(other.run_dir, other.socket_dir) == {}


def test_down_ends_job_processes_even_when_slurmctld_is_gone(tmp_path):
    """The sweep needs no controller: the job's processes are found by the lab's slurm.conf."""
    cfg = small(tmp_path, "orphans", port_base(27600), size=2)
    try:
        labmod.up(cfg)
        _keep_a_job_running(cfg)
        assert procs.stop(cfg.run_dir, "slurmctld")
        done = labmod.down(cfg)
        assert done.jobs == []  # nothing could be cancelled...
        assert done.job_processes >= 5 and done.killed >= 3, done  # ...slurmstepd needed SIGKILL
        assert processes_pointing_into(cfg.run_dir, cfg.socket_dir) == {}
    finally:
        labmod.down(cfg)

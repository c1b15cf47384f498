import dataclasses

from autoheal.labels import SPARE_REASON
from autoheal.slurmconf import (
    SlurmConfSpec,
    SlurmPool,
    range_names,
    render_cgroup_conf,
    render_gres_conf,
    render_slurm_conf,
)


def spec(port_base=None):
    pools = [
        SlurmPool("h100", "gpu", size=2, spares=1, headroom=1),
        SlurmPool("a100", "agpu", size=1, gpus_per_node=4, gpu_type="a100"),
    ]
    return SlurmConfSpec("c", "ctl", 6817, pools, "/s", "/sp", "/l", "/r", slurmd_port_base=port_base)


def node_line(conf, node):
    """The NodeName line whose hostlist run covers `node`."""
    return next(
        line
        for line in conf.splitlines()
        if line.startswith("NodeName=") and node in range_names(line.split()[0].removeprefix("NodeName="))
    )


def test_pool_nodes_are_active_then_spares_then_future():
    p = SlurmPool("h100", "gpu", size=2, spares=1, headroom=1)
    assert (p.active_nodes(), p.spare_nodes(), p.future_nodes()) == (
        ["gpu-1", "gpu-2"],
        ["gpu-3"],
        ["gpu-4"],
    )


def test_runs_of_nodes_are_one_line_each_so_every_slurm_command_parses_little():
    big = SlurmConfSpec(
        "c", "ctl", 6817, [SlurmPool("h100", "gpu", size=1990, spares=10)], "/s", "/sp", "/l", "/r"
    )
    conf = render_slurm_conf(big)
    assert [line.split()[0] for line in conf.splitlines() if line.startswith("NodeName=")] == [
        "NodeName=gpu-[1-1990]",
        "NodeName=gpu-[1991-2000]",
    ]
    assert len(conf) < 4000
    assert range_names("gpu-[3-5]") == ["gpu-3", "gpu-4", "gpu-5"] and range_names("a-1") == ["a-1"]


def test_spares_are_drained_with_our_reason_and_headroom_is_future():
    conf = render_slurm_conf(spec())
    assert f'State=DRAIN Reason="{SPARE_REASON}"' in node_line(conf, "gpu-3")
    assert "State=FUTURE" in node_line(conf, "gpu-4")
    assert "State=" not in node_line(conf, "gpu-1")


def test_gres_and_partition_per_pool():
    conf = render_slurm_conf(spec())
    assert "Gres=gpu:a100:4" in node_line(conf, "agpu-1")
    assert "PartitionName=a100 Nodes=agpu-1 " in conf
    assert "PartitionName=h100 Nodes=gpu-[1-4] " in conf
    assert "PartitionName=batch Nodes=gpu-[1-4],agpu-1 " in conf
    gres = render_gres_conf(spec())
    assert "NodeName=agpu-1 Name=gpu Type=a100 File=/dev/nvidia[0-3]" in gres


def test_lab_gets_one_port_per_node_kubernetes_gets_one_slurmd_port():
    lab = render_slurm_conf(spec(port_base=9000))
    assert "NodeName=gpu-[1-2] " in lab and "Port=9000-9001" in node_line(lab, "gpu-2")
    assert "Port=9002 " in node_line(lab, "gpu-3") and "Port=9004 " in node_line(lab, "agpu-1")
    assert "SlurmdPort" not in lab
    k8s = render_slurm_conf(spec())
    assert "SlurmdPort=6818" in k8s and "Port=" not in node_line(k8s, "gpu-2")


def test_only_a_cgroup_cluster_tracks_and_confines_jobs_by_cgroup():
    host = render_slurm_conf(spec()).splitlines()
    assert "TaskPlugin=task/none" in host and "ProctrackType=proctrack/linuxproc" in host
    pods = render_slurm_conf(dataclasses.replace(spec(), cgroups=True)).splitlines()
    assert "TaskPlugin=task/cgroup" in pods and "ProctrackType=proctrack/cgroup" in pods
    assert "ConstrainDevices=yes" in render_cgroup_conf().splitlines()

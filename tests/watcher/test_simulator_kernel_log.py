"""The simulator's kernel logs and vanishing GPUs (lab.simulator, lab.kernlog): what the lab's
watchers and the lost-GPU rule are tested against."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from autoheal.kmsg import parse_record
from autoheal.xid_messages import FallenOffBus, GpuAnnounce, XidLine, parse_message
from lab.kernlog import bus_id, gpu_uuid
from lab.simulator import Fleet
from watcher.gpus import parse_smi_csv


def series(fleet: Fleet) -> dict[tuple[str, str], dict[str, str]]:
    reg = CollectorRegistry()
    reg.register(fleet)
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    return {(s.labels["Hostname"], s.labels["gpu"]): s.labels for s in fams["DCGM_FI_DEV_XID_ERRORS"].samples}


def events(path) -> list:
    out = []
    for line in path.read_text().splitlines():
        rec = parse_record(line)
        assert rec is not None, line
        out += parse_message(rec.message)
    return out


def test_each_node_boots_a_kernel_log_and_an_nvidia_smi_view(tmp_path):
    f = Fleet(8, kmsg_dir=tmp_path)
    f.set_nodes({"gpu-1": "NVIDIA H100 80GB HBM3"})
    ev = events(tmp_path / "gpu-1" / "kmsg")
    assert ev == [GpuAnnounce(bus_id(g), gpu_uuid("gpu-1", g)) for g in range(8)]
    gpus = parse_smi_csv((tmp_path / "gpu-1" / "gpus.csv").read_text())
    assert [gpus[bus_id(g)].index for g in range(8)] == list(range(8))
    assert gpus[bus_id(3)].uuid == gpu_uuid("gpu-1", 3) == series(f)[("gpu-1", "3")]["UUID"]
    assert gpus[bus_id(3)].name == "NVIDIA H100 80GB HBM3"


def test_inject_prints_the_driver_lines_and_vanish_drops_the_series(tmp_path):
    f = Fleet(8, tmp_path / "state.json", kmsg_dir=tmp_path / "k")
    f.set_nodes({"gpu-1": "m", "gpu-2": "m"})
    f.inject("gpu-2", 3, 79, vanish=True)
    [xid, fallen] = events(tmp_path / "k" / "gpu-2" / "kmsg")[8:]
    assert isinstance(xid, XidLine) and (xid.bus_id, xid.xid) == (bus_id(3), 79)
    assert fallen == FallenOffBus(bus_id(3))
    s = series(f)
    assert ("gpu-2", "3") not in s and ("gpu-2", "2") in s and len(s) == 15
    # the state survives a restart, and the kernel log continues its sequence
    again = Fleet(8, tmp_path / "state.json", kmsg_dir=tmp_path / "k")
    again.set_nodes(again.nodes)
    again.inject("gpu-2", 1, 48)
    seqs = [parse_record(x).seq for x in (tmp_path / "k" / "gpu-2" / "kmsg").read_text().splitlines()]
    assert seqs == list(range(len(seqs)))
    assert ("gpu-2", "3") not in series(again)
    again.clear("gpu-2", None)
    assert ("gpu-2", "3") in series(again)


def test_uuids_do_not_change_when_another_node_leaves(tmp_path):
    """The lost-GPU rule watches series identities: a retirement must not rename other GPUs."""
    f = Fleet(2)
    f.set_nodes({"gpu-1": "m", "gpu-2": "m", "gpu-3": "m"})
    before = series(f)
    f.set_nodes({"gpu-1": "m", "gpu-3": "m"})
    after = series(f)
    assert all(after[k] == before[k] for k in after)

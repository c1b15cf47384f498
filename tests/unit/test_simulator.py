from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lab.simulator import Fleet


def samples(fleet, metric):
    reg = CollectorRegistry()
    reg.register(fleet)
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    return fams[metric].samples


def test_exposes_dcgm_names_and_labels_per_node_and_gpu():
    f = Fleet(8)
    f.set_nodes({"gpu-1": "NVIDIA H100 80GB HBM3", "gpu-2": "NVIDIA H100 80GB HBM3"})
    s = samples(f, "DCGM_FI_DEV_XID_ERRORS")
    assert len(s) == 16
    assert set(s[0].labels) == {"gpu", "UUID", "device", "modelName", "Hostname"}
    assert all(x.value == 0 for x in s)


def test_inject_sets_only_that_gpu_and_clear_resets_it(tmp_path):
    f = Fleet(8, tmp_path / "state.json")
    f.set_nodes({"gpu-1": "m", "gpu-2": "m"})
    f.inject("gpu-2", 3, 79)
    hot = [
        (x.labels["Hostname"], x.labels["gpu"]) for x in samples(f, "DCGM_FI_DEV_XID_ERRORS") if x.value == 79
    ]
    assert hot == [("gpu-2", "3")]
    util = {(x.labels["Hostname"], x.labels["gpu"]): x.value for x in samples(f, "DCGM_FI_DEV_GPU_UTIL")}
    assert util[("gpu-2", "3")] == 0 and util[("gpu-2", "2")] > 0
    # state survives a restart of the simulator
    assert Fleet(8, tmp_path / "state.json").xids == {("gpu-2", 3): 79}
    f.clear("gpu-2", None)
    assert all(x.value == 0 for x in samples(f, "DCGM_FI_DEV_XID_ERRORS"))

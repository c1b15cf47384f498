"""GpuNodePool: pools are declared (a description the pool controller reads), nodes never are."""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.common import SPARE_TAINT, Taint
from components.nodepool import GpuNodePool, GpuNodePoolArgs
from tests.components.harness import Recorded, run_program


def _pool(lab: Recorded) -> dict[str, Any]:
    cm = lab.one("kubernetes:core/v1:ConfigMap", "autoheal-pool-h100")
    pool: dict[str, Any] = json.loads(cm.inputs["data"]["pool.json"])
    return pool


def test_lab_pool_describes_size_spares_and_gpu(lab):
    pool = _pool(lab)
    assert (pool["size"], pool["spares"], pool["desiredNodes"]) == (4, 2, 6)
    assert (pool["gpuModel"], pool["gpusPerNode"], pool["prefix"]) == ("h100", 8, "gpu")
    assert pool["nodeNames"] == {
        "active": ["gpu-1", "gpu-2", "gpu-3", "gpu-4"],
        "spares": ["gpu-5", "gpu-6"],
        "future": [f"gpu-{i}" for i in range(7, 13)],
    }


def test_pool_labels_taints_and_spare_marking(lab):
    pool = _pool(lab)
    assert pool["nodeLabels"] == {
        "autoheal.io/gpu-model": "h100",
        "autoheal.io/pool": "h100",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    }
    assert pool["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert pool["spare"] == {
        "label": {"key": "autoheal.io/spare", "value": "true"},
        "taint": {"key": "autoheal.io/spare", "value": "true", "effect": "NoSchedule"},
    }
    assert pool["remediation"] == {"enabled": True, "waiver": None}


def test_pool_config_map_is_findable_by_label_in_the_autoheal_namespace(lab):
    cm = lab.one("kubernetes:core/v1:ConfigMap", "autoheal-pool-h100")
    meta = cm.inputs["metadata"]
    assert meta["namespace"] == "autoheal"
    assert meta["labels"]["app.kubernetes.io/component"] == "node-pool"
    assert meta["labels"]["autoheal.io/pool"] == "h100"
    assert meta["annotations"] == {"autoheal.io/remediation": "enabled"}


def test_no_node_is_ever_declared(lab):
    assert not lab.of_type("kubernetes:core/v1:Node")
    assert not [r for r in lab.resources if r.custom and r.type.endswith(":Node")]


def test_placement_selects_the_pool_and_tolerates_its_taints_and_the_spare_taint():
    taint = Taint(key="nvidia.com/gpu", value="present")

    def program():
        pool = GpuNodePool("p", GpuNodePoolArgs(name="a100", prefix="a", size=2, spares=1, taints=(taint,)))
        return {"selector": pool.placement.selector, "taints": list(pool.placement.taints)}

    rec = run_program(program)
    assert rec.value["selector"] == {"autoheal.io/pool": "a100"}
    assert rec.value["taints"] == [taint, SPARE_TAINT]


def test_waiver_is_recorded_on_the_pool():
    rec = run_program(
        lambda: GpuNodePool(
            "p",
            GpuNodePoolArgs(name="dev", size=1, prefix="dev", spares=0, waiver="dev pool, no SLA"),
        )
    )
    cm = rec.one("kubernetes:core/v1:ConfigMap", "autoheal-pool-dev")
    assert cm.inputs["metadata"]["annotations"]["autoheal.io/policy-waiver"] == "dev pool, no SLA"
    assert json.loads(cm.inputs["data"]["pool.json"])["spares"] == 0


@pytest.mark.parametrize(
    "bad",
    [
        {"size": 0},
        {"spares": -1},
        {"prefix": "GPU_"},
        {"name": "h.100"},
        {"gpus_per_node": 0},
    ],
)
def test_invalid_pool_arguments_are_rejected(bad):
    args = {"name": "h100", "prefix": "gpu", "size": 2, "spares": 1, **bad}
    with pytest.raises(ValueError):
        GpuNodePoolArgs(**args).validate()


def test_spare_marking_and_pool_label_are_the_shared_contract(lab):
    """The pool description spells spares, the pool label and the GPU taint as autoheal.labels
    does, which the runbook and the lab's pool controller read too."""
    from autoheal import labels

    pool = _pool(lab)
    assert pool["spare"]["taint"] == labels.spare_taint()
    assert pool["spare"]["label"] == {"key": labels.SPARE_LABEL, "value": "true"}
    assert pool["nodeLabels"][labels.POOL_LABEL] == "h100"
    assert pool["taints"] == [labels.gpu_taint()]

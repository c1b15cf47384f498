"""A pool change reaches the slurmd DaemonSets as a pod template change (issue 33): the template
carries the hash of what that pool's slurmd reads, so `pulumi up` updates the DaemonSet and the
rollout play (playbooks/slurm_rollout.yml) finds its running pods on an old revision."""

from __future__ import annotations

from components.nodepool import GpuNodePool, GpuNodePoolArgs
from components.slurm import SlurmCluster, SlurmClusterArgs
from tests.components.harness import run_program

HASH = "autoheal.io/config-hash"


def _hashes(h100_gpus: int = 8, a100_gpus: int = 4, a100: bool = True) -> dict[str, str]:
    def program() -> None:
        pools = [
            GpuNodePool(
                "p1", GpuNodePoolArgs(name="h100", prefix="h", size=2, spares=1, gpus_per_node=h100_gpus)
            )
        ]
        if a100:
            pools.append(
                GpuNodePool(
                    "p2",
                    GpuNodePoolArgs(
                        name="a100", prefix="a", size=1, spares=1, gpus_per_node=a100_gpus, gpu_model="a100"
                    ),
                )
            )
        SlurmCluster("s", SlurmClusterArgs(pools=[p.placement for p in pools]))

    rec = run_program(program)
    return {
        str(r.k8s_name): str(r.inputs["spec"]["template"]["metadata"]["annotations"][HASH])
        for r in rec.of_type("kubernetes:apps/v1:DaemonSet")
    }


def test_the_slurmd_template_carries_its_pools_config_hash_and_stays_on_delete():
    base = _hashes()
    assert set(base) == {"slurmd-h100", "slurmd-a100"}
    assert base == _hashes()  # stable: the same pools render the same hash
    # one pool's GPU count (its Gres and gres.conf) rolls it; slurm.conf names no node, so the
    # other pool's slurmd reads the same files and keeps its revision
    changed = _hashes(a100_gpus=2)
    assert changed["slurmd-a100"] != base["slurmd-a100"]
    assert changed["slurmd-h100"] == base["slurmd-h100"]
    # a new pool changes slurm.conf (its NodeSet and partition): every pool's slurmd rolls
    assert _hashes(a100=False)["slurmd-h100"] != base["slurmd-h100"]


def test_the_update_strategy_stays_on_delete():
    def program() -> None:
        pool = GpuNodePool("p1", GpuNodePoolArgs(name="h100", prefix="h", size=1, spares=1))
        SlurmCluster("s", SlurmClusterArgs(pools=[pool.placement]))

    ds = run_program(program).one("kubernetes:apps/v1:DaemonSet", "slurmd-h100")
    assert ds.inputs["spec"]["updateStrategy"] == {"type": "OnDelete"}

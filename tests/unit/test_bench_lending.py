"""bench/lending.py's day simulation (issue 35): the lender's decision core (remediation.lending.plan)
on a simulated clock over scripted demand. The figures must be sane: lending serves the inference
the pool could not, leaves fewer GPUs idle on the scripted day, and never breaks a limit (max
nodes, max percent, min training, one move per cooldown); and where lending does cost idle time
(a busy pool lends for a short burst, then the node waits out return_after) the figures show it."""

from __future__ import annotations

import dataclasses

import pytest

from bench.lending import DAY_POLICY, DayScript, day_figures, scripted_day, simulate_day
from remediation.lending import Policy

STEP = 10.0


def _day(inference: list[int], arrivals: list[tuple[int, float, int]], nodes: int = 4) -> DayScript:
    return DayScript(nodes=nodes, gpus=8, pod_gpus=2, inference=tuple(inference), arrivals=tuple(arrivals))


def test_the_scripted_day_lending_serves_inference_and_leaves_fewer_gpus_idle() -> None:
    script = scripted_day()
    off = simulate_day(script, lending=False, step=STEP)
    on = simulate_day(script, lending=True, step=STEP)
    pool_gpu_h = script.nodes * script.gpus * 24
    for r in (off, on):  # every GPU-hour is training, inference or idle
        total = r.training_gpu_h + r.inference_gpu_h + r.idle_gpu_h
        assert total == pytest.approx(pool_gpu_h, rel=1e-6)
    assert off.inference_gpu_h == 0 and off.lends == 0 and off.idle_gpu_h > 0
    assert off.unserved_inference_gpu_h == pytest.approx(sum(script.inference) * script.pod_gpus / 60)
    assert on.idle_gpu_h < off.idle_gpu_h
    assert on.unserved_inference_gpu_h < 0.01 * off.unserved_inference_gpu_h
    assert on.inference_gpu_h == pytest.approx(off.unserved_inference_gpu_h - on.unserved_inference_gpu_h)
    assert on.violations == []
    assert on.max_away <= DAY_POLICY.max_nodes and on.min_training >= DAY_POLICY.min_training
    # the morning's first inference finds every node training: one busy node is lent, its job requeued
    assert on.requeues >= 1 and on.lost_training_gpu_h > 0
    assert on.returns <= on.lends


def test_no_inference_demand_changes_nothing() -> None:
    script = _day([0] * 1440, [(0, 5.0, 10), (60, 20.0, 10), (600, 3.0, 10)])
    off = simulate_day(script, lending=False, step=STEP)
    on = simulate_day(script, lending=True, step=STEP)
    assert on.lends == 0 and on.requeues == 0
    assert on.idle_gpu_h == pytest.approx(off.idle_gpu_h) and on.training_gpu_h == pytest.approx(
        off.training_gpu_h
    )


def test_a_burst_bigger_than_the_limit_lends_up_to_it_and_leaves_the_rest_unserved() -> None:
    inference = [0] * 600 + [16] * 120 + [0] * 720  # 16 replicas of 2 GPUs: 4 whole nodes
    script = _day(inference, [], nodes=8)
    policy = dataclasses.replace(DAY_POLICY, max_nodes=2, max_percent=100, min_training=1)
    on = simulate_day(script, policy, lending=True, step=STEP)
    assert on.max_away == 2 and on.violations == []
    assert on.unserved_inference_gpu_h == pytest.approx(8 * 2 * 2, rel=0.05)  # half of it, for 2 h
    # max_percent and min_training hold the same way
    by_percent = simulate_day(script, dataclasses.replace(policy, max_nodes=10, max_percent=25), step=STEP)
    assert by_percent.max_away == 2 and by_percent.violations == []
    by_floor = simulate_day(
        script, dataclasses.replace(policy, max_nodes=10, max_percent=100, min_training=5), step=STEP
    )
    assert by_floor.max_away == 3 and by_floor.min_training == 5 and by_floor.violations == []


def test_flapping_demand_moves_no_node_twice_within_the_cooldown() -> None:
    inference = [4 if (m // 3) % 2 else 0 for m in range(1440)]  # 3 min on, 3 min off, all day
    script = _day(inference, [(0, 30.0, 10)], nodes=4)
    policy = Policy(max_nodes=2, max_percent=50, min_training=1, cooldown=600, return_after=60, grace=60)
    on = simulate_day(script, policy, lending=True, step=STEP)
    assert on.violations == []
    # each move of a node is at least a cooldown after its last: at most one per 10 minutes per node
    assert 0 < on.lends + on.returns <= 2 * 1440 // 10


def test_lending_is_not_free_on_a_saturated_pool() -> None:
    """Every node training all day and a 5-minute burst: the lent node's job is requeued, and the
    node then sits idle for return_after before it goes back: more idle GPU-hours than without
    lending, and training work lost. The bench reports this cost; it does not hide it."""
    inference = [0] * 720 + [1] * 5 + [0] * 715
    script = _day(inference, [(0, 23.9, 10)] * 8, nodes=4)
    off = simulate_day(script, lending=False, step=STEP)
    on = simulate_day(script, lending=True, step=STEP)
    assert on.requeues == 1 and on.lends == 1 and on.returns == 1
    assert on.idle_gpu_h > off.idle_gpu_h
    assert on.lost_training_gpu_h > 0 and on.training_gpu_h < off.training_gpu_h
    assert on.violations == []


def test_a_day_script_refuses_what_it_cannot_simulate() -> None:
    with pytest.raises(ValueError, match="pod_gpus"):
        DayScript(nodes=2, gpus=4, pod_gpus=8, inference=(0,), arrivals=())
    with pytest.raises(ValueError, match="inference: one entry per minute"):
        DayScript(nodes=2, gpus=4, pod_gpus=1, inference=(), arrivals=())
    with pytest.raises(ValueError, match="arrivals"):
        DayScript(nodes=2, gpus=4, pod_gpus=1, inference=(0, 0), arrivals=((5, 1.0, 1),))
    with pytest.raises(ValueError, match="step"):
        simulate_day(_day([0], []), step=0)


def test_the_figures_name_what_they_are() -> None:
    fig = day_figures(step=60.0)
    assert "simulated clock" in fig["simulation"] and "not a cluster" in fig["simulation"]
    assert fig["pool"] == {"nodes": 16, "gpus_per_node": 8, "gpu_hours": 3072.0}
    assert fig["with_lending"]["idle_gpu_h"] < fig["without_lending"]["idle_gpu_h"]

"""lab.stats.pct, the benchmarks' percentile: nearest rank, so every figure is one a trial measured."""

from __future__ import annotations

from lab.stats import pct


def test_nearest_rank_percentiles_are_measured_values() -> None:
    xs = [9.4, 7.4, 6.9]
    assert pct(xs, 50) == 7.4
    assert pct(xs, 99) == 9.4  # a p99 of three trials is their maximum
    assert pct(xs, 0) == 6.9
    assert pct([float(i) for i in range(1, 101)], 99) == 99.0
    assert xs == [9.4, 7.4, 6.9]  # the caller's list is not sorted in place

"""The benchmarks' one percentile (bench/*.py): nearest rank on the sorted samples, so a p99 of a
few trials is their maximum, never a value no trial measured."""

from __future__ import annotations

from collections.abc import Sequence


def pct(xs: Sequence[float], p: float) -> float:
    """The `p`th percentile (0-100) of `xs` (not empty), by nearest rank."""
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

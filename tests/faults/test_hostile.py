"""Hostile input, a small run of bench/hostile.py (which sends 10,000): generated payloads with a
hostile node name, XID or shape never get a 5xx, never open an incident, never start a run."""

from __future__ import annotations

import pytest

from bench.hostile import run

pytestmark = pytest.mark.timeout(300)


def test_hostile_payloads_get_no_5xx_open_nothing_and_run_nothing(tmp_path):
    result = run(400, seed=17, work=tmp_path)
    assert result["5xx"] == 0, result
    assert result["incidents"] == 0 and result["runs"] == 0, result
    assert set(result["codes"]) <= {200, 400, 413, 422}, result

"""The cost-growth sweep's arithmetic (the timings themselves live in benchmarks/, not in tests)."""

import math

import pytest

from benchmarks.sweep import AXES, BASE, loglog_slope, points, slopes
from benchmarks.trainers import history_phases


def test_loglog_slope_recovers_a_power_law():
    xs = [2, 4, 8, 16]
    assert loglog_slope(xs, [3 * x**1.5 for x in xs]) == pytest.approx(1.5)
    assert loglog_slope(xs, [7.0] * 4) == pytest.approx(0.0)
    assert math.isnan(loglog_slope([4], [1.0]))


def test_points_vary_one_setting_at_a_time():
    visited = points(AXES)
    assert visited[0] == BASE and len(visited) == len({tuple(sorted(p.items())) for p in visited}) == 1 + 3 + 3 + 2
    for p in visited:
        assert sum(p[k] != BASE[k] for k in BASE) <= 1


def test_slopes_per_axis_engine_and_phase():
    axes = {"group_size": (2, 8), "max_new_tokens": (8, 32), "prompts_per_step": (1, 2)}
    measured = []
    for p in points(axes):
        work = p["group_size"] * p["max_new_tokens"] * p["prompts_per_step"]
        phase = {name: float(work) for name in ("generate", "rewards", "score_no_grad", "forward", "backward", "optimizer", "other", "step")}
        measured.append({"point": p, "ours": phase, "trl": {k: 2 * v for k, v in phase.items()}})
    fitted = slopes(measured, axes)
    for axis in axes:
        for engine in ("ours", "trl"):
            assert fitted[axis][engine]["step"] == pytest.approx(1.0)


def test_history_phases_read_the_trainers_own_timings():
    row = {"generate_seconds": 1.0, "reward_seconds": 0.1, "score_seconds": 0.2, "reference_seconds": 0.3,
           "forward_seconds": 0.4, "backward_seconds": 0.5, "optimizer_seconds": 0.06}
    assert history_phases(row) == {"generate": 1.0, "rewards": 0.1, "score_no_grad": 0.5, "forward": 0.4,
                                   "backward": 0.5, "optimizer": 0.06}

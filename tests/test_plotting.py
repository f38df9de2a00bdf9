"""plot_history's reward band: +-1 standard error of the step's mean, never +-1 std (issue 25, I10)."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from grpo_tutorial.plotting import plot_history  # noqa: E402


def _zero_one_history(n_completions: int, steps: int = 12, seed: int = 0) -> list[dict]:
    """Rows as the trainer logs them for a 0/1 reward: the mean and sample std of n rewards.

    The accuracies run from all wrong to all right, where a +-1 std band leaves [0, 1].
    """
    g = torch.Generator().manual_seed(seed)
    rows = []
    for step, p in enumerate(np.linspace(0.0, 1.0, steps), start=1):
        rewards = (torch.rand(n_completions, generator=g, dtype=torch.float64) < p).double()
        if 0 < step < steps:  # make sure the edges hold one right / one wrong answer
            rewards[0] = 1.0 if rewards.sum() == 0 else rewards[0]
        rows.append({"step": step, "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std())})
    return rows


def _band(fig) -> tuple[np.ndarray, np.ndarray]:
    """The lower and upper edges of the reward panel's fill_between band, per step."""
    (band,) = fig.axes[0].collections
    vertices = band.get_paths()[0].vertices  # [x, y]: the outline of the band
    xs = np.unique(vertices[:, 0])
    lower = np.array([vertices[vertices[:, 0] == x, 1].min() for x in xs])
    upper = np.array([vertices[vertices[:, 0] == x, 1].max() for x in xs])
    return lower, upper


def test_the_band_is_one_standard_error_of_the_mean():
    rows = _zero_one_history(16)
    fig = plot_history(rows, keys=["reward_mean"], completions_per_step=16)
    lower, upper = _band(fig)
    mean = np.array([r["reward_mean"] for r in rows])
    se = np.array([r["reward_std"] for r in rows]) / math.sqrt(16)
    np.testing.assert_allclose(lower, mean - se)
    np.testing.assert_allclose(upper, mean + se)
    assert fig.axes[0].get_title() == "reward (mean ± 1 s.e.)"


@pytest.mark.parametrize("n", [2, 8, 16, 256])
def test_for_a_zero_one_reward_the_band_stays_in_zero_one(n):
    rows = _zero_one_history(n, steps=30, seed=n)
    lower, upper = _band(plot_history(rows, keys=["reward_mean"], completions_per_step=n))
    assert lower.min() >= -1e-12 and upper.max() <= 1 + 1e-12
    # the old band, +-1 std, leaves [0, 1] on the same rows
    mean = np.array([r["reward_mean"] for r in rows])
    std = np.array([r["reward_std"] for r in rows])
    assert (mean - std).min() < 0 or (mean + std).max() > 1


def test_a_smoothed_band_is_narrower_by_the_root_of_the_window():
    rows = _zero_one_history(16)
    lower, upper = _band(plot_history(rows, keys=["reward_mean"], smooth=4, completions_per_step=16))
    from grpo_tutorial.plotting import moving_average

    se = moving_average([r["reward_std"] for r in rows], 4) / math.sqrt(16 * 4)
    np.testing.assert_allclose((upper - lower) / 2, se)


def test_no_band_without_the_number_of_completions():
    fig = plot_history(_zero_one_history(16), keys=["reward_mean"])
    assert not fig.axes[0].collections
    assert fig.axes[0].get_title() == "reward (mean)"


@pytest.mark.parametrize("bad, error", [(0, ValueError), (1, ValueError), (2.5, TypeError), (True, TypeError), ("16", TypeError)])
def test_bad_completions_per_step_names_the_argument(bad, error):
    with pytest.raises(error, match="completions_per_step must be an int >= 2"):  # a wrong type is a TypeError
        plot_history(_zero_one_history(4), completions_per_step=bad)

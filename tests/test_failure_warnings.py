"""Most groups with all-equal rewards: a solved batch is told apart from a collapse (issue 12).

The trainer's ">80% zero-std groups" warning used to say "possible collapse" even
when the model had simply learned to answer every problem right. These tests feed
``check_failure_modes`` rows of each kind and check which warning it gives.
"""

from __future__ import annotations

import math

import pytest

from grpo_tutorial import GRPOConfig
from grpo_tutorial.metrics import check_failure_modes


def _warnings_for(row: dict, history: list[dict] = ()) -> dict[str, str]:
    said: dict[str, str] = {}
    check_failure_modes(
        {"frac_truncated": 0.0, **row}, list(history), group_size=8, learning_rate=1e-4, max_new_tokens=4,
        warn=lambda kind, message: said.setdefault(kind, message),
    )
    return said


def test_high_accuracy_with_equal_rewards_is_mastery_not_collapse():
    said = _warnings_for({"step": 40, "frac_zero_std": 0.9, "accuracy": 0.95, "reward_mean": 0.95})
    assert set(said) == {"mastered"}
    assert "accuracy 0.95" in said["mastered"] and "Not a collapse" in said["mastered"]


def test_every_group_correct_is_mastery_too():
    said = _warnings_for({"step": 40, "frac_zero_std": 1.0, "accuracy": 1.0, "reward_mean": 1.0})
    assert set(said) == {"mastered"}


def test_low_and_falling_reward_with_equal_rewards_is_collapse():
    history = [{"reward_mean": 0.4}] * 10
    said = _warnings_for({"step": 11, "frac_zero_std": 0.9, "accuracy": 0.05, "reward_mean": 0.05}, history)
    assert set(said) == {"collapse"}
    assert "possible collapse at step 11" in said["collapse"] and "-0.350" in said["collapse"]


def test_without_accuracy_the_reward_trend_decides():
    rising = _warnings_for({"step": 5, "frac_zero_std": 0.85, "accuracy": math.nan, "reward_mean": 0.9},
                           [{"reward_mean": 0.5}] * 4)
    falling = _warnings_for({"step": 5, "frac_zero_std": 0.85, "accuracy": math.nan, "reward_mean": 0.1},
                            [{"reward_mean": 0.5}] * 4)
    assert set(rising) == {"mastered"} and set(falling) == {"collapse"}


def test_all_wrong_is_no_signal_and_healthy_is_silent():
    assert set(_warnings_for({"step": 1, "frac_zero_std": 1.0, "accuracy": 0.0, "reward_mean": 0.0})) == {"zero_std"}
    assert _warnings_for({"step": 1, "frac_zero_std": 0.3, "accuracy": 0.4, "reward_mean": 0.4}) == {}


@pytest.mark.parametrize("top_p", [0.9, 0.5])
def test_top_p_below_one_is_refused_for_training(top_p):
    with pytest.raises(ValueError, match="GRPOConfig.top_p must be 1.0 for training.*full softmax"):
        GRPOConfig(top_p=top_p)
    assert GRPOConfig(top_p=1.0).top_p == 1.0

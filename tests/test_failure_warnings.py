"""The trainer's live warnings are chapter 18's doctor on the run so far (issues 12, 53 and 55).

One set of rules: what ``python -m grpo_tutorial doctor`` says of a finished run is what the trainer warned of while
it ran, each finding once, named, with what to change and the chapter that explains it. A solved batch is not a
collapse (issue 12), a hard start is not a collapse (issue 53: chapter 16's healthy run began with 88% of its groups
all wrong), and every group all wrong from the first step is said at once.
"""

from __future__ import annotations

import warnings

import pytest

from grpo_tutorial import GRPOConfig, GRPOTrainer, build_tiny_policy, make_arithmetic_dataset
from grpo_tutorial.doctor import live_warnings
from grpo_tutorial.rewards import correctness_reward
from grpo_tutorial.trainer import GRPOWarning

from test_doctor import curve, healthy_rows


def said(rows, completions=(), settings=None) -> dict[str, str]:
    return dict(live_warnings(rows, completions, settings))


def test_a_run_that_learned_its_problems_is_not_warned_of():
    learned = curve(0.3, 0.95, 40, 0.01, 0)
    rows = healthy_rows(40, accuracy=learned, reward_mean=learned, frac_zero_std=curve(0.2, 0.9, 40, 0.01, 1))
    assert said(rows) == {}
    for end in range(1, 41):  # nor at any step on the way
        assert said(rows[:end]) == {}, end


def test_problems_solved_from_the_start_are_too_easy():
    rows = healthy_rows(10, accuracy=0.97, reward_mean=0.97, frac_zero_std=0.9)
    message = said(rows)["zero_variance_too_easy"]
    assert message.startswith("step 10: zero_variance_too_easy (fault):") and "chapter 2" in message
    assert "harder problems" in message


def test_every_group_all_wrong_is_said_at_the_first_step():
    rows = healthy_rows(1, accuracy=0.0, reward_mean=0.0, frac_zero_std=1.0, loss=0.0, grad_norm=0.0)
    assert set(said(rows)) == {"zero_variance_too_hard"}


def test_a_hard_start_is_not_a_collapse():
    """Chapter 16's healthy run: 88% of groups all wrong at step 1, fewer as it learns: no warning at any step."""
    acc = curve(0.04, 0.37, 40, 0.01, 2)
    rows = healthy_rows(40, accuracy=acc, reward_mean=acc, frac_zero_std=curve(0.88, 0.1, 40, 0.02, 3))
    for end in range(1, 41):
        assert said(rows[:end]) == {}, end


def test_a_collapse_after_large_steps_names_the_learning_rate():
    acc = [0.25, 0.2, 0.05, 0.01] + [0.0] * 8
    rows = healthy_rows(12, accuracy=acc, reward_mean=acc, ratio_max=[1.8, 18.0] + [1.5] * 10,
                        frac_zero_std=[0.3, 0.6, 0.95] + [1.0] * 9)
    found = said(rows)
    assert "lr_too_high" in found and "learning_rate" in found["lr_too_high"] and "chapter 8" in found["lr_too_high"]


def _trainer(lr: float, seed: int = 0) -> GRPOTrainer:
    model, tok = build_tiny_policy(seed=seed)
    return GRPOTrainer(model, tok, correctness_reward,
                       GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=4, learning_rate=lr, seed=seed))


def test_the_trainer_warns_each_finding_once_with_the_doctors_words():
    """The untrained tiny model on one-digit sums: every group all wrong, from the first step. The trainer says so
    once (not at every step), as a GRPOWarning that names the finding."""
    trainer = _trainer(1e-4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train(make_arithmetic_dataset(64, seed=1, digits=1), 6, progress=False)
    ours = [str(w.message) for w in caught if issubclass(w.category, GRPOWarning)]
    hard = [m for m in ours if "zero_variance_too_hard" in m]
    assert len(hard) == 1 and hard[0].startswith("step 1: zero_variance_too_hard (fault):")
    assert "zero_variance_too_hard" in trainer.state.warn.issued  # a resumed run remembers it (run/state.py)


@pytest.mark.parametrize("top_p", [0.9, 0.5])
def test_top_p_below_one_is_refused_for_training(top_p):
    with pytest.raises(ValueError, match="GRPOConfig.top_p must be 1.0 for training.*full softmax"):
        GRPOConfig(top_p=top_p)
    assert GRPOConfig(top_p=1.0).top_p == 1.0


def test_a_live_warning_needs_its_finding_on_the_last_steps():
    """A curve read mid-run moves with each step: a finding warns only when the doctor also found it on the run as
    it stood at each of the LIVE_STEPS - 1 steps before (chapter 6's fix sharpens for a few steps, then learns)."""
    from grpo_tutorial.doctor import LIVE_STEPS, diagnose

    rows = healthy_rows(18, kl=[0.01] * 9 + [3.0] * 9)  # the KL to the reference passes 1 nat at step 10
    first = min(n for n in range(1, 19) if "kl_explosion" in diagnose(rows[:n]).names("fault"))
    assert first == 10  # the doctor finds it on the run up to step 10 ...
    for n in range(first, first + LIVE_STEPS - 1):  # ... and the live warning waits until it held LIVE_STEPS times
        assert "kl_explosion" not in said(rows[:n]), n
    assert "kl_explosion" in said(rows[:first + LIVE_STEPS - 1])
    # a finding on the last step's reading only is not said yet
    assert said(rows[:10]) == {} and "kl_explosion" in diagnose(rows[:10]).names("fault")

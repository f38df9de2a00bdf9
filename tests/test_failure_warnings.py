"""The trainer's live warnings are chapter 18's doctor on the run so far (issues 12, 53 and 55).

One set of rules: what ``python -m grpo_tutorial doctor`` says of a finished run is what the trainer warned of while
it ran, each finding once, named, with what to change and the chapter that explains it. A solved batch is not a
collapse (issue 12), a hard start is not a collapse (issue 53: chapter 16's healthy run began with 88% of its groups
all wrong), and every group all wrong from the first step is said once four steps have shown it (issue 52: one
step cannot tell a hopeless run from a sparse start).
"""

from __future__ import annotations

import warnings

import pytest

from grpo_tutorial import GRPOConfig, GRPOTrainer, make_arithmetic_dataset
from grpo_tutorial.doctor import live_warnings
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


def test_every_group_all_wrong_is_said_once_the_rule_of_three_allows():
    """Every group of every step all wrong, in a run that does not say its groups a step: the doctor finds it from
    step HOPELESS_STEPS (4: with k steps of B groups and none mixed, the 95% bound on a group's chance of a signal,
    about 3 / (k B), falls below one group a step only at k > 3), the live warning three readings later; a probe,
    one step's sampling read as advice, is read at its one step (tests/test_gsm8k_scoring.py)."""
    from grpo_tutorial.doctor import LIVE_STEPS, diagnose
    from grpo_tutorial.doctor.rules import HOPELESS_STEPS

    assert HOPELESS_STEPS == 4
    rows = healthy_rows(12, accuracy=0.0, reward_mean=0.0, frac_zero_std=1.0, loss=0.0, grad_norm=0.0)
    found = [n for n in range(1, 13) if "zero_variance_too_hard" in diagnose(rows[:n]).names("fault")]
    assert found == list(range(HOPELESS_STEPS, 13))
    live = HOPELESS_STEPS + LIVE_STEPS - 1
    for end in range(1, live):
        assert said(rows[:end]) == {}, end
    assert set(said(rows[:live])) == {"zero_variance_too_hard"}


def test_with_its_groups_a_step_the_doctor_counts_the_groups_that_varied():
    """B = 4 groups a step, all equal but one group at step 4 (the untrained tiny model on one-digit sums: about 1
    completion in 128 right). The one-sided 95% Clopper-Pearson bound on a group's chance of a signal, against one
    group a step (1/4): 0 of 12 groups gives 0.221 (found at step 3), 1 of 16 gives 0.264 (not), 1 of 20 0.216."""
    from grpo_tutorial.doctor import diagnose
    from grpo_tutorial.doctor.reading import Run
    from grpo_tutorial.stats import clopper_pearson

    assert [round(clopper_pearson(m, n, 0.90)[1], 3) for m, n in ((0, 12), (1, 16), (1, 20))] == [0.221, 0.264, 0.216]
    acc = [0.0, 0.0, 0.0, 1 / 16, 0.0, 0.0, 0.0, 0.0]
    rows = healthy_rows(8, accuracy=acc, reward_mean=acc, frac_zero_std=[1.0, 1.0, 1.0, 0.75, 1.0, 1.0, 1.0, 1.0])
    found = [n for n in range(1, 9)
             if "zero_variance_too_hard" in diagnose(Run(rows[:n], [], {"prompts_per_step": 4})).names("fault")]
    assert found == [3, 5, 6, 7, 8]
    assert "zero_variance_too_hard" in said(rows[:7], (), {"prompts_per_step": 4})  # found at 5, 6 and 7
    assert "zero_variance_too_hard" not in said(rows[:6], (), {"prompts_per_step": 4})
    # sixteen groups a step: a first step with none mixed is not enough (1 - 0.05 ** (1 / 16) = 0.171 > 1/16)
    assert "zero_variance_too_hard" not in diagnose(Run(rows[:1], [], {"prompts_per_step": 16})).names("fault")


def test_a_sparse_start_with_a_first_step_all_wrong_is_not_a_fault():
    """Chapter 16's sparsest record seed (seed 4's all-equal shares, rounded; accuracies of its order, rising to
    0.17) with a first step of all 16 groups all wrong, as the live run drew under MKL_CBWR=COMPATIBLE (about 2% of
    completions right: (1 - 0.02) ** 128 = 0.075 of first steps do): no warning at any step, with and without the
    run's groups a step."""
    zero = [1.0, 0.94, 0.88, 0.94, 0.81, 0.75, 0.75, 0.62, 0.5, 0.56, 0.44, 0.44] + [0.4] * 8
    acc = [0.0, 0.008, 0.016, 0.008, 0.023, 0.03, 0.03, 0.05, 0.07, 0.06, 0.08, 0.09] + [0.1 + 0.01 * i for i in range(8)]
    rows = healthy_rows(20, accuracy=acc, reward_mean=acc, frac_zero_std=zero)
    for end in range(1, 21):
        assert "zero_variance_too_hard" not in said(rows[:end]), end
        assert "zero_variance_too_hard" not in said(rows[:end], (), {"prompts_per_step": 16}), end


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


def test_a_collapse_after_the_first_update_names_the_learning_rate():
    """Chapter 10's collapse (learning rate 3e-3) under ATEN_CPU_CAPABILITY=default: the accuracy fell from 0.141 at
    step 1 to 0 from step 2 on. The mean of the first three steps (0.047) holds the collapse itself and falls short of
    FALL_MIN (0.05); the first step's score, sampled before any update, is the start."""
    from grpo_tutorial.doctor.rules import FALL_MIN

    acc = [0.140625] + [0.0] * 11
    ratio = [40.77, 8.34, 132.33, 5.0, 42.28, 78.28, 1.03, 1.0, 1.0, 1.0, 1.0, 1.0]
    rows = healthy_rows(12, accuracy=acc, reward_mean=acc, ratio_max=ratio, frac_zero_std=[0.25] + [1.0] * 11)
    assert sum(acc[:3]) / 3 < FALL_MIN <= acc[0]
    assert "lr_too_high" in said(rows)


def never_pays(completions, **kwargs):
    return [0.0] * len(completions)


def test_the_trainer_warns_each_finding_once_with_the_doctors_words(make_tiny_policy):
    """The tiny model under a reward that never pays: every group all-equal, from the first step, on any kernels. The
    trainer says so once (not at every step), as a GRPOWarning that names the finding: the doctor finds it at step 3
    (4 groups a step, none of 12 mixed: the 95% bound on a group's chance of a signal, 0.221, is below 1/4) and the
    live warning holds it for LIVE_STEPS readings, to step 5."""
    model, tok = make_tiny_policy(seed=0)
    trainer = GRPOTrainer(model, tok, never_pays,
                          GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=4, learning_rate=1e-4, seed=0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train(make_arithmetic_dataset(64, seed=1, digits=1), 6, progress=False)
    ours = [str(w.message) for w in caught if issubclass(w.category, GRPOWarning)]
    hard = [m for m in ours if "zero_variance_too_hard" in m]
    assert len(hard) == 1 and hard[0].startswith("step 5: zero_variance_too_hard (fault):"), ours
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

"""Chapter 9's two scorers, their paired comparison, and the probe's advice before training."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_tutorial.chapters.gsm8k import (
    GSM8K_PRESET,
    PROBE_TRUNCATED_LIMIT,
    PROBE_ZERO_STD_LIMIT,
    compare_scores,
    lenient_correct,
    probe_advice,
    probe_groups,
    score_evaluation,
    score_lines,
    strict_correct,
)
from grpo_tutorial.chapters.recipes import paired_gain
from grpo_tutorial.presets import get_preset


@pytest.mark.parametrize("text, answer, strict, lenient", [
    ("so she earns \\boxed{18} dollars", "18", True, True),
    ("so she earns \\boxed{18}. Check: 16 - 3 = 13", "18", True, True),  # the boxed answer wins, not the last number
    ("she earns 18 dollars", "18", False, True),  # right, but not in the asked-for format
    ("\\boxed{1,200}", "1200", True, True),  # the same number written with a comma
    ("first \\boxed{5}, then \\boxed{7}", "7", True, True),  # the last box counts
    ("first \\boxed{7}, then \\boxed{5}", "7", False, False),
    ("\\boxed{seven}", "7", False, False),
    ("no number at all", "7", False, False),
    ("\\boxed{}", "7", False, False),
])
def test_the_strict_scorer_needs_the_box_and_the_lenient_one_reads_what_extract_answer_reads(text, answer, strict,
                                                                                              lenient):
    assert strict_correct(text, answer) is strict
    assert lenient_correct(text, answer) is lenient
    assert not (strict and not lenient)  # every strict hit is a lenient hit


def _evaluation(completions, answers, truncated):
    return {"records": [{"completion": c, "answer": a, "truncated": t}
                        for c, a, t in zip(completions, answers, truncated)]}


def test_an_evaluation_scored_both_ways_and_compared_problem_by_problem():
    answers = ["1", "2", "3", "4"]
    before = _evaluation(["it is 1", "\\boxed{2}", "5", "it is 4"], answers, [False, False, True, False])
    after = _evaluation(["\\boxed{1}", "\\boxed{2}", "\\boxed{3}", "it is 9"], answers, [False] * 4)
    b, a = score_evaluation(before), score_evaluation(after)
    assert b["strict"]["correct"] == [False, True, False, False]
    assert b["lenient"]["correct"] == [True, True, False, True]
    assert a["strict"]["correct"] == [True, True, True, False] == a["lenient"]["correct"]
    assert (b["boxed"], a["boxed"], b["truncated"], a["truncated"]) == (0.25, 0.75, 0.25, 0.0)
    assert b["strict"]["se"] == pytest.approx(math.sqrt(0.25 * 0.75 / 4))
    c = compare_scores(b, a)
    assert c["n"] == 4
    assert (c["strict"]["before"], c["strict"]["after"], c["strict"]["gain"]) == (0.25, 0.75, 0.5)
    # the format shows in the strict scorer only: the lenient one did not move
    assert c["lenient"]["gain"] == 0.0 and c["lenient"]["gain_se"] > 0  # one gained, one lost
    assert (c["strict"]["gain"], c["strict"]["gain_se"]) == paired_gain(b["strict"]["correct"], a["strict"]["correct"])
    assert c["boxed"] == {"before": 0.25, "after": 0.75} and c["truncated"] == {"before": 0.25, "after": 0.0}
    text = "\n".join(score_lines(c))
    assert "strict accuracy" in text and "lenient accuracy" in text and "n = 4" in text and "+0.500" in text
    with pytest.raises(ValueError, match="the same problems"):
        compare_scores(b, score_evaluation(_evaluation(["1"], ["1"], [False])))
    with pytest.raises(ValueError, match="per-problem 'records'"):
        score_evaluation({"accuracy": 0.5})


def test_the_probe_says_what_to_change_on_a_stand_in_that_truncates_everything(tiny_policy):
    """The tiny random model with its EOS logit pushed to -inf never ends an answer, nor writes a right one."""
    from grpo_tutorial.rewards import correctness_reward
    from grpo_tutorial.tasks import make_arithmetic_dataset

    model, tokenizer = tiny_policy

    def never_ends(module, args, output):
        output.logits[..., tokenizer.eos_token_id] = -math.inf
        return output

    model.register_forward_hook(never_ends)
    config = get_preset(GSM8K_PRESET, max_new_tokens=4, system_prompt=None, use_chat_template=False,
                        reward_weights=None, use_peft=False)
    rows = make_arithmetic_dataset(4, seed=0)
    state = torch.random.get_rng_state()
    probe = probe_groups(model, tokenizer, config, rows, reward_fns=correctness_reward, seed=0)
    assert torch.equal(torch.random.get_rng_state(), state)  # the probe draws from its own generator
    assert len(probe["right"]) == 4 and all(len(g) == config.group_size for g in probe["right"])
    assert probe["frac_truncated"] == 1.0 and probe["completion_len_mean"] == 4
    assert probe["frac_zero_std"] == 1.0 and probe["all_wrong"] == 1.0
    fine, advice = probe_advice(probe, config)
    assert not fine and [a.split(":")[0] for a in advice] == ["truncation", "zero_variance_too_hard"]  # the cause first
    assert "1.0 of completions hit max_new_tokens" in advice[0] and "try about 8" in advice[0]
    assert "the same low reward" in advice[1] and "group_size" in advice[1]
    assert probe["kept"][0]["truncated"] and probe["kept"][0]["answer"] == rows[0]["answer"]  # what the doctor read
    again = probe_groups(model, tokenizer, config, rows, reward_fns=correctness_reward, seed=0)
    assert again["completions"] == probe["completions"]  # seeded: the same probe twice


def test_the_probe_advice_is_the_doctors_at_its_limits():
    """The probe is a one-step run to the doctor: the same rules and thresholds as a whole run's."""
    config = get_preset(GSM8K_PRESET)
    good = {"frac_truncated": PROBE_TRUNCATED_LIMIT - 0.01, "frac_zero_std": 0.9, "all_wrong": 0.5, "all_right": 0.4}
    fine, advice = probe_advice(good, config)
    assert fine and len(advice) == 1 and "something to learn from" in advice[0]  # most groups equal, not all
    easy = {**good, "frac_zero_std": 0.9, "all_wrong": 0.0, "all_right": 0.9}
    fine, advice = probe_advice(easy, config)
    assert not fine and advice[0].startswith("zero_variance_too_easy:") and "harder problems" in advice[0]
    hard = {**good, "frac_zero_std": 1.0, "all_wrong": 1.0, "all_right": 0.0}
    assert probe_advice(hard, config)[1][0].startswith("zero_variance_too_hard:")
    cut = {**good, "frac_truncated": 0.5}
    fine, advice = probe_advice(cut, config)
    assert not fine and advice[0].startswith("truncation:") and "max_new_tokens=512 now: try about 1024" in advice[0]
    assert PROBE_TRUNCATED_LIMIT == 0.25 and PROBE_ZERO_STD_LIMIT == 0.8
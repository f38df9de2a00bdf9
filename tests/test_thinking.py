"""Chapter 13's tools (grpo_tutorial.chapters.thinking): the warm-start mix, the control
rewards, the held-out statistics, the variants and the summary across seeds."""

from __future__ import annotations

import math
import random

import pytest
import torch

from grpo_tutorial.chapters import thinking
from grpo_tutorial.chapters.lab import mean_ci
from grpo_tutorial.rewards import correctness_reward
from grpo_tutorial.long_addition import parse_worked, worked_addition


@pytest.fixture(scope="module")
def quick():
    recipe = thinking.ThinkingRecipe.quick()
    data = thinking.make_thinking_data(recipe)
    model, tokenizer = thinking.build_thinking_model(recipe, 0)
    return recipe, data, model, tokenizer


def test_the_three_splits_share_no_prompt():
    recipe = thinking.ThinkingRecipe(n_train=3000, n_probe=100, n_test=200)
    data = thinking.make_thinking_data(recipe)
    prompts = {name: {r["prompt"] for r in rows} for name, rows in data.items()}
    assert len(data["probe"]) == 100 and len(data["test"]) == 200 == len(prompts["test"])
    assert not prompts["train"] & prompts["test"] and not prompts["train"] & prompts["probe"]
    assert not prompts["probe"] & prompts["test"]
    assert all(100_000 <= r["a"] <= 999_999 and 100_000 <= r["b"] <= 999_999 for r in data["train"])  # 6 digits


def test_warm_start_targets_mix_the_two_styles_as_asked():
    rows = thinking.make_thinking_data(thinking.ThinkingRecipe(n_train=4000))["train"]
    targets = thinking.warm_start_targets(rows, 0.2, seed=3)
    assert targets == thinking.warm_start_targets(rows, 0.2, seed=3)  # the seed decides
    assert targets != thinking.warm_start_targets(rows, 0.2, seed=4)
    styles = [parse_worked(t["answer"]) for t in targets]
    share = sum(p.worked for p in styles) / len(styles)
    assert abs(share - 0.2) < 3 * math.sqrt(0.2 * 0.8 / len(styles))
    for p, row in zip(styles, rows):  # every target is right and, worked out, consistent
        assert p.answer == row["answer"] and p.consistent
    assert all(not parse_worked(t["answer"]).worked for t in thinking.warm_start_targets(rows[:50], 0.0, 0))
    with pytest.raises(ValueError, match="worked_share"):
        thinking.warm_start_targets(rows, 1.5, 0)


def test_format_only_reward_pays_for_steps_then_a_number_and_nothing_else():
    right = worked_addition(4721, 3856)
    cases = {
        right: 1.0,
        "(1+6=9)(2+5=1)(7+8=3)(4+3=0)1": 1.0,  # steps and a number, all wrong: still the format
        "8577": 0.0,  # a guess
        "(1+6=7)(2+5=7)": 0.0,  # no answer after the steps
        "(1+6=7) so 7": 0.0,  # something else after the steps
        "": 0.0,
    }
    got = thinking.format_only_reward(["4721+3856="] * len(cases), list(cases))
    assert got == list(cases.values())


def test_random_reward_ignores_the_completion_and_repeats_with_its_seed():
    texts = ["8577", worked_addition(4721, 3856), "nonsense"] * 200
    first = thinking.random_reward(7)(["p"] * len(texts), texts)
    again = thinking.random_reward(7)(["p"] * len(texts), ["anything"] * len(texts))
    assert first == again  # the same draws whatever the completions say
    assert set(first) == {0.0, 1.0} and abs(sum(first) / len(first) - 0.5) < 0.07
    assert first != thinking.random_reward(8)(["p"] * len(texts), texts)
    with pytest.raises(TypeError):
        thinking.random_reward(1.5)


def test_heldout_stats_counts_what_it_says_and_leaves_the_rng_alone(quick):
    recipe, data, model, tokenizer = quick
    config = recipe.grpo_config(0)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    stats = thinking.heldout_stats(model, tokenizer, data["test"], config, seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    assert stats == pytest.approx(thinking.heldout_stats(model, tokenizer, data["test"], config, seed=5), nan_ok=True)
    assert set(stats) == set(thinking.CURVE_KEYS) | {"n"} and stats["n"] == len(data["test"])
    # the same completions again, counted by hand
    from grpo_tutorial.rollout import generate_rollouts

    rollout = generate_rollouts(model, tokenizer, [r["prompt"] for r in data["test"]], group_size=1,
                                max_new_tokens=config.max_new_tokens, generator_seed=5)
    right = correctness_reward(completions=rollout.completions, answer=[r["answer"] for r in data["test"]])
    worked = [parse_worked(t).worked for t in rollout.completions]
    assert stats["accuracy"] == pytest.approx(sum(right) / len(right))
    assert stats["worked_share"] == pytest.approx(sum(worked) / len(worked))
    assert stats["length"] == pytest.approx(float(rollout.completion_lengths.float().mean()))


def test_worked_accuracy_starts_every_completion_with_the_first_step(quick, monkeypatch):
    recipe, data, model, tokenizer = quick
    seen = []
    import grpo_tutorial.chapters.thinking as module

    def spy(model, tokenizer, rows, config):
        seen.extend(r["prompt"] for r in rows)
        return {"accuracy": 0.25}

    monkeypatch.setattr(module, "evaluate_policy", spy)
    assert thinking.worked_accuracy(model, tokenizer, data["probe"], recipe.grpo_config(0)) == 0.25
    assert seen == [r["prompt"] + "(" for r in data["probe"]]


def test_every_variant_is_a_valid_config_with_the_same_completions_per_step():
    recipe = thinking.ThinkingRecipe()
    base = recipe.grpo_config(0)
    for name, (description, changes, reward) in thinking.VARIANTS.items():
        config = recipe.grpo_config(0, **changes)
        assert config.prompts_per_step * config.group_size == base.prompts_per_step * base.group_size, name
        assert description and reward in ("correct", "random", "format", "correct+soft_overlong")
        assert thinking.reward_functions(reward, config, 0)
    losses = {thinking.VARIANTS[v][1].get("loss_type") for v in ("dr_grpo", "dapo", "bnpo")}
    assert losses == {"dr_grpo", "dapo", "bnpo"}
    # the loss-type variants change the aggregation and nothing else
    assert all(set(thinking.VARIANTS[v][1]) == {"loss_type"} for v in ("dr_grpo", "dapo", "bnpo"))


def test_run_variant_repeats_itself_and_does_not_touch_the_start_model(quick):
    recipe, data, model, tokenizer = quick
    before = {k: v.clone() for k, v in model.state_dict().items()}
    one = thinking.run_variant("grpo", model, tokenizer, data, recipe, 0)
    two = thinking.run_variant("grpo", model, tokenizer, data, recipe, 0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert [p["step"] for p in one["curve"]] == [0, 2, 4]
    assert repr(one["curve"]) == repr(two["curve"])  # bit for bit (NaN prints as nan on both sides)
    assert repr(one["history"]) == repr(two["history"])
    assert not any(k.endswith("seconds") for k in one["history"][0])
    with pytest.raises(ValueError, match="variant must be one of"):
        thinking.run_variant("nope", model, tokenizer, data, recipe, 0)


def test_summary_is_the_mean_and_interval_of_the_seeds_and_pairs_by_seed():
    rng = random.Random(0)

    def curve():
        return [{"step": s, **{k: rng.random() for k in thinking.CURVE_KEYS}} for s in (0, 10)]

    seeds = [{"seed": s, "variants": {"grpo": {"curve": curve()}, "dapo": {"curve": curve()}}} for s in range(3)]
    seeds[1]["variants"]["dapo"]["curve"][1]["length_correct"] = math.nan  # no right answer there
    out = thinking.summarize_thinking(seeds)
    assert set(out) == {"grpo", "dapo"}
    values = [s["variants"]["dapo"]["curve"][1]["accuracy"] for s in seeds]
    assert out["dapo"]["accuracy"][1] == mean_ci(values)
    assert out["dapo"]["length_correct"][1]["n"] == 2  # the NaN seed is left out
    diff = out["dapo"]["vs_grpo"]["accuracy"]
    assert diff["mean"] == pytest.approx(sum(
        s["variants"]["dapo"]["curve"][1]["accuracy"] - s["variants"]["grpo"]["curve"][1]["accuracy"] for s in seeds) / 3)
    assert diff["seeds"] == [0, 1, 2] and out["dapo"]["vs_grpo"]["length_correct"]["seeds"] == [0, 2]
    assert "vs_grpo" not in out["grpo"]


def test_recipe_checks_its_settings_and_round_trips():
    recipe = thinking.ThinkingRecipe()
    assert thinking.ThinkingRecipe.from_dict(recipe.to_dict()) == recipe
    with pytest.raises(ValueError, match="worked_share"):
        thinking.ThinkingRecipe(worked_share=2)
    with pytest.raises((TypeError, ValueError), match="digits"):
        thinking.ThinkingRecipe(digits=0)
    with pytest.raises(ValueError, match="seed 0's warm start only"):
        thinking.load_warm_start(recipe, seed=1)

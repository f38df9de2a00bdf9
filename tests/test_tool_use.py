"""Chapter 16's tools (grpo_tutorial/chapters/tool_use.py): the task, the reward, the controls, the runs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpo_tutorial.tools.calculator import calculator
from grpo_tutorial.chapters import tool_use
from grpo_tutorial.chapters.recipes import WARM_START_CACHE
from grpo_tutorial.models import TINY_TOOL_CHARS


def test_the_data_splits_are_disjoint_products():
    recipe = tool_use.ToolRecipe()
    data = tool_use.make_tool_data(recipe)
    assert [len(data[k]) for k in ("train", "probe", "test")] == [recipe.n_train, recipe.n_probe, recipe.n_test]
    prompts = [{r["prompt"] for r in data[k]} for k in ("train", "probe", "test")]
    assert not (prompts[0] & prompts[1]) and not (prompts[0] & prompts[2]) and not (prompts[1] & prompts[2])
    for row in data["test"]:
        assert row["prompt"] == f"{row['a']}*{row['b']}=" and row["answer"] == str(row["a"] * row["b"])
        assert 100 <= row["a"] <= 999 and 10 <= row["b"] <= 99
    assert data == tool_use.make_tool_data(recipe)  # the split depends on data_seed only
    assert set("".join(tool_use.tool_target(r) for r in data["test"])) <= set(TINY_TOOL_CHARS)


def test_the_reward_reads_the_text_outside_the_calls():
    reward = tool_use.tool_answer_reward
    assert reward(["<<347*56=19432>>19432"], answer=["19432"]) == [1.0]
    assert reward(["<<347*56=19432>>"], answer=["19432"]) == [0.0]  # the tool's answer alone earns nothing
    assert reward(["19432"], answer=["19432"]) == [1.0]  # a right guess is right
    assert reward(["<<347*56=19432>>19433", "<<347*56=", "1943"], answer=["19432"] * 3) == [0.0, 0.0, 0.0]
    assert reward(["<<3*4=12>><<12*2=24>>24"], answer=["24"]) == [1.0]  # two calls, then the answer
    assert tool_use.final_text("<<1*2=2>>2<<") == "2"  # an open call at the end is dropped too


def test_warm_start_targets_mix_the_two_styles():
    rows = tool_use.make_tool_data(tool_use.ToolRecipe())["train"][:2000]
    targets = tool_use.warm_start_targets(rows, 0.3, seed=0)
    called = sum(t["answer"].startswith("<<") for t in targets) / len(targets)
    assert abs(called - 0.3) < 0.04  # 4 standard errors at n = 2000
    assert tool_use.warm_start_targets(rows, 0.3, seed=0) == targets
    for t, r in zip(targets, rows):
        assert t["answer"] in (r["answer"], tool_use.tool_target(r))
        assert tool_use.tool_answer_reward([t["answer"]], answer=[r["answer"]]) == [1.0]
    with pytest.raises(ValueError, match="tool_share"):
        tool_use.warm_start_targets(rows, 1.5, seed=0)


def test_the_noisy_calculator_is_wrong_at_its_rate_and_reproducible():
    noisy = tool_use.noisy_calculator(0.25, seed=3)
    answers = [noisy(f"{a}*{b}") for a, b in zip(range(100, 900), range(10, 810))]
    wrong = [ans != calculator(f"{a}*{b}") for ans, a, b in zip(answers, range(100, 900), range(10, 810))]
    assert abs(sum(wrong) / len(wrong) - 0.25) < 0.07  # 4.6 standard errors at n = 800
    assert all(len(x) == len(calculator(f"{a}*{b}")) for x, a, b in zip(answers, range(100, 900), range(10, 810)))
    again = tool_use.noisy_calculator(0.25, seed=3)
    assert [again(f"{a}*{b}") for a, b in zip(range(100, 900), range(10, 810))] == answers
    assert noisy.__name__ == "calculator"  # the model calls it by the calculator's name
    assert all(tool_use.noisy_calculator(0.0, seed=1)(e) == calculator(e) for e in ("12*3", "1/4"))


def test_the_recipe_refuses_bad_settings():
    with pytest.raises(ValueError, match="tool_share"):
        tool_use.ToolRecipe(tool_share=2)
    with pytest.raises(ValueError, match="digits_a"):
        tool_use.ToolRecipe(digits_a=0)
    recipe = tool_use.ToolRecipe()
    assert tool_use.ToolRecipe.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe
    with pytest.raises(ValueError, match="variant"):
        tool_use.run_variant("nope", None, None, {}, recipe, 0)


@pytest.mark.slow
def test_quick_runs_of_every_variant_and_their_summary(monkeypatch, tmp_path):
    monkeypatch.delenv(WARM_START_CACHE, raising=False)
    recipe = tool_use.ToolRecipe.quick()
    data = tool_use.make_tool_data(recipe)
    model, tok = tool_use.build_tool_model(recipe, 0)
    info = tool_use.warm_start(model, tok, data, recipe, 0, progress=False)
    assert info["steps"] == recipe.sft.steps and len(info["probe"]) == recipe.sft.steps // recipe.sft_check_every
    seeds = []
    for seed in (0, 1):
        runs = {v: tool_use.run_variant(v, model, tok, data, recipe, seed) for v in tool_use.VARIANTS}
        for v, run in runs.items():
            assert [p["step"] for p in run["curve"]] == [0, 1, 2] and len(run["history"]) == 2
            assert all(set(tool_use.CURVE_KEYS) <= set(p) for p in run["curve"])
            has_tool_fields = "tool_call_count" in run["history"][0]
            assert has_tool_fields == (v != "no_tool")  # the history's tool columns exist with tools only
        assert runs["unmasked"]["curve"][0] == runs["grpo"]["curve"][0]  # the same start, the same evaluation
        # the exact calculator's accuracy: the same evaluation where it is the variant's tool; a second one for the
        # noisy calculator's runs (and the no-tool run), the same policy with its calls answered right
        assert all(p["accuracy_exact"] == p["accuracy"] for v in ("grpo", "unmasked") for p in runs[v]["curve"])
        exact = tool_use.heldout_stats(runs["noisy_tool"]["model"], tok, data["test"], recipe.grpo_config(seed),
                                       tool_use.EVAL_SEED_OFFSET + seed, [calculator])
        assert runs["noisy_tool"]["curve"][-1]["accuracy_exact"] == exact["accuracy"]
        assert runs["noisy_tool"]["curve"][0]["accuracy_exact"] == runs["grpo"]["curve"][0]["accuracy"]  # one start
        seeds.append({"seed": seed, "variants": {v: {"curve": r["curve"]} for v, r in runs.items()}})
    summary = tool_use.summarize_tool_use(seeds)
    assert list(summary) == list(tool_use.VARIANTS) and summary["grpo"]["steps"] == [0, 1, 2]
    assert "vs_grpo" in summary["no_tool"] and "vs_grpo" not in summary["grpo"]
    acc = summary["grpo"]["accuracy"][0]
    want = sum(s["variants"]["grpo"]["curve"][0]["accuracy"] for s in seeds) / 2
    assert acc["mean"] == pytest.approx(want, abs=1e-12)


@pytest.mark.slow
def test_a_cached_warm_start_is_the_made_one(tmp_path, monkeypatch):
    monkeypatch.delenv(WARM_START_CACHE, raising=False)
    recipe = tool_use.ToolRecipe.quick()
    data = tool_use.make_tool_data(recipe)

    def make(cache):
        model, tok = tool_use.build_tool_model(recipe, 0)
        info = tool_use.warm_start(model, tok, data, recipe, 0, progress=False, cache=cache)
        return model, info, torch.get_rng_state()

    made, info, rng = make(tmp_path)
    loaded, info_again, rng_again = make(tmp_path)
    fresh, fresh_info, fresh_rng = make("")
    assert len(list(tmp_path.glob("warm_start_*.pt"))) == 1
    for other in (loaded, fresh):
        assert all(torch.equal(a, b) for a, b in zip(made.state_dict().values(), other.state_dict().values()))
    assert torch.equal(rng, rng_again) and torch.equal(rng, fresh_rng)
    assert info_again == info and {k: v for k, v in fresh_info.items() if k != "seconds"} == {
        k: v for k, v in info.items() if k != "seconds"}
    assert math.isfinite(info["seconds"])

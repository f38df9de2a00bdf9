"""The tiny-addition recipe: statistics, data split, and a small end-to-end run."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_tutorial.chapters.recipes import (
    RESULT_KEYS,
    TinyAdditionRecipe,
    accuracy_with_se,
    build_recipe_model,
    evaluate_heldout,
    make_recipe_data,
    make_recipe_trainer,
    paired_gain,
    result_summary,
    WARM_START_CACHE,
    run_tiny_addition,
    warm_start,
    warm_start_key,
)
from grpo_tutorial.rewards import answers_match, extract_answer
from grpo_tutorial.trainer import TIMING_KEYS

# ---------------------------------------------------------------- statistics


def test_accuracy_with_se_exact():
    acc, se = accuracy_with_se([True, False, True, True])
    assert acc == 0.75
    assert se == pytest.approx(math.sqrt(0.75 * 0.25 / 4))  # 0.2165...
    assert accuracy_with_se([1, 1, 1]) == (1.0, 0.0)
    assert accuracy_with_se([0] * 5) == (0.0, 0.0)


def test_paired_gain_exact():
    # differences: +1, +1, 0, -1 -> mean 0.25; sample var = (0.5625*2 + 0.0625 + 1.5625) / 3 = 0.9167
    gain, se = paired_gain([0, 0, 1, 1], [1, 1, 1, 0])
    assert gain == 0.25
    assert se == pytest.approx(math.sqrt((2 * 0.75**2 + 0.25**2 + 1.25**2) / 3 / 4))
    # identical outcomes: no change and no uncertainty
    assert paired_gain([True, False], [True, False]) == (0.0, 0.0)


def test_paired_se_is_smaller_than_unpaired_when_outcomes_agree():
    before = [1] * 40 + [0] * 60  # 40%
    after = [1] * 40 + [1] * 20 + [0] * 40  # the same 40 right, plus 20 more: 60%
    gain, se = paired_gain(before, after)
    assert gain == pytest.approx(0.2)
    unpaired = math.hypot(accuracy_with_se(before)[1], accuracy_with_se(after)[1])
    assert se < 0.7 * unpaired


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: accuracy_with_se([]), "correct is empty"),
        (lambda: accuracy_with_se([True, 2]), r"correct\[1\] must be True/False or 0/1, got 2"),
        (lambda: accuracy_with_se("101"), "correct must be a list"),
        (lambda: paired_gain([1, 0], [1]), "same problems, got 2 and 1"),
    ],
)
def test_statistics_reject_bad_input(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


# ------------------------------------------------------------------ recipe


def test_recipe_validation_names_the_field():
    with pytest.raises(ValueError, match=r"TinyAdditionRecipe.grpo_steps must be an int >= 1, got 0"):
        TinyAdditionRecipe(grpo_steps=0)
    with pytest.raises(ValueError, match=r"group_size"):  # checked by GRPOConfig
        TinyAdditionRecipe().with_settings(group_size=1)
    with pytest.raises(ValueError, match=r"sft_target_accuracy must be a number in \(0, 1\], got 1.5"):
        TinyAdditionRecipe(sft_target_accuracy=1.5)
    with pytest.raises(ValueError, match=r"only 100 exist with digits=1"):
        TinyAdditionRecipe(digits=1, n_test=90, n_probe=20)
    with pytest.raises(ValueError, match=r"GRPOConfig.learning_rate"):  # checked by GRPOConfig, at once
        TinyAdditionRecipe().with_settings(grpo_learning_rate=-1.0)
    with pytest.raises(ValueError, match=r"GRPOConfig.minibatch_size must be a divisor of"):
        TinyAdditionRecipe().with_settings(minibatch_size=100)
    with pytest.raises(TypeError, match=r"TinyAdditionRecipe.grpo must be a GRPOConfig, got dict"):
        TinyAdditionRecipe(grpo={"learning_rate": 1e-4})
    with pytest.raises(ValueError, match=r"'steps' is not a TinyAdditionRecipe setting"):
        TinyAdditionRecipe().with_settings(steps=3)


def test_recipe_builds_the_configs_it_describes():
    recipe = TinyAdditionRecipe()
    cfg = recipe.grpo_config(seed=7)
    assert (cfg.group_size, cfg.prompts_per_step, cfg.max_new_tokens) == (8, 32, 4)
    assert (cfg.learning_rate, cfg.num_iterations, cfg.clip_eps, cfg.beta, cfg.seed) == (
        1e-4, 1, 0.2, 0.0, 7,
    )
    assert (cfg.minibatch_size, cfg.updates_per_step) == (128, 2)
    sft = recipe.sft_config(seed=3)
    assert (sft.steps, sft.batch_size, sft.learning_rate, sft.seed) == (1000, 64, 1e-3, 3)
    assert recipe.num_threads == 1
    assert cfg.output_dir is None and recipe.grpo_config(seed=7, output_dir="run").output_dir == "run"
    assert TinyAdditionRecipe.quick(grpo_steps=9).grpo_steps == 9
    # the configs inside the recipe are the single source; a run's configs differ only in seed
    assert dataclasses.replace(cfg, seed=recipe.grpo.seed) == recipe.grpo
    assert dataclasses.replace(sft, seed=recipe.sft.seed) == recipe.sft


def test_with_settings_reaches_into_the_configs():
    recipe = TinyAdditionRecipe()
    changed = recipe.with_settings(grpo_learning_rate=1e-3, sft_max_steps=50, group_size=4, grpo_steps=7)
    assert (changed.grpo.learning_rate, changed.sft.steps, changed.grpo.group_size, changed.grpo_steps) == (
        1e-3, 50, 4, 7,
    )
    assert changed.grpo.prompts_per_step == recipe.grpo.prompts_per_step == 32
    assert (recipe.grpo.learning_rate, recipe.sft.steps, recipe.grpo_steps) == (1e-4, 1000, 400)  # untouched
    assert recipe.with_settings() == recipe


def test_stored_flat_records_read_back_as_the_same_recipe():
    # the committed tiny_learning.json (package data) stores the recipe as flat fields
    # (written before the recipe held its two configs); it must describe today's default recipe
    from grpo_tutorial.data import read_data

    stored = read_data("tiny_learning.json")
    for run in stored["runs"]:
        assert TinyAdditionRecipe.from_dict(run["recipe"]) == TinyAdditionRecipe()
    quick = TinyAdditionRecipe.quick(num_iterations=2)
    assert TinyAdditionRecipe.from_dict(json.loads(json.dumps(quick.to_dict()))) == quick


def test_data_split_is_disjoint_and_fixed_by_data_seed():
    recipe = TinyAdditionRecipe(n_train=3000, n_probe=100, n_test=400)
    data = make_recipe_data(recipe)
    assert [len(data[k]) for k in ("train", "probe", "test")] == [3000, 100, 400]
    train, probe, test = ({row["prompt"] for row in data[k]} for k in ("train", "probe", "test"))
    assert len(test) == 400 and len(probe) == 100  # held-out problems are distinct
    assert not (train & test) and not (train & probe) and not (probe & test)
    assert make_recipe_data(recipe) == data
    assert make_recipe_data(TinyAdditionRecipe(n_train=3000, n_probe=100, n_test=400, data_seed=1))["test"] != data["test"]
    row = data["test"][0]
    a, b = (int(x) for x in row["prompt"].rstrip("=").split("+"))
    assert row["answer"] == str(a + b) and 0 <= a <= 99 and 0 <= b <= 99


# --------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def quick_runs():
    recipe = TinyAdditionRecipe.quick()
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:  # two runs made from scratch, not one taken from make test's cache
        patch.delenv(WARM_START_CACHE, raising=False)
        first = run_tiny_addition(recipe, seed=0, progress=False)
        assert torch.get_num_threads() == threads, "the run must restore the caller's thread count"
        second = run_tiny_addition(recipe, seed=0, progress=False)
    return recipe, first, second


# ------------------------------------------------------ the warm-start cache


def _quick_warm_start(recipe, seed, **kwargs):
    model, tokenizer = build_recipe_model(recipe, seed)
    info = warm_start(model, tokenizer, make_recipe_data(recipe), recipe, seed, progress=False, **kwargs)
    return model, info, torch.get_rng_state()


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.slow
def test_a_cached_warm_start_is_the_made_one_with_the_rng_where_making_it_left_it(tmp_path, monkeypatch):
    monkeypatch.delenv(WARM_START_CACHE, raising=False)
    recipe = TinyAdditionRecipe.quick()
    made, made_info, made_rng = _quick_warm_start(recipe, 0, cache=tmp_path)
    assert len(list(tmp_path.glob("warm_start_*.pt"))) == 1
    torch.manual_seed(123)  # whatever the RNG was before, the loaded warm start leaves it as making it did
    loaded, loaded_info, loaded_rng = _quick_warm_start(recipe, 0, cache=tmp_path)
    assert _same_weights(made, loaded) and torch.equal(made_rng, loaded_rng)
    assert json.dumps(loaded_info, default=str) == json.dumps(made_info, default=str)  # its seconds are the making's
    fresh, fresh_info, fresh_rng = _quick_warm_start(recipe, 0)  # no cache: made again, the same bits
    assert _same_weights(made, fresh) and torch.equal(made_rng, fresh_rng)
    untimed = lambda info: {k: [{n: x for n, x in row.items() if n != "seconds"} for row in v] if k == "history" else v
                            for k, v in info.items() if k != "seconds"}  # noqa: E731
    assert untimed(fresh_info) == untimed(made_info)
    monkeypatch.setenv(WARM_START_CACHE, str(tmp_path))  # the variable names the folder too
    from_env, _, _ = _quick_warm_start(recipe, 0)
    assert _same_weights(made, from_env) and len(list(tmp_path.glob("warm_start_*.pt"))) == 1


def test_the_warm_start_key_holds_what_decides_its_bits():
    recipe = TinyAdditionRecipe.quick()
    data = make_recipe_data(recipe)
    model, tokenizer = build_recipe_model(recipe, 0)
    key = warm_start_key(model, tokenizer, data, recipe, 0)
    assert warm_start_key(model, tokenizer, data, recipe.with_settings(grpo_steps=9), 0) == key  # not the GRPO length
    assert warm_start_key(model, tokenizer, data, recipe, 1) != key
    assert warm_start_key(model, tokenizer, data, recipe.with_settings(sft_learning_rate=1e-4), 0) != key
    assert warm_start_key(build_recipe_model(recipe, 1)[0], tokenizer, data, recipe, 0) != key  # other weights
    assert warm_start_key(model, tokenizer, dict(data, train=data["train"][1:]), recipe, 0) != key
    # the variables that pick the kernels (from a mapping: a test never changes its own process's kernel variables)
    assert warm_start_key(model, tokenizer, data, recipe, 0, env={"ONEDNN_MAX_CPU_ISA": "AVX2_WITH_ANYTHING"}) != key


def test_without_a_cache_folder_nothing_is_cached(monkeypatch):
    from grpo_tutorial import sft
    from grpo_tutorial.chapters import recipes

    monkeypatch.delenv(WARM_START_CACHE, raising=False)

    def refuse(*args, **kwargs):
        raise AssertionError("the cache was used")

    monkeypatch.setattr(recipes, "cached_warm_start", refuse)
    monkeypatch.setattr(sft, "supervised_warmup", lambda *args, **kwargs: [])  # what sft.warm_start_until runs
    recipe = TinyAdditionRecipe.quick()
    model, tokenizer = build_recipe_model(recipe, 0)
    assert warm_start(model, tokenizer, make_recipe_data(recipe), recipe, 0, progress=False)["steps"] == 0
    monkeypatch.setenv(WARM_START_CACHE, "/nonexistent/never")
    assert warm_start(model, tokenizer, make_recipe_data(recipe), recipe, 0, progress=False, cache="")["steps"] == 0


@pytest.mark.slow
def test_run_returns_documented_keys(quick_runs):
    recipe, result, _ = quick_runs
    assert set(result) == set(RESULT_KEYS)
    assert len(result["history"]) == recipe.grpo_steps
    assert [row["step"] for row in result["history"]] == list(range(1, recipe.grpo_steps + 1))
    for key in ("warm_start", "grpo", "eval", "total", "grpo_cpu", "total_cpu"):
        assert result["seconds"][key] > 0, key
    assert result["seconds"]["total"] >= result["seconds"]["warm_start"] + result["seconds"]["grpo"]
    for phase in ("before", "after"):
        ev = result[phase]
        assert ev["n"] == len(ev["correct"]) == len(ev["completions"]) == recipe.n_test
        assert (ev["accuracy"], ev["se"]) == accuracy_with_se(ev["correct"])
    assert result["heldout_curve"][0] == (0, result["before"]["accuracy"], result["before"]["se"])
    assert result["heldout_curve"][-1] == (recipe.grpo_steps, result["after"]["accuracy"], result["after"]["se"])
    assert result["gain"] == pytest.approx(result["after"]["accuracy"] - result["before"]["accuracy"])
    # the warm start left partial skill, so GRPO saw groups with mixed rewards and a real gradient
    assert any(row["frac_zero_std"] < 1 and row["grad_norm"] > 0 for row in result["history"])
    # two minibatches per step: the second is scored after the first update, so its ratios move
    assert max(row["ratio_max"] for row in result["history"]) > 1.001


@pytest.mark.slow
def test_correct_flags_are_the_scored_completions(quick_runs):
    recipe, result, _ = quick_runs
    test_rows = make_recipe_data(recipe)["test"]
    for phase in ("before", "after"):
        ev = result[phase]
        expected = [answers_match(extract_answer(c), r["answer"]) for c, r in zip(ev["completions"], test_rows)]
        assert ev["correct"] == expected


@pytest.mark.slow
def test_warm_start_stops_at_the_first_check_over_the_target(quick_runs):
    recipe, result, _ = quick_runs
    ws = result["warm_start"]
    checks = ws["probe_accuracy"]
    assert ws["reached"] is True
    assert checks[-1][1] >= recipe.sft_target_accuracy
    assert all(acc < recipe.sft_target_accuracy for _, acc in checks[:-1])
    assert [step for step, _ in checks] == [recipe.sft_check_every * k for k in range(1, len(checks) + 1)]
    assert ws["steps"] == len(ws["history"]) == checks[-1][0] < recipe.sft.steps


@pytest.mark.slow
def test_same_seed_same_result(quick_runs):
    _, first, second = quick_runs
    for phase in ("before", "after"):
        assert first[phase]["completions"] == second[phase]["completions"]
    assert first["warm_start"]["probe_accuracy"] == second["warm_start"]["probe_accuracy"]
    assert [h["loss"] for h in first["warm_start"]["history"]] == [h["loss"] for h in second["warm_start"]["history"]]
    strip = lambda rows: [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows]  # noqa: E731
    assert json.dumps(strip(first["history"])) == json.dumps(strip(second["history"]))
    for (name, a), (_, b) in zip(first["model"].state_dict().items(), second["model"].state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.slow
def test_phases_by_hand_give_the_same_run(quick_runs):
    """Chapter 8 runs the phases one cell at a time; that must be the benchmark's run."""
    recipe, result, _ = quick_runs
    seed = 0
    previous = torch.get_num_threads()
    torch.set_num_threads(recipe.num_threads)
    try:
        data = make_recipe_data(recipe)
        model, tokenizer = build_recipe_model(recipe, seed)
        warm = warm_start(model, tokenizer, data, recipe, seed, progress=False)
        trainer = make_recipe_trainer(model, tokenizer, recipe, seed)
        before = evaluate_heldout(trainer, data["test"])
        curve = [before["accuracy"]]
        for stop in range(recipe.eval_every, recipe.grpo_steps + 1, recipe.eval_every):
            trainer.train(data["train"], stop, progress=False)
            curve.append(evaluate_heldout(trainer, data["test"])["accuracy"])
    finally:
        torch.set_num_threads(previous)
    assert warm["probe_accuracy"] == result["warm_start"]["probe_accuracy"]
    assert before["correct"] == result["before"]["correct"]
    assert curve == [acc for _, acc, _ in result["heldout_curve"]]
    assert len(curve) == recipe.grpo_steps // recipe.eval_every + 1
    for (name, a), (_, b) in zip(model.state_dict().items(), result["model"].state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.slow
def test_summary_is_json_and_drops_the_model(quick_runs):
    recipe, result, _ = quick_runs
    summary = result_summary(result, include_history=True)
    text = json.dumps(summary)
    back = json.loads(text)
    assert back["before"]["accuracy"] == result["before"]["accuracy"]
    assert back["recipe"] == recipe.to_dict()
    assert back["grpo_steps"] == recipe.grpo_steps and len(back["history"]) == recipe.grpo_steps
    assert "model" not in back and "correct" not in back["after"]
    with pytest.raises(ValueError, match="missing"):
        result_summary({"seed": 0})


def test_run_rejects_bad_arguments():
    with pytest.raises(TypeError, match="recipe must be a TinyAdditionRecipe"):
        run_tiny_addition({"grpo_steps": 3}, seed=0)
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -1"):
        run_tiny_addition(TinyAdditionRecipe.quick(), seed=-1)


@pytest.mark.slow
def test_benchmark_script_runs_as_a_script(tmp_path):
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "tiny.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "tiny_learning.py"), "--quick", "--seeds", "3",
         "--no-progress", "--set", "grpo_steps=2", "--out", str(out)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "gain (points)" in proc.stdout
    record = json.loads(out.read_text())
    (run,) = record["runs"]
    assert run["seed"] == 3 and run["grpo_steps"] == 2 and run["recipe"]["grpo_steps"] == 2
    assert run["gain"] == pytest.approx(run["after"]["accuracy"] - run["before"]["accuracy"])
    assert run["load"]["n"] >= 1 and run["meets_target"] is False  # a 1-digit smoke run proves nothing


def test_benchmark_overrides_are_checked():
    from benchmarks.tiny_learning import parse_overrides

    assert parse_overrides(["grpo_steps=400", "grpo_learning_rate=5e-5"]) == {
        "grpo_steps": 400, "grpo_learning_rate": 5e-5,
    }
    with pytest.raises(ValueError, match="not a TinyAdditionRecipe field"):
        parse_overrides(["steps=3"])
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        parse_overrides(["grpo_steps"])

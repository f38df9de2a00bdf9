"""The one sweep runner of chapters 14 and 15 (``grpo_tutorial.chapters.sweep``): both chapters' runs come out of it
with the same common fields from the same start, each chapter adding only its own; one seed's runner restores the
thread count and refuses settings it does not have; chapter 12's lab starts its seeds the same way."""

from __future__ import annotations

import warnings

import pytest
import torch

from grpo_tutorial.chapters import low_rank, mismatch_lab, sweep
from grpo_tutorial.chapters.recipes import TinyAdditionRecipe

#: The fields every run of the runner has, whatever the chapter adds (``seconds`` and ``seconds_per_step`` time it).
COMMON = ("overrides", "heldout_curve", "reward_curve", "start_correct", "final_correct", "final_accuracy", "gain",
          "gain_se", "seconds", "seconds_per_step", "steps")


@pytest.fixture(scope="module")
def started():
    recipe = TinyAdditionRecipe.quick(grpo_steps=2, eval_every=1)
    with sweep.recipe_threads(recipe):
        data, model, tokenizer, sft = sweep.seed_start(recipe, 0)
    return recipe, data, model, tokenizer, sft


def test_both_chapters_runs_are_the_one_runners_with_their_own_fields_added(started):
    recipe, data, model, tokenizer, _ = started
    seen = []

    def describe(trainer, first, final, curve):
        seen.append((trainer.step, first["accuracy"], final["accuracy"], len(curve)))
        return {"extra": 1}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = sweep.run_setting(model, tokenizer, data, recipe, {}, 0, describe=describe)
        lora = low_rank.run_setting(model, tokenizer, data, recipe, {}, 0)
        mismatch = mismatch_lab.run_setting(model, tokenizer, data, recipe, {}, 0)
    assert list(plain) == [*COMMON[:8], "extra", *COMMON[8:]]
    assert seen == [(2, plain["heldout_curve"][0][1], plain["final_accuracy"], 3)]  # the finished run's
    assert set(lora) == set(COMMON) | {"trained_parameters", "optimizer_state_bytes"}
    assert set(mismatch) == set(COMMON) | {"mismatch_curves", "skipped_updates", "min_accuracy", "collapsed"}
    for key in COMMON:
        if "seconds" not in key:  # the same start, the same setting: the same run, bit for bit
            assert lora[key] == plain[key] == mismatch[key], key
    assert lora["trained_parameters"] == sum(p.numel() for p in model.parameters())  # full fine-tuning
    assert mismatch["min_accuracy"] == min(p[1] for p in plain["heldout_curve"])


def test_one_seeds_runner_restores_the_threads_and_refuses_an_unknown_setting(started, monkeypatch):
    recipe, data, model, tokenizer, sft = started
    recipe = recipe.with_settings(num_threads=1)
    monkeypatch.setattr(sweep, "seed_start", lambda r, s: (data, model, tokenizer, sft))
    torch.set_num_threads(2)
    threads = []

    def run(name, overrides, m, t, d):
        threads.append(torch.get_num_threads())
        assert (m, t, d) == (model, tokenizer, data)
        return {"name": name, **overrides}

    def settings(m):
        return {"a": {"x": 1}, "b": {"x": 2}}

    out = sweep.run_sweep_seed(recipe, 3, settings, run, only=["b"], describe_start=lambda m: {"base": 7})
    assert list(out) == ["seed", "warm_start", "base", "settings", "seconds"]
    assert out["seed"] == 3 and out["base"] == 7 and out["settings"] == {"b": {"name": "b", "x": 2}}
    assert out["warm_start"] == {k: sft[k] for k in ("steps", "seconds", "reached")}
    assert threads == [1] and torch.get_num_threads() == 2
    with pytest.raises(ValueError, match=r"unknown settings \['c'\]"):
        sweep.run_sweep_seed(recipe, 3, settings, run, only=["c"])
    assert torch.get_num_threads() == 2  # restored after the error too


def test_the_chapters_sweeps_and_the_lab_start_their_seeds_in_the_runner():
    """Chapter 12's lab, 14 and 15 call the runner; none keeps its own copy of the loop or the warm start."""
    import inspect

    from grpo_tutorial.chapters import lab

    for module in (low_rank, mismatch_lab):
        source = inspect.getsource(module)
        assert "sweep_runner.run_setting(" in source and "sweep_runner.run_sweep_seed(" in source, module.__name__
        assert "evaluate_policy(" not in source and "warm_start(" not in source, module.__name__
    lab_source = inspect.getsource(lab.run_seed)
    assert "seed_start(recipe, seed)" in lab_source and "recipe_threads(recipe)" in lab_source
    assert "set_num_threads" not in lab_source

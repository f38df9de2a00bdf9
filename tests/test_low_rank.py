"""Chapter 14's experiment code (``grpo_tutorial.chapters.low_rank``): the parameter counts match PEFT's, the
attention-only rank matches the count, the summary picks each family's best rate and pairs by seed, and a quick
sweep runs end to end."""

from __future__ import annotations

import copy
import math

import pytest

from grpo_tutorial.chapters.low_rank import (
    ATTENTION, LowRankSweep, combine_sweeps, lora_parameter_count, matched_rank, run_sweep_seed, summarize_sweep,
)
from grpo_tutorial.chapters.recipes import TinyAdditionRecipe

peft = pytest.importorskip("peft")


@pytest.mark.parametrize("targets", ["all-linear", list(ATTENTION)])
@pytest.mark.parametrize("rank", [1, 4])
def test_the_count_is_what_peft_trains(tiny_policy, rank, targets):
    model, _ = tiny_policy
    adapted = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=rank, target_modules=targets))
    trained = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert lora_parameter_count(model, rank, targets) == trained


def test_the_attention_rank_matches_the_count(tiny_policy):
    model, _ = tiny_policy
    # the tiny model: per layer and rank, 4 x 256 in attention, 3 x 640 more in the MLP; 3 layers
    assert lora_parameter_count(model, 1) == 3 * (4 * 256 + 3 * 640)
    assert lora_parameter_count(model, 1, ATTENTION) == 3 * 4 * 256
    r = matched_rank(model, 4)
    assert r == 12  # 4 * 8832 / 3072 = 11.5, and 12 is nearer than 11
    goal = lora_parameter_count(model, 4)
    for other in (r - 1, r + 1):
        assert abs(lora_parameter_count(model, other, ATTENTION) - goal) >= abs(
            lora_parameter_count(model, r, ATTENTION) - goal)
    with pytest.raises(ValueError, match="matches"):
        lora_parameter_count(model, 1, ["nothing_here"])


def _run(lr: float, final: float, start: float = 0.5) -> dict:
    return {"overrides": {"learning_rate": lr}, "heldout_curve": [[0, start, 0.01], [10, final, 0.01]],
            "final_accuracy": final, "gain": final - start, "trained_parameters": 7, "optimizer_state_bytes": 56,
            "seconds_per_step": 0.1}


def test_the_summary_picks_each_familys_best_rate_and_pairs_by_seed():
    finals = {  # seed -> setting -> final accuracy
        0: {"full lr=0.001": 0.60, "full lr=0.01": 0.50, "all r=1 lr=0.01": 0.62, "all r=1 lr=0.1": 0.40},
        1: {"full lr=0.001": 0.70, "full lr=0.01": 0.52, "all r=1 lr=0.01": 0.69, "all r=1 lr=0.1": 0.41},
        2: {"full lr=0.001": 0.65, "full lr=0.01": 0.55, "all r=1 lr=0.01": 0.68, "all r=1 lr=0.1": 0.42},
    }
    seeds = [{"seed": s, "settings": {name: _run(float(name.split("lr=")[1]), acc) for name, acc in runs.items()}}
             for s, runs in finals.items()]
    summary = summarize_sweep(seeds)
    best = summary["families"]
    assert best["full"]["setting"] == "full lr=0.001" and best["all r=1"]["setting"] == "all r=1 lr=0.01"
    assert best["all r=1"]["lr_ratio_to_full"] == pytest.approx(10)
    vs = best["all r=1"]["vs_full"]
    assert vs["differences"] == pytest.approx([0.02, -0.01, 0.03]) and vs["mean"] == pytest.approx(0.04 / 3)
    assert "vs_full" not in best["full"]
    entry = summary["settings"]["full lr=0.001"]
    assert entry["final_accuracy"]["mean"] == pytest.approx(0.65)
    assert entry["heldout_mean"] == pytest.approx([0.5, 0.65])
    assert entry["heldout_se"][1] == pytest.approx(math.sqrt(0.0025 / 3))
    with pytest.raises(ValueError, match="empty"):
        summarize_sweep([])


@pytest.mark.filterwarnings("ignore::UserWarning")  # the quick recipe's 3-token answers
def test_a_quick_sweep_runs_every_setting_from_one_warm_start():
    recipe = TinyAdditionRecipe.quick(grpo_steps=2, eval_every=1)
    sweep = LowRankSweep(recipe=recipe, full_lrs=(1e-3,), lora_lrs=(1e-2,), ranks=(1,), matched_rank=1, seeds=(0,))
    result = run_sweep_seed(sweep, 0)
    names = list(result["settings"])
    assert names[:2] == ["full lr=0.001", "all r=1 lr=0.01"] and names[2].startswith("attn r=")
    assert result["settings"][names[2]]["overrides"]["lora_target_modules"] == list(ATTENTION)
    full, rank1 = result["settings"]["full lr=0.001"], result["settings"]["all r=1 lr=0.01"]
    assert full["heldout_curve"][0] == rank1["heldout_curve"][0]  # the same warm start
    assert rank1["trained_parameters"] == 1088 and full["trained_parameters"] == result["base_parameters"]
    assert rank1["optimizer_state_bytes"] == 8 * 1088  # AdamW: two float32 moments a trained weight
    assert [p[0] for p in rank1["heldout_curve"]] == [0, 1, 2] and len(rank1["reward_curve"]) == 2
    with pytest.raises(ValueError, match="unknown settings"):
        run_sweep_seed(sweep, 0, only=["full lr=1"])


def test_two_records_combine_by_seed_and_must_agree_where_they_overlap():
    def record(command, runs):
        return {"command": command, "sweep": {"recipe": {"digits": 2}},
                "seeds": [{"seed": s, "settings": {n: _run(float(n.split("lr=")[1]), acc) for n, acc in r.items()}}
                          for s, r in runs.items()]}

    main = record("main", {0: {"full lr=0.001": 0.6, "all r=1 lr=0.01": 0.5}, 1: {"full lr=0.001": 0.7,
                                                                                   "all r=1 lr=0.01": 0.6}})
    lower = record("lower", {0: {"full lr=0.001": 0.6, "all r=1 lr=0.001": 0.65}, 1: {"full lr=0.001": 0.7,
                                                                                       "all r=1 lr=0.001": 0.66}})
    seeds = combine_sweeps(main, lower)
    assert [sorted(s["settings"]) for s in seeds] == [["all r=1 lr=0.001", "all r=1 lr=0.01", "full lr=0.001"]] * 2
    assert summarize_sweep(seeds)["families"]["all r=1"]["setting"] == "all r=1 lr=0.001"
    lower["seeds"][1]["settings"]["full lr=0.001"]["final_accuracy"] = 0.71
    with pytest.raises(ValueError, match="disagree"):
        combine_sweeps(main, lower)
    with pytest.raises(ValueError, match="other seeds"):
        combine_sweeps(main, record("one seed", {0: {"full lr=0.001": 0.6}}))

"""Chapter 12's lab: pass@k, t quantiles, intervals and paired comparisons on exact examples,
and one tiny end-to-end lab run."""

from __future__ import annotations

import math
from itertools import combinations

import pytest

from grpo_tutorial.chapters import lab as L
from grpo_tutorial.chapters.recipes import TinyAdditionRecipe


# --- pass@k ----------------------------------------------------------------


def test_pass_at_k_exact_small_cases():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert L.pass_at_k(4, 1, 2) == pytest.approx(0.5, abs=1e-15)
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert L.pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-15)
    # k=1 is the fraction correct
    assert L.pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-15)
    # c = 0: never; n - c < k: always
    assert L.pass_at_k(8, 0, 8) == 0.0
    assert L.pass_at_k(4, 3, 2) == 1.0
    assert L.pass_at_k(64, 1, 64) == 1.0


def test_pass_at_k_is_the_fraction_of_k_subsets_with_a_correct_sample():
    # brute force: enumerate every size-k subset of n samples, c of which are correct
    for n, c, k in [(6, 2, 3), (7, 1, 4), (7, 3, 2), (5, 0, 2)]:
        samples = [True] * c + [False] * (n - c)
        subsets = list(combinations(range(n), k))
        expected = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
        assert L.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_where_binomials_are_huge():
    # C(64, 32) ~ 1.8e18; the product form agrees with exact integer arithmetic
    n, c, k = 64, 5, 32
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert L.pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)
    assert L.pass_at_k_curve([0, 5, 64], 64, [1, 32]) == pytest.approx([(0 + 5 / 64 + 1) / 3, (0 + exact + 1) / 3])


def test_pass_at_k_refuses_bad_arguments():
    with pytest.raises(ValueError, match="c = 5 correct samples cannot exceed n = 4"):
        L.pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k must be in 1..n"):
        L.pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="k must be in 1..n"):
        L.pass_at_k(4, 1, 0)


# --- t quantiles, intervals, paired comparison ----------------------------------------


def test_t_quantile_matches_closed_forms():
    # df=1 is the Cauchy distribution: q(p) = tan(pi (p - 1/2))
    assert L.t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-7)
    # df=2: q(p) = (2p - 1) / sqrt(2 p (1 - p))
    for p in (0.9, 0.975):
        assert L.t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-7)
    assert L.t_quantile(0.025, 2) == pytest.approx(-L.t_quantile(0.975, 2))
    # large df tends to the normal quantile 1.959964
    assert L.t_quantile(0.975, 2000) == pytest.approx(1.959964, abs=2e-3)


def test_mean_ci_exact():
    # values 1, 2, 3: mean 2, sample std 1, se 1/sqrt(3); t(0.975, 2) = 4.302653
    out = L.mean_ci([1.0, 2.0, 3.0])
    se = 1 / math.sqrt(3)
    half = (0.95 / math.sqrt(2 * 0.975 * 0.025)) * se
    assert out["mean"] == 2.0
    assert out["se"] == pytest.approx(se, rel=1e-12)
    assert (out["lo"], out["hi"]) == pytest.approx((2 - half, 2 + half), rel=1e-7)
    one = L.mean_ci([0.4])
    assert one["mean"] == 0.4 and math.isnan(one["se"]) and math.isnan(one["lo"])
    with pytest.raises(ValueError, match="empty"):
        L.mean_ci([])


def test_paired_comparison_uses_per_seed_differences():
    method = {0: 0.50, 1: 0.60, 2: 0.70, 5: 0.9}
    grpo = {0: 0.40, 1: 0.50, 2: 0.50}
    out = L.paired_comparison(method, grpo)
    assert out["seeds"] == [0, 1, 2]  # seed 5 has no partner
    assert out["differences"] == pytest.approx([0.1, 0.1, 0.2])
    assert out["mean"] == pytest.approx(0.4 / 3)
    # the differences' sample std is sqrt(1/300); the separate-run spreads do not enter
    assert out["se"] == pytest.approx(math.sqrt(1 / 300) / math.sqrt(3))
    with pytest.raises(ValueError, match="no seed in common"):
        L.paired_comparison({3: 0.1}, {4: 0.2})


def test_lab_settings_refuse_unknown_methods_and_missing_grpo():
    with pytest.raises(ValueError, match="unknown names"):
        L.LabSettings(recipe=TinyAdditionRecipe.quick(), methods=("grpo", "ppo"), passk_problems=10)
    with pytest.raises(ValueError, match="must include 'grpo'"):
        L.LabSettings(recipe=TinyAdditionRecipe.quick(), methods=("rloo",), passk_problems=10)


def test_each_method_config_differs_from_grpo_only_in_its_options():
    settings = L.LabSettings(recipe=TinyAdditionRecipe.quick(), passk_problems=10)
    base = settings.grpo_config("grpo", 0).to_dict()
    for method, options in L.LAB_METHODS.items():
        if options is None:
            assert settings.grpo_config(method, 0) is None
            continue
        cfg = settings.grpo_config(method, 0).to_dict()
        changed = {k for k in cfg if cfg[k] != base[k]}
        assert changed <= set(options), (method, changed)
    reinforce = settings.grpo_config("reinforce", 0)
    # one on-policy update per step: the ratio is exactly 1, so the clip never acts
    assert reinforce.updates_per_step == 1 and reinforce.num_iterations == 1


# --- end to end ------------------------------------------------------------


@pytest.mark.slow
def test_tiny_lab_run_and_summary():
    settings = L.LabSettings(
        recipe=TinyAdditionRecipe.quick(grpo_steps=2, eval_every=1),
        methods=("grpo", "reinforce", "rft"), seeds=(0,), passk_problems=6, passk_n=4,
    )
    runs = [L.run_seed(settings, seed, progress=False) for seed in (0, 1)]
    for r in runs:
        assert set(r["methods"]) == {"grpo", "reinforce", "rft"}
        for m in r["methods"].values():
            assert m["steps"] == 2 and len(m["curve"]) == 2
            assert [p[0] for p in m["heldout_curve"]] == [0, 1, 2]
            # every method starts from the same warm start: same step-0 accuracy
            assert m["heldout_curve"][0][1] == r["methods"]["grpo"]["heldout_curve"][0][1]
            # the per-problem outcomes behind the step-0 and final accuracies (for paired gains)
            n = len(m["final_correct"])
            assert len(m["start_correct"]) == n == settings.recipe.n_test
            assert sum(m["start_correct"]) / n == pytest.approx(m["heldout_curve"][0][1])
            assert sum(m["final_correct"]) / n == pytest.approx(m["final_accuracy"])
        rft = r["methods"]["rft"]["curve"]
        assert all(0 <= row["reward_mean"] <= 1 for row in rft)
        assert len(r["passk"]["before"]) == 6 and all(0 <= c <= 4 for c in r["passk"]["after"])
    s = L.summarize_lab(runs)
    grpo_final = [r["methods"]["grpo"]["final_accuracy"] for r in runs]
    assert s["methods"]["grpo"]["mean"] == pytest.approx(sum(grpo_final) / 2)
    diffs = [r["methods"]["rft"]["final_accuracy"] - r["methods"]["grpo"]["final_accuracy"] for r in runs]
    assert s["methods"]["rft"]["vs_grpo"]["differences"] == pytest.approx(diffs)
    assert s["passk"]["ks"] == [1, 2, 3, 4]
    before0 = L.pass_at_k_curve(runs[0]["passk"]["before"], 4, [1, 2, 3, 4])
    assert s["passk"]["per_seed_before"][0] == pytest.approx(before0)
    # pass@k never falls as k grows
    for curve in s["passk"]["per_seed_after"]:
        assert all(a <= b + 1e-12 for a, b in zip(curve, curve[1:]))


def test_rejection_sampling_trains_only_on_correct_samples(monkeypatch):
    from grpo_tutorial.chapters.recipes import build_recipe_model

    recipe = TinyAdditionRecipe.quick(prompts_per_step=2, group_size=4, minibatch_size=4)
    model, tok = build_recipe_model(recipe, 0)
    rft = L.RejectionSamplingFT(model, tok, recipe, seed=0)
    rows = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "4+4=", "answer": "8"}]
    seen = []
    monkeypatch.setattr(L, "encode_sft_batch", lambda t, batch: (seen.extend(batch), __import__(
        "grpo_tutorial.sft", fromlist=["x"]).encode_sft_batch(t, batch))[1])
    fake = type("R", (), {"completions": ["3", "5", "3", "x", "8", "8", "1", "9"]})()
    monkeypatch.setattr(L, "generate_rollouts", lambda *a, **k: fake)
    row = rft.train_step(rows)
    assert row["kept"] == 4 and row["reward_mean"] == 0.5
    assert sorted(r["answer"] for r in seen) == ["3", "3", "8", "8"]


# --- the committed results file ------------------------------------------------


def _nan_to_none(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_to_none(v) for v in value]
    return value


def _assert_close(ours, stored, where="summary"):
    if isinstance(stored, dict):
        assert isinstance(ours, dict) and set(ours) == set(stored), where
        for k in stored:
            _assert_close(ours[k], stored[k], f"{where}.{k}")
    elif isinstance(stored, list):
        assert isinstance(ours, list) and len(ours) == len(stored), where
        for i, (a, b) in enumerate(zip(ours, stored)):
            _assert_close(a, b, f"{where}[{i}]")
    elif isinstance(stored, float):
        assert ours == pytest.approx(stored, rel=1e-12, abs=1e-15), where
    else:
        assert ours == stored, where


def test_committed_lab_results_are_complete_and_their_summary_is_recomputable():
    import importlib.resources
    import json

    path = importlib.resources.files("grpo_tutorial") / "data" / "lab_results.json"
    results = json.loads(path.read_text())
    assert not results["quick"], "the committed file must come from the full lab, not --quick"
    assert len(results["seeds"]) >= 3
    run = set(results["settings"]["methods"])
    assert run | set(results["missing_methods"]) == set(L.LAB_METHODS)
    assert {"reinforce", "rft", "grpo"} <= run  # both controls and the reference
    steps = results["settings"]["recipe"]["grpo_steps"]
    for seed in results["seeds"]:
        assert set(seed["methods"]) == run
        for m in seed["methods"].values():
            assert m["steps"] == steps and len(m["curve"]) == steps
        assert len(seed["passk"]["before"]) == results["settings"]["passk_problems"]
        assert results["settings"]["passk_n"] == 64 == seed["passk"]["n"]
    # the stored summary is exactly what the package computes from the per-seed results
    _assert_close(_nan_to_none(L.summarize_lab(results["seeds"])), results["summary"])
    assert "load average" in results["load"]["uptime_start"]
    assert results["wall_seconds"] <= 3600


def test_lab_command_keeps_finished_seeds_in_its_cache(tmp_path, monkeypatch):
    """`python -m benchmarks.lab --cache DIR` runs a seed once: an interrupted or extended command takes the
    finished seeds again (the stamp leaves out the list of seeds), and a cache of other settings is refused."""
    from contextlib import ExitStack

    from benchmarks import lab as bench
    from benchmarks.common import open_cache

    ran = []

    def fake_seed(settings, seed, progress):
        ran.append(seed)
        return {"seed": seed, "made_by": "the first command"}

    monkeypatch.setattr(bench, "_run_seed", fake_seed)
    settings = bench.settings_for(bench.build_parser().parse_args(["--quick", "--seeds", "0"]))
    more = bench.settings_for(bench.build_parser().parse_args(["--quick", "--seeds", "0", "1"]))
    with ExitStack() as stack:
        folder = open_cache(tmp_path, bench._SeedFree(settings), stack)
        assert bench._one_seed(settings, 0, False, folder) == {"seed": 0, "made_by": "the first command"}
        folder = open_cache(tmp_path, bench._SeedFree(more), stack)  # more seeds: the same cache
        assert [bench._one_seed(more, s, False, folder)["seed"] for s in (0, 1)] == [0, 1]
    assert ran == [0, 1]  # seed 0 once
    other = bench.settings_for(bench.build_parser().parse_args(["--quick", "--seeds", "0", "--passk-n", "8"]))
    with ExitStack() as stack, pytest.raises(SystemExit, match="another recipe"):
        open_cache(tmp_path, bench._SeedFree(other), stack)

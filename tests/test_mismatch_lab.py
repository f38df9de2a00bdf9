"""Chapter 15's experiment code (``grpo_tutorial.chapters.mismatch_lab``) and its benchmark (``benchmarks/mismatch.py``).

The grid names every sampler with every correction mode, and each setting is a
valid ``GRPOConfig``; the nucleus mass is computed apart from the top-p sampler's
log-probs and equals the ratio pi / mu of every sampled token; the summary pairs
each setting with the on-policy baseline by seed and counts collapses; the
benchmark's ``--quick`` run writes a record with its provenance; chapter 11's
mapping table names the sampler and correction fields.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from grpo_tutorial import GRPOConfig
from grpo_tutorial.chapters.mismatch_lab import (
    BASELINE, MismatchSweep, measure_mismatch, nucleus_mass, sampler_overrides, summarize_mismatch,
)
from grpo_tutorial.tasks import make_arithmetic_dataset
from grpo_tutorial.trainer import GRPOTrainer
from grpo_tutorial.rewards import correctness_reward

ROOT = Path(__file__).resolve().parent.parent


def test_the_grid_is_every_sampler_with_every_mode_and_each_setting_is_a_config():
    sweep = MismatchSweep()
    settings = sweep.settings()
    assert list(settings)[0] == BASELINE and settings[BASELINE] == {}
    assert len(settings) == 1 + len(sweep.samplers) * len(sweep.modes) == 16
    assert len(sweep.seeds) >= 5
    base = sweep.recipe.grpo_config(0).to_dict()
    for name, overrides in settings.items():
        config = GRPOConfig(**{**base, **overrides})  # every setting is a valid config
        if name == BASELINE:
            assert config.sampler == "policy"
            continue
        sampler, mode = name.split(" | ")
        assert config.vllm_importance_sampling_correction == (mode != "none")
        if mode != "none":
            assert config.vllm_importance_sampling_mode == mode
            assert (config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max) == (None, 3.0)
    assert sampler_overrides("stale k=16") == {"sampler": "stale", "sampler_staleness": 16}
    assert sampler_overrides("top_p=0.8") == {"sampler": "top_p", "top_p": 0.8}
    with pytest.raises(ValueError, match="unknown sampler"):
        sampler_overrides("fp8")
    with pytest.raises(ValueError, match="start with 'none'"):
        MismatchSweep(modes=("sequence_mask",))


def _trainer(tiny_policy, **overrides):
    model, tokenizer = tiny_policy
    config = GRPOConfig(group_size=4, prompts_per_step=4, max_new_tokens=4, seed=0, **overrides)
    return GRPOTrainer(model, tokenizer, correctness_reward, config)


def test_the_top_p_ratio_of_every_sampled_token_is_its_nucleus_mass(tiny_policy):
    trainer = _trainer(tiny_policy, sampler="top_p", top_p=0.8)
    rows = make_arithmetic_dataset(8, seed=0)
    rollout = trainer.grpo_step.sampler([r["prompt"] for r in rows[:4]], 123)
    logp = trainer.grpo_step.logprobs(trainer.model, rollout, entropy=False)  # [N, Tc]
    mask = rollout.completion_mask.bool()
    ratio = (logp - rollout.sampler_logprobs).exp()[mask]
    mass = nucleus_mass(trainer.model, rollout, temperature=1.0, top_p=0.8)[mask]
    assert torch.allclose(ratio, mass, atol=1e-5)
    assert bool((mass <= 1 + 1e-6).all()) and bool((mass >= 0.8 - 1e-5).all())  # the nucleus reaches top_p
    measured = measure_mismatch(trainer, rows, batches=2, seed=0, keep_tokens=True)
    assert measured["ratio_minus_mass_max"] < 1e-5
    assert measured["ratio_mean"] == pytest.approx(measured["nucleus_mass_mean"], abs=1e-6)
    assert measured["log_ratio_quantiles"]["0.99"] <= 1e-6  # a nucleus never holds more than all the mass
    assert len(measured["token_log_ratios"]) == measured["tokens"]
    assert sum(v["n"] for v in measured["sequence_by_length"].values()) == measured["completions"] == 2 * 16


def test_the_measurement_leaves_the_policy_alone_and_needs_a_sampler(tiny_policy):
    trainer = _trainer(tiny_policy, sampler="bfloat16")
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    measured = measure_mismatch(trainer, make_arithmetic_dataset(8, seed=0), batches=1, seed=0)
    assert all(torch.equal(v, trainer.model.state_dict()[k]) for k, v in before.items())
    assert 0 < measured["log_ratio_abs_mean"] < 0.1  # bfloat16 rounding: small, not zero
    assert 0 < measured["diagnostics"]["mismatch/ess"] <= 1
    with pytest.raises(ValueError, match="no mismatch"):
        measure_mismatch(_trainer(tiny_policy), make_arithmetic_dataset(8, seed=0), batches=1, seed=0)


def _run(final: float, start: float = 0.4, collapsed: bool = False, ess: float | None = None) -> dict:
    curves = {} if ess is None else {"mismatch/ess": [ess, ess], "mismatch/kl": [0.1, 0.3]}
    return {"heldout_curve": [[0, start, 0.01], [10, final, 0.01]], "final_accuracy": final, "gain": final - start,
            "collapsed": collapsed, "seconds_per_step": 0.1, "mismatch_curves": curves}


def test_the_summary_pairs_with_the_baseline_by_seed_and_counts_collapses():
    finals = {0: (0.60, 0.55, 0.10), 1: (0.70, 0.64, 0.50), 2: (0.65, 0.61, 0.52)}
    seeds = []
    for s, (base, stale, bad) in finals.items():
        seeds.append({"seed": s, "settings": {
            BASELINE: _run(base),
            "stale k=4 | none": _run(stale, ess=0.9) | {"measurement": {
                "ratio_mean": 1.0 + s, "diagnostics": {"mismatch/ess": 0.5},
                "sequence_by_length": {"2": {"n": 2, "mean": float(s), "sd": 1.0, "mean_ratio": 1.0}}}},
            "stale k=4 | sequence_mask": _run(bad, collapsed=bad < 0.2, ess=0.8),
        }})
    summary = summarize_mismatch(seeds)
    table = summary["settings"]
    vs = table["stale k=4 | none"]["vs_policy"]
    assert vs["differences"] == pytest.approx([-0.05, -0.06, -0.04]) and vs["hi"] < 0
    assert "vs_policy" not in table[BASELINE] and table[BASELINE]["mismatch"] == {}
    assert table["stale k=4 | sequence_mask"]["collapsed"] == 1 and table["stale k=4 | sequence_mask"]["runs"] == 3
    assert table["stale k=4 | none"]["mismatch"]["mismatch/kl"] == pytest.approx(0.2)
    assert (table["stale k=4 | none"]["sampler"], table["stale k=4 | none"]["mode"]) == ("stale k=4", "none")
    measured = summary["samplers"]["stale k=4"]
    assert measured["ratio_mean"] == pytest.approx(2.0) and measured["seeds"] == 3
    assert measured["sequence_by_length"]["2"] == {"n": 6, "mean": pytest.approx(1.0), "sd": 1.0, "mean_ratio": 1.0}


def test_the_benchmarks_quick_run_writes_a_record_with_its_provenance(tmp_path):
    from benchmarks import mismatch as bench

    out = tmp_path / "sampler_mismatch.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bench.main(["--quick", "--jobs", "1", "--no-progress", "--out", str(out)])
    record = json.loads(out.read_text())
    for key in ("command", "package_commit", "package_dirty", "wall_seconds", "load", "machine", "sweep", "summary"):
        assert key in record, key
    assert record["command"].startswith("python -m benchmarks.mismatch --quick")
    args = bench.build_parser().parse_args(record["command"].split()[3:])
    assert bench.sweep_for(args).to_dict() == record["sweep"]
    (seed,) = record["seeds"]
    settings = seed["settings"]
    assert list(settings) == list(bench.sweep_for(args).settings())
    for name, run in settings.items():
        assert ("measurement" in run) == (name != BASELINE and name.endswith("| none")), name
        assert [p[0] for p in run["heldout_curve"]] == [0, 2, 4]
    top_p = settings["top_p=0.8 | none"]["measurement"]
    assert top_p["ratio_minus_mass_max"] < 1e-5 and "token_log_ratios" in top_p
    assert len(top_p["sequences"]) == top_p["completions"]  # seed 0 keeps (length, sequence log-ratio) pairs
    assert set(record["summary"]["samplers"]) == {"bfloat16", "stale k=1", "top_p=0.8"}
    assert bench.DEFAULT_OUT == ROOT / "grpo_tutorial" / "data" / "sampler_mismatch.json"
    assert "Expected wall time" in bench.build_parser().format_help()


MISMATCH_FIELDS = ("sampler", "sampler_staleness", "vllm_importance_sampling_correction",
                   "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min",
                   "vllm_importance_sampling_clip_max")


def test_chapter_11s_mapping_names_the_sampler_and_correction_fields():
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "11_scaling_out.ipynb", as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code" and "MAPPING" in c.source)
    pairs = re.findall(r'\(\s*(None|"\w+"),\s*(None|"\w+"),', code)
    ours = {a.strip('"'): b.strip('"') for a, b in pairs if a != "None"}
    for name in MISMATCH_FIELDS:
        assert name in ours, f"chapter 11's mapping lacks {name}"
    for name in MISMATCH_FIELDS[2:]:
        assert ours[name] == name, f"{name} has TRL's name in both"
    trl = pytest.importorskip("trl")
    import dataclasses

    trl_fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert {v for v in ours.values() if v != "None"} <= trl_fields

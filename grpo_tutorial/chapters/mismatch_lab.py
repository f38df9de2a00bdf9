"""Chapter 15's experiment: when the sampler is not the learner, on chapter 8's task.

The completions of a real GRPO run come from a generation engine that is not the
trainer's model: a bfloat16 copy, a copy some optimizer updates stale, or the
same weights sampled with top-p. :mod:`grpo_tutorial.sampling.copies` holds those
samplers (``GRPOConfig.sampler``) and :mod:`grpo_tutorial.mismatch` TRL's
importance-sampling correction (``vllm_importance_sampling_*``). This module runs them on the tiny model and the
2-digit addition of chapter 8 (:mod:`grpo_tutorial.chapters.recipes`):

- one warm start per seed, shared by every setting of that seed (so the
  comparison between settings is paired: same start, same data);
- every setting of :meth:`MismatchSweep.settings`: the on-policy baseline
  (``"policy"``), then each sampler of :data:`SAMPLERS` uncorrected and with each
  correction mode of ``MismatchSweep.modes`` (TRL's bounds: ``clip_min=None``,
  ``clip_max=3``);
- per run: the held-out greedy accuracy curve, the final per-problem outcomes,
  the history's mismatch diagnostics per step (``mismatch/kl``, ``mismatch/ess``,
  ...), and whether the run collapsed (:data:`COLLAPSE_SHARE`);
- after each uncorrected run, :func:`measure_mismatch`: fresh batches from the
  run's own sampler, scored by its policy, with the per-token log-ratio
  log(pi / mu), the sequence log-ratio against the completion's length, and, for
  top-p, the mass the nucleus kept at every sampled position.

:func:`summarize_mismatch` puts the seeds together with
:func:`~grpo_tutorial.stats.mean_ci` and
:func:`~grpo_tutorial.stats.paired_comparison`: final accuracy and gain per
setting, each setting against the on-policy baseline paired by seed, the
collapses, the mismatch per sampler.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .._checks import check_int
from ..mismatch import mismatch_diagnostics
from ..stats import paired_comparison
from ..trainer import GRPOTrainer
from . import sweep as sweep_runner
from .recipes import TinyAdditionRecipe

__all__ = [
    "BASELINE",
    "COLLAPSE_SHARE",
    "MISMATCH_KEYS",
    "MismatchSweep",
    "measure_mismatch",
    "nucleus_mass",
    "run_setting",
    "run_sweep_seed",
    "sampler_overrides",
    "summarize_mismatch",
]

#: The on-policy baseline's setting name: the policy samples its own completions.
BASELINE = "policy"
#: A run has collapsed when its final held-out accuracy is below this share of the accuracy it started from.
COLLAPSE_SHARE = 0.5
#: The history's mismatch fields kept per step (:func:`grpo_tutorial.mismatch.mismatch_diagnostics`).
MISMATCH_KEYS = (
    "mismatch/logp_diff_mean", "mismatch/logp_diff_max", "mismatch/kl", "mismatch/kl_sequence",
    "mismatch/token_outside", "mismatch/sequence_outside", "mismatch/ess", "mismatch/weight_mean",
)
#: Quantiles of the per-token log-ratio the measurement keeps.
QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


def sampler_overrides(sampler: str) -> dict[str, Any]:
    """``GRPOConfig`` fields of a sampler named as the sweep names them.

    ``"bfloat16"``; ``"stale k=4"`` (a copy 4 optimizer updates behind);
    ``"top_p=0.8"`` (the policy sampling from the nucleus of 0.8).
    """
    if sampler == "bfloat16":
        return {"sampler": "bfloat16"}
    if sampler.startswith("stale k="):
        return {"sampler": "stale", "sampler_staleness": int(sampler.removeprefix("stale k="))}
    if sampler.startswith("top_p="):
        return {"sampler": "top_p", "top_p": float(sampler.removeprefix("top_p="))}
    raise ValueError(f"unknown sampler {sampler!r}; expected 'bfloat16', 'stale k=<int>' or 'top_p=<float>'")


@dataclass
class MismatchSweep:
    """What the experiment runs (see the module). The recipe's ``grpo_steps`` and ``eval_every`` apply to every run.

    The default recipe is chapter 8's with 60 GRPO steps, held-out evaluations
    every 20 steps on 300 problems, and six seeds (with two processes, seeds run
    in pairs, so a sixth seed costs no more wall time than a fifth); the corrections use TRL's defaults for the
    bounds (``clip_min=None``, ``clip_max=3``). ``measure_batches`` batches of
    the recipe's size are drawn after each uncorrected run for :func:`measure_mismatch`.
    """

    recipe: TinyAdditionRecipe = field(
        default_factory=lambda: TinyAdditionRecipe(grpo_steps=60, eval_every=20, n_test=300))
    samplers: tuple[str, ...] = ("bfloat16", "stale k=1", "stale k=4", "stale k=16", "top_p=0.8")
    modes: tuple[str, ...] = ("none", "token_truncate", "sequence_mask")
    clip_min: float | None = None
    clip_max: float | None = 3.0
    measure_batches: int = 2
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4, 5)

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("MismatchSweep.seeds is empty")
        if not self.modes or self.modes[0] != "none":
            raise ValueError(f"MismatchSweep.modes must start with 'none' (the uncorrected run), got {self.modes}")
        for sampler in self.samplers:
            sampler_overrides(sampler)
        check_int("MismatchSweep", "measure_batches", self.measure_batches, 0)

    def settings(self) -> dict[str, dict[str, Any]]:
        """Every setting's name and its ``GRPOConfig`` fields on top of the recipe's: ``"<sampler> | <mode>"``."""
        out: dict[str, dict[str, Any]] = {BASELINE: {}}
        for sampler in self.samplers:
            for mode in self.modes:
                overrides = dict(sampler_overrides(sampler))
                if mode != "none":
                    overrides.update(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode,
                                     vllm_importance_sampling_clip_min=self.clip_min,
                                     vllm_importance_sampling_clip_max=self.clip_max)
                out[f"{sampler} | {mode}"] = overrides
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"recipe": self.recipe.to_dict(), "samplers": list(self.samplers), "modes": list(self.modes),
                "clip_min": self.clip_min, "clip_max": self.clip_max, "measure_batches": self.measure_batches,
                "seeds": list(self.seeds)}


def split_name(name: str) -> tuple[str, str]:
    """``(sampler, mode)`` of a setting name (the baseline: ``("policy", "none")``)."""
    if name == BASELINE:
        return BASELINE, "none"
    sampler, mode = name.split(" | ")
    return sampler, mode


# ---------------------------------------------------------------------------
# Measuring the mismatch
# ---------------------------------------------------------------------------


@torch.no_grad()
def nucleus_mass(model: torch.nn.Module, rollout: Any, *, temperature: float, top_p: float) -> torch.Tensor:
    """The probability mass of the top-p nucleus at every completion position, ``[N, Tc]`` (1 on padding).

    Computed from the full softmax of ``model`` at temperature ``temperature``:
    the likeliest tokens, in order, while the mass before them is below ``top_p``
    (``generate``'s rule). Written apart from :func:`grpo_tutorial.sampling.copies.top_p_logprobs`,
    so that the chapter can check the identity "the ratio pi / mu of a sampled
    token is the mass of its nucleus" against an independent computation.
    """
    was_training = model.training
    model.eval()
    try:
        tc = rollout.completion_ids.shape[1]
        positions = (rollout.attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # [N, Tp+Tc]
        out = model(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask, position_ids=positions,
                    use_cache=False)
        probs = torch.softmax(out.logits[:, -tc - 1:-1].float() / temperature, dim=-1)  # [N, Tc, V]
        sorted_probs = probs.sort(dim=-1, descending=True).values  # [N, Tc, V]
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [N, Tc, V]: mass of the likelier tokens
        mass = (sorted_probs * (before < top_p)).sum(dim=-1)  # [N, Tc]
    finally:
        model.train(was_training)
    mask = rollout.completion_mask.bool()
    return torch.where(mask, mass, torch.ones_like(mass))


@torch.no_grad()
def measure_mismatch(trainer: GRPOTrainer, rows: Sequence[dict], *, batches: int, seed: int,
                     keep_tokens: bool = False) -> dict:
    """The sampler of ``trainer`` against its policy, as they stand, on ``batches`` fresh batches of ``rows``.

    Each batch: the recipe's prompts per step from ``rows`` (in turn), the
    sampler's completions with its own log-probs (``Rollout.sampler_logprobs``,
    log mu), the policy's log-probs of them (log pi, scored as stage 4 scores),
    and so the per-token log-ratio log(pi / mu) and each completion's sequence
    log-ratio (their sum) with its length. A top-p sampler also gets the nucleus
    mass at every sampled position (:func:`nucleus_mass`). Nothing here moves
    the weights or the trainer's state. Returns summaries: the log-ratio's mean,
    standard deviation, mean absolute value and quantiles; the sequence
    log-ratio by completion length (count, mean, sd); the diagnostics of
    :func:`~grpo_tutorial.mismatch.mismatch_diagnostics` over all batches; with
    ``keep_tokens``, the per-token log-ratios themselves (for a histogram) and
    each completion's ``[length, sequence log-ratio]``.
    """
    step = trainer.grpo_step
    sampler, cfg = step.sampler, trainer.config
    if sampler.is_learner:
        raise ValueError("the trainer's sampler is the policy itself: there is no mismatch to measure")
    check_int(None, "batches", batches, 1)
    b = cfg.prompts_per_step
    token_logr, seq_logr, lengths, masses, diagnostics = [], [], [], [], []
    for i in range(batches):
        prompts = [rows[(i * b + j) % len(rows)]["prompt"] for j in range(b)]
        rollout = sampler(prompts, 10_000_000 + 1000 * seed + i)  # a seed no training step draws
        logp = step.logprobs(step.model, rollout, entropy=False)  # [N, Tc]
        mu = rollout.sampler_logprobs.to(logp.device, logp.dtype)  # [N, Tc]
        mask = rollout.completion_mask.bool()  # [N, Tc]
        diff = (logp - mu).double()  # [N, Tc]
        token_logr.append(diff[mask])
        seq_logr.append(torch.where(mask, diff, 0.0).sum(dim=-1))  # [N]
        lengths.append(mask.sum(dim=-1))  # [N]
        diagnostics.append(mismatch_diagnostics(logp, mu, mask, cfg.vllm_importance_sampling_clip_min,
                                                cfg.vllm_importance_sampling_clip_max))
        if cfg.sampler == "top_p":
            mass = nucleus_mass(step.model, rollout, temperature=cfg.temperature, top_p=float(cfg.top_p))
            masses.append(mass[mask].double())
    tokens, seqs, lens = torch.cat(token_logr), torch.cat(seq_logr), torch.cat(lengths)
    by_length = {}
    for length in sorted(set(lens.tolist())):
        chosen = seqs[lens == length]
        by_length[str(length)] = {"n": len(chosen), "mean": float(chosen.mean()),
                                  "sd": float(chosen.std()) if len(chosen) > 1 else math.nan,
                                  "mean_ratio": float(chosen.exp().mean())}
    out = {
        "tokens": int(tokens.numel()),
        "completions": int(seqs.numel()),
        "log_ratio_mean": float(tokens.mean()),
        "log_ratio_sd": float(tokens.std()),
        "log_ratio_abs_mean": float(tokens.abs().mean()),
        "log_ratio_abs_max": float(tokens.abs().max()),
        "log_ratio_quantiles": {str(q): float(torch.quantile(tokens, q)) for q in QUANTILES},
        "ratio_mean": float(tokens.exp().mean()),
        "sequence_by_length": by_length,
        "diagnostics": {k: sum(d[k] for d in diagnostics) / len(diagnostics) for k in diagnostics[0]},
    }
    if masses:
        mass = torch.cat(masses)
        out["nucleus_mass_mean"] = float(mass.mean())
        out["ratio_minus_mass_max"] = float((tokens.exp() - mass).abs().max())
    if keep_tokens:
        out["token_log_ratios"] = [float(f"{v:.6g}") for v in tokens.tolist()]
        out["sequences"] = [[int(n), float(f"{v:.6g}")] for n, v in zip(lens.tolist(), seqs.tolist())]
    return out


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def _round(value: float | None) -> float | None:
    """Six significant digits (the record stores a value per step of every run)."""
    return None if value is None else float(f"{value:.6g}")


def _mismatch_fields(measure_batches: int, keep_tokens: bool, seed: int, data: dict):
    """``describe`` for :func:`grpo_tutorial.chapters.sweep.run_setting`: what a chapter-15 run keeps beyond the
    common fields (its mismatch curves, skipped updates, lowest accuracy, collapse, and the measurement)."""

    def describe(trainer: GRPOTrainer, first: dict, final: dict, curve: list) -> dict:
        history = trainer.history
        out = {
            "mismatch_curves": {k: [_round(row.get(k)) for row in history] for k in MISMATCH_KEYS if k in history[0]},
            "skipped_updates": history[-1]["skipped_updates"],
            "min_accuracy": min(p[1] for p in curve),
            "collapsed": final["accuracy"] < COLLAPSE_SHARE * first["accuracy"],
        }
        if measure_batches and not trainer.grpo_step.sampler.is_learner:
            t0 = time.perf_counter()
            out["measurement"] = measure_mismatch(trainer, data["train"], batches=measure_batches, seed=seed,
                                                  keep_tokens=keep_tokens)
            out["measurement"]["seconds"] = time.perf_counter() - t0
        return out

    return describe


def run_setting(start_model, tokenizer, data: dict, recipe: TinyAdditionRecipe, overrides: dict[str, Any],
                seed: int, *, measure_batches: int = 0, keep_tokens: bool = False) -> dict:
    """Train a copy of ``start_model`` with the recipe's GRPO settings and ``overrides``; evaluate as it goes.

    :func:`grpo_tutorial.chapters.sweep.run_setting`'s fields, plus ``mismatch_curves`` (the history's
    :data:`MISMATCH_KEYS` per step), ``skipped_updates``, ``min_accuracy`` and ``collapsed``
    (:data:`COLLAPSE_SHARE`). With ``measure_batches`` (and a sampler that is not the policy), the run ends
    with :func:`measure_mismatch` on the training rows (``measurement``).
    """
    return sweep_runner.run_setting(start_model, tokenizer, data, recipe, overrides, seed,
                                    describe=_mismatch_fields(measure_batches, keep_tokens, seed, data))


def run_sweep_seed(sweep: MismatchSweep, seed: int, *, only: Sequence[str] | None = None,
                   on_setting: Callable[[str, dict], None] | None = None) -> dict:
    """One seed: one warm start, then every setting (or those named in ``only``) from a copy of it
    (:func:`grpo_tutorial.chapters.sweep.run_sweep_seed`).

    Each uncorrected run ends with the measurement; seed ``sweep.seeds[0]`` keeps
    its per-token log-ratios for the chapter's histogram.
    """
    recipe = sweep.recipe

    def run(name: str, overrides: dict[str, Any], model, tokenizer, data: dict) -> dict:
        uncorrected = split_name(name)[1] == "none"
        return run_setting(model, tokenizer, data, recipe, overrides, seed,
                           measure_batches=sweep.measure_batches if uncorrected else 0,
                           keep_tokens=seed == sweep.seeds[0])

    return sweep_runner.run_sweep_seed(recipe, seed, lambda model: sweep.settings(), run, only=only,
                                       on_setting=on_setting)


# ---------------------------------------------------------------------------
# Summarising
# ---------------------------------------------------------------------------


def _mean(values: Sequence[float | None]) -> float:
    xs = [v for v in values if v is not None and math.isfinite(v)]
    return sum(xs) / len(xs) if xs else math.nan


def summarize_mismatch(seed_results: Sequence[dict], confidence: float = 0.95) -> dict:
    """Across seeds, per setting: final accuracy and gain (mean, SE, t interval), the held-out curve's band,
    the final accuracy against the on-policy baseline paired by seed (``vs_policy``), how many runs collapsed,
    and each mismatch diagnostic averaged over a run's steps (then over the seeds); per sampler, the
    measurement of its uncorrected runs averaged over the seeds (``samplers``)."""
    by_setting = sweep_runner.runs_by_setting(seed_results)
    names = list(by_setting)
    table: dict[str, dict] = {}
    for name, runs in by_setting.items():
        first = next(iter(runs.values()))
        sampler, mode = split_name(name)
        table[name] = {
            "sampler": sampler,
            "mode": mode,
            **sweep_runner.setting_summary(runs, confidence),
            "collapsed": sum(bool(run["collapsed"]) for run in runs.values()),
            "runs": len(runs),
            "seconds_per_step": _mean([run["seconds_per_step"] for run in runs.values()]),
            "mismatch": {k: _mean([_mean(run["mismatch_curves"][k]) for run in runs.values()])
                         for k in first["mismatch_curves"]},
        }
    if BASELINE in table:
        base = {int(s): v for s, v in table[BASELINE]["per_seed_final"].items()}
        for name, entry in table.items():
            if name != BASELINE:
                mine = {int(s): v for s, v in entry["per_seed_final"].items()}
                entry["vs_policy"] = paired_comparison(mine, base, confidence)
    samplers: dict[str, dict] = {}
    for name in names:
        measured = [r["settings"][name]["measurement"] for r in seed_results
                    if "measurement" in r["settings"].get(name, {})]
        if not measured:
            continue
        numeric = [k for k, v in measured[0].items() if isinstance(v, (int, float))]
        pooled: dict[str, Any] = {k: _mean([m[k] for m in measured]) for k in numeric}
        pooled["diagnostics"] = {k: _mean([m["diagnostics"][k] for m in measured]) for k in measured[0]["diagnostics"]}
        lengths = sorted({int(n) for m in measured for n in m["sequence_by_length"]})
        pooled["sequence_by_length"] = {}
        for length in lengths:
            parts = [m["sequence_by_length"][str(length)] for m in measured if str(length) in m["sequence_by_length"]]
            count = sum(p["n"] for p in parts)
            mean = sum(p["n"] * p["mean"] for p in parts) / count
            pooled["sequence_by_length"][str(length)] = {
                "n": count, "mean": mean,
                "sd": _mean([p["sd"] for p in parts]),
                "mean_ratio": sum(p["n"] * p["mean_ratio"] for p in parts) / count,
            }
        pooled["seeds"] = len(measured)
        samplers[split_name(name)[0]] = pooled
    return {"confidence": confidence, "settings": table, "samplers": samplers}

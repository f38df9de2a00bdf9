"""Chapter 12, "A GRPO lab": GRPO, its variants and two controls, side by side.

Every method starts from ONE shared warm start per seed (chapter 8's recipe,
:mod:`grpo_tutorial.chapters.recipes`) and trains for the same number of steps on the
tiny addition task, with the same prompts per step, group size and learning
rate. Only the objective options of :data:`LAB_METHODS` differ.

The statistics are small pure functions with exact tests:

* :func:`pass_at_k`: the unbiased pass@k estimator of Chen et al. (2021),
  ``1 - C(n - c, k) / C(n, k)``, computed as a product so it never forms a
  huge binomial coefficient;
* :func:`t_quantile`, :func:`mean_ci` and :func:`paired_comparison` (per-seed
  differences against a baseline method: same seed = same warm start, so the warm
  start's luck cancels) live in the core's :mod:`grpo_tutorial.stats` and are
  re-exported here, where chapters 12-15 first met them.
"""

from __future__ import annotations

import copy
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .._checks import check_int
from ..run.progress import progress_bar
from .recipes import TinyAdditionRecipe
from .sweep import recipe_threads, seed_start
from ..evaluation import evaluate_policy
from ..rewards import answers_match, correctness_reward, extract_answer
from ..rollout import generate_rollouts, sampling_kwargs
from ..sft import encode_sft_batch
from ..stats import mean_ci, paired_comparison, standard_error, t_quantile
from ..trainer import GRPOConfig, GRPOTrainer

__all__ = [
    "LAB_METHODS",
    "LabSettings",
    "RFT",
    "RejectionSamplingFT",
    "correct_counts",
    "mean_ci",
    "paired_comparison",
    "pass_at_k",
    "pass_at_k_curve",
    "run_method",
    "run_seed",
    "summarize_lab",
    "t_quantile",
]

#: The name of the rejection-sampling fine-tuning control (not a GRPOConfig option).
RFT = "rft"

#: Each method's GRPOConfig fields, applied on top of the recipe's settings.
#: ``None`` marks the rejection-sampling control, which is not a GRPOTrainer run.
LAB_METHODS: dict[str, dict[str, Any] | None] = {
    # today's defaults: token ratios, symmetric clip 0.2, per-sequence mean, group std
    "grpo": {},
    # Dr. GRPO: no std division, a constant normaliser instead of the per-sequence mean
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    # DAPO: clip-higher, token-level mean, dynamic sampling, overlong (truncation) masking
    "dapo": {
        "loss_type": "dapo",
        "clip_eps_high": 0.28,
        "dynamic_sampling": True,
        "mask_truncated_completions": True,
    },
    # GSPO: one length-normalised ratio per sequence; its ratios sit much closer to 1,
    # so its paper (and TRL's docs) use a clip range of 3e-4 / 4e-4
    "gspo": {"importance_sampling_level": "sequence", "clip_eps": 3e-4, "clip_eps_high": 4e-4},
    # CISPO: clipped, detached IS weight times log pi; TRL's recommended epsilon_high=5.0
    "cispo": {"loss_type": "cispo", "clip_eps_high": 4.0},
    # RLOO: leave-one-out mean baseline, no std division (as in its paper)
    "rloo": {"advantage_baseline": "rloo", "scale_rewards": "none"},
    # control 1: plain REINFORCE with a mean baseline, no std, no clipping. One
    # update per step on the whole batch (mu = 1, minibatch = B*G) makes every
    # ratio exactly 1, so the clip can never act and the gradient is exactly
    # sum_i A_i grad log pi(o_i); dr_grpo's constant normaliser makes each
    # completion's weight its summed log-prob, as in the textbook estimator.
    "reinforce": {
        "advantage_baseline": "batch",
        "scale_rewards": "none",
        "loss_type": "dr_grpo",
        "minibatch_size": None,
        "num_iterations": 1,
    },
    # control 2: rejection-sampling fine-tuning on the same samples (see RejectionSamplingFT)
    RFT: None,
}


# ---------------------------------------------------------------------------
# Statistics (pure)
# ---------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021).

    The probability that a random size-``k`` subset of the ``n`` samples holds at
    least one correct one: ``1 - C(n - c, k) / C(n, k)``. The ratio of binomials
    is computed as ``prod_{i = n - c + 1}^{n} (1 - k / i)``, which never builds a
    large number (C(64, 32) is about 1.8e18).

    >>> pass_at_k(4, 1, 2)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    0.5
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        check_int(None, name, value, 0)
    if n < 1:
        raise ValueError(f"n must be >= 1 (samples per problem), got {n}")
    if c > n:
        raise ValueError(f"c = {c} correct samples cannot exceed n = {n} samples")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in 1..n = 1..{n}, got {k}; pass@k needs at least k samples")
    if n - c < k:  # every size-k subset contains a correct sample
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k_curve(counts: Sequence[int], n: int, ks: Sequence[int]) -> list[float]:
    """Mean pass@k over problems, one value per k; ``counts[j]`` is problem j's correct count."""
    if len(counts) == 0:
        raise ValueError("counts is empty; expected one correct-count per problem")
    return [sum(pass_at_k(n, int(c), k) for c in counts) / len(counts) for k in ks]


# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------


@dataclass
class LabSettings:
    """What the lab runs: the recipe, the methods, the seeds and the pass@k sampling.

    Attributes:
        recipe: chapter 8's recipe; its ``grpo_steps`` is every method's step
            count and its ``eval_every`` the held-out curve's spacing.
        methods: names from :data:`LAB_METHODS`.
        seeds: one shared warm start per seed.
        passk_problems: held-out test problems used for pass@k (the first ones).
        passk_n: samples per problem at temperature 1 (pass@k for k = 1..n).
        passk_batch: prompts per ``generate`` call when sampling for pass@k.
    """

    recipe: TinyAdditionRecipe = field(default_factory=TinyAdditionRecipe)
    methods: tuple[str, ...] = tuple(LAB_METHODS)
    seeds: tuple[int, ...] = (0, 1, 2)
    passk_problems: int = 200
    passk_n: int = 64
    passk_batch: int = 16

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in LAB_METHODS]
        if unknown or not self.methods:
            raise ValueError(f"LabSettings.methods has unknown names {unknown}; choose from {list(LAB_METHODS)}")
        if "grpo" not in self.methods:
            raise ValueError("LabSettings.methods must include 'grpo': the paired comparison and pass@k need it")
        if isinstance(self.seeds, (str, bytes)) or not isinstance(self.seeds, Sequence) or not self.seeds:
            raise ValueError(f"LabSettings.seeds must be a non-empty list of ints >= 0, got {self.seeds!r}")
        for i, seed in enumerate(self.seeds):
            check_int("LabSettings", f"seeds[{i}]", seed, 0)
        for name in ("passk_problems", "passk_n", "passk_batch"):
            check_int("LabSettings", name, getattr(self, name), 1)
        if self.passk_problems > self.recipe.n_test:
            raise ValueError(
                f"LabSettings.passk_problems = {self.passk_problems} exceeds the recipe's n_test = "
                f"{self.recipe.n_test}; lower it or raise n_test"
            )
        for m in self.methods:  # refuse a bad combination now, not after the warm start
            self.grpo_config(m, seed=0)

    def grpo_config(self, method: str, seed: int) -> GRPOConfig | None:
        """The method's GRPOConfig: the recipe's settings with the method's fields on top."""
        overrides = LAB_METHODS[method]
        if overrides is None:
            return None
        base = self.recipe.grpo_config(seed)
        return GRPOConfig(**{**base.to_dict(), **overrides})

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe.to_dict(),
            "methods": list(self.methods),
            "seeds": list(self.seeds),
            "passk_problems": self.passk_problems,
            "passk_n": self.passk_n,
            "passk_batch": self.passk_batch,
        }


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------




def correct_counts(
    model, tokenizer, rows: Sequence[dict], config: GRPOConfig, *, n: int, seed: int, batch: int = 16,
) -> list[int]:
    """For each row, how many of ``n`` completions, sampled as the run ``config`` samples, are correct."""
    counts: list[int] = []
    for start in range(0, len(rows), batch):
        chunk = list(rows[start : start + batch])
        rollout = generate_rollouts(model, tokenizer, [r["prompt"] for r in chunk],
                                    **sampling_kwargs(config, group_size=n, generator_seed=seed * 1_000_003 + start))
        for j, row in enumerate(chunk):
            texts = rollout.completions[j * n : (j + 1) * n]
            counts.append(sum(answers_match(extract_answer(t), row["answer"]) for t in texts))
    return counts


def _sampler(rows: Sequence[dict], seed: int) -> Callable[[int], list[dict]]:
    """Draw ``k`` training rows at a time, reshuffling after each pass (RFT's data stream)."""
    rng = random.Random(seed)
    order: list[int] = []

    def draw(k: int) -> list[dict]:
        out = []
        for _ in range(k):
            if not order:
                order.extend(range(len(rows)))
                rng.shuffle(order)
            out.append(rows[order.pop()])
        return out

    return draw


class RejectionSamplingFT:
    """Rejection-sampling fine-tuning (RFT) with GRPO's sample budget: the lab's second control.

    Each step samples ``group_size`` completions for ``prompts_per_step`` prompts
    from the current policy at the recipe's temperature (exactly GRPO's B*G
    samples), keeps the correct ones and takes supervised steps on them with
    :func:`~grpo_tutorial.sft.encode_sft_batch` (loss on the answer tokens and
    EOS). The kept rows are split into as many optimizer updates as GRPO makes
    per step, with GRPO's AdamW learning rate and gradient clipping, so the two
    differ in what they learn from: RFT imitates its own correct samples, GRPO
    also pushes down the wrong ones. A kept sample is trained on as the
    reference answer string (which :func:`~grpo_tutorial.rewards.answers_match`
    accepted it as), followed by EOS.

    It mirrors :class:`~grpo_tutorial.trainer.GRPOTrainer`'s ``train(rows, steps)``
    (``steps`` is the total to reach) and ``history``.
    """

    def __init__(self, model, tokenizer, recipe: TinyAdditionRecipe, seed: int) -> None:
        self.model, self.tokenizer, self.recipe, self.seed = model, tokenizer, recipe, seed
        self.config = recipe.grpo_config(seed)
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=self.config.learning_rate, weight_decay=self.config.weight_decay
        )
        self._shuffle = random.Random(seed + 1)
        self._draw: Callable[[int], list[dict]] | None = None
        self.history: list[dict] = []

    @property
    def step(self) -> int:
        return len(self.history)

    def train(self, rows: Sequence[dict], steps: int) -> list[dict]:
        if self._draw is None:
            self._draw = _sampler(rows, self.seed)
        while self.step < steps:
            self.history.append(self.train_step(self._draw(self.recipe.grpo.prompts_per_step)))
        return self.history

    def train_step(self, rows: Sequence[dict]) -> dict:
        recipe, cfg, model = self.recipe, self.config, self.model
        t0 = time.perf_counter()
        step = self.step + 1
        rollout = generate_rollouts(model, self.tokenizer, [r["prompt"] for r in rows],
                                    **sampling_kwargs(cfg, generator_seed=self.seed * 1_000_003 + step))
        kept = []
        for i, text in enumerate(rollout.completions):
            row = rows[i // recipe.grpo.group_size]
            if answers_match(extract_answer(text), row["answer"]):
                kept.append({"prompt": row["prompt"], "answer": row["answer"]})
        self._shuffle.shuffle(kept)
        losses = []
        was_training = model.training
        model.train()
        if kept:
            size = math.ceil(len(kept) / cfg.updates_per_step)
            for u in range(0, len(kept), size):
                batch = encode_sft_batch(self.tokenizer, kept[u : u + size])
                loss = model(**batch).loss
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                losses.append(float(loss.detach()))
        model.train(was_training)
        n = len(rollout.completions)
        return {
            "step": step,
            "reward_mean": len(kept) / n,
            "accuracy": len(kept) / n,
            "kept": len(kept),
            "loss": sum(losses) / len(losses) if losses else math.nan,
            "groups_drawn": len(rows),
            "step_seconds": time.perf_counter() - t0,
        }


_CURVE_KEYS = ("reward_mean", "accuracy", "frac_zero_std", "frac_truncated", "clip_frac", "entropy",
               "completion_len_mean", "groups_drawn", "step_seconds")


def run_method(
    method: str, start_model, tokenizer, data: dict, settings: LabSettings, seed: int, *,
    on_step: Callable[[dict], None] | None = None,
) -> dict:
    """Train a copy of ``start_model`` with ``method`` for ``recipe.grpo_steps`` steps.

    Returns ``method``, ``seed``, ``curve`` (per-step training rows with the keys
    the lab plots), ``heldout_curve`` (``[step, accuracy, se]``), ``final``
    (held-out greedy accuracy, its SE and per-problem outcomes), ``start`` (the same
    at step 0), ``seconds``
    (training only) and ``model``.
    """
    if method not in LAB_METHODS:
        raise ValueError(f"method must be one of {list(LAB_METHODS)}, got {method!r}")
    recipe = settings.recipe
    model = copy.deepcopy(start_model)
    # every method is evaluated with the config it trains with (RFT: the recipe's GRPO config)
    config = recipe.grpo_config(seed) if method == RFT else settings.grpo_config(method, seed)
    first = evaluate_policy(model, tokenizer, data["test"], config)
    heldout_curve = [[0, first["accuracy"], first["se"]]]
    history: list[dict] = []
    seconds = 0.0
    chunk = recipe.eval_every or recipe.grpo_steps
    if method == RFT:
        trainer: Any = RejectionSamplingFT(model, tokenizer, recipe, seed)
    else:
        trainer = GRPOTrainer(model, tokenizer, correctness_reward, config)
    while trainer.step < recipe.grpo_steps:
        target = min(recipe.grpo_steps, trainer.step + chunk)
        before = len(trainer.history)
        t0 = time.perf_counter()
        if method == RFT:
            trainer.train(data["train"], target)
        else:
            trainer.train(data["train"], target, progress=False)
        seconds += time.perf_counter() - t0
        if on_step is not None:
            for row in trainer.history[before:]:
                on_step(row)
        point = evaluate_policy(model, tokenizer, data["test"], config)
        heldout_curve.append([trainer.step, point["accuracy"], point["se"]])
    rows = trainer.history
    curve = [{k: _float(r.get(k, math.nan)) for k in _CURVE_KEYS} for r in rows]
    return {
        "method": method,
        "seed": seed,
        "curve": curve,
        "heldout_curve": heldout_curve,
        "start": first,
        "final": point,
        "seconds": seconds,
        "model": model,
    }


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def run_seed(
    settings: LabSettings,
    seed: int,
    *,
    progress: bool = True,
    on_method: Callable[[str, dict], None] | None = None,
) -> dict:
    """One seed of the lab: one warm start, then every method from a copy of it.

    pass@k (``settings.passk_n`` samples per problem, temperature 1) is measured
    on the first ``settings.passk_problems`` test problems for the warm start
    ("before") and for the GRPO-trained model ("after").

    Returns a JSON-safe dict: ``seed``, ``warm_start`` (steps, seconds, probe
    accuracy), ``methods`` (per method: ``curve``, ``heldout_curve``,
    ``final_accuracy``, ``final_se``, ``start_correct`` and ``final_correct`` (0/1 per
    held-out problem, for a paired gain), ``seconds``, ``steps``), ``passk``
    (``before``/``after`` correct counts per problem, and ``seconds``) and
    ``seconds`` for the whole seed.
    """
    recipe = settings.recipe
    t_seed = time.perf_counter()
    with recipe_threads(recipe):
        data, model, tokenizer, sft = seed_start(recipe, seed)
        passk_rows = data["test"][: settings.passk_problems]
        t0 = time.perf_counter()
        counts_before = correct_counts(model, tokenizer, passk_rows, recipe.grpo_config(seed), n=settings.passk_n,
                                       seed=seed, batch=settings.passk_batch)
        passk_seconds = time.perf_counter() - t0
        methods: dict[str, dict] = {}
        counts_after = None
        total_steps = len(settings.methods) * recipe.grpo_steps
        bar = progress_bar(total=total_steps, desc=f"seed {seed}", enabled=progress, leave=False)
        for method in settings.methods:
            bar.set_postfix_str(method)
            result = run_method(method, model, tokenizer, data, settings, seed, on_step=lambda row: bar.update(1))
            methods[method] = {
                "curve": result["curve"],
                "heldout_curve": result["heldout_curve"],
                "final_accuracy": result["final"]["accuracy"],
                "final_se": result["final"]["se"],
                # per held-out problem, 1 if answered right: for a paired gain (recipes.paired_gain)
                "start_correct": [None if c is None else int(c) for c in result["start"]["correct"]],
                "final_correct": [None if c is None else int(c) for c in result["final"]["correct"]],
                "seconds": result["seconds"],
                "steps": len(result["curve"]),
            }
            if method == "grpo":
                t0 = time.perf_counter()
                counts_after = correct_counts(result["model"], tokenizer, passk_rows, recipe.grpo_config(seed),
                                              n=settings.passk_n, seed=seed, batch=settings.passk_batch)
                passk_seconds += time.perf_counter() - t0
            if on_method is not None:
                on_method(method, methods[method])
        bar.close()
    return {
        "seed": seed,
        "warm_start": {
            "steps": sft["steps"], "seconds": sft["seconds"], "reached": sft["reached"],
            "probe_accuracy": sft["probe_accuracy"][-1][1] if sft["probe_accuracy"] else math.nan,
        },
        "methods": methods,
        "passk": {"n": settings.passk_n, "before": counts_before, "after": counts_after, "seconds": passk_seconds},
        "seconds": time.perf_counter() - t_seed,
    }


def _band(rows: list[list[float]]) -> dict[str, list[float]]:
    """Mean and standard error across seeds, position by position (NaN entries skipped)."""
    mean, se = [], []
    for column in zip(*rows):
        x = [v for v in column if math.isfinite(v)]
        if not x:
            mean.append(math.nan)
            se.append(math.nan)
            continue
        m = sum(x) / len(x)
        mean.append(m)
        se.append(standard_error(x))
    return {"mean": mean, "se": se}


def summarize_lab(seed_results: Sequence[dict], ks: Sequence[int] | None = None, confidence: float = 0.95) -> dict:
    """Across seeds: per method the final accuracy (mean, SE, CI), curves with SE bands,
    the paired difference against GRPO, and pass@k before/after GRPO.

    ``seed_results`` are :func:`run_seed` outputs. Methods missing from some seed
    are summarised over the seeds that have them.
    """
    if not seed_results:
        raise ValueError("seed_results is empty; run at least one seed")
    methods: list[str] = []
    for r in seed_results:
        methods += [m for m in r["methods"] if m not in methods]
    final = {m: {r["seed"]: r["methods"][m]["final_accuracy"] for r in seed_results if m in r["methods"]}
             for m in methods}
    table = {}
    for m in methods:
        runs = [r["methods"][m] for r in seed_results if m in r["methods"]]
        entry = mean_ci(list(final[m].values()), confidence)
        entry["seconds"] = mean_ci([run["seconds"] for run in runs], confidence)["mean"]
        entry["seconds_per_step"] = entry["seconds"] / max(1, runs[0]["steps"])
        entry["reward_curve"] = _band([[row["reward_mean"] for row in run["curve"]] for run in runs])
        entry["groups_drawn"] = _band([[row["groups_drawn"] for row in run["curve"]] for run in runs])["mean"]
        entry["heldout_steps"] = [p[0] for p in runs[0]["heldout_curve"]]
        entry["heldout_curve"] = _band([[p[1] for p in run["heldout_curve"]] for run in runs])
        if m != "grpo" and "grpo" in final:
            entry["vs_grpo"] = paired_comparison(final[m], final["grpo"], confidence)
        table[m] = entry
    passk = None
    with_after = [r for r in seed_results if r["passk"]["after"] is not None]
    if with_after:
        n = with_after[0]["passk"]["n"]
        ks = list(range(1, n + 1)) if ks is None else list(ks)
        before = [pass_at_k_curve(r["passk"]["before"], n, ks) for r in with_after]
        after = [pass_at_k_curve(r["passk"]["after"], n, ks) for r in with_after]
        seeds = [r["seed"] for r in with_after]
        passk = {
            "n": n,
            "ks": ks,
            "problems": len(with_after[0]["passk"]["before"]),
            "before": _band(before),
            "after": _band(after),
            "per_seed_before": before,
            "per_seed_after": after,
            "change_at_1": paired_comparison(
                {s: a[0] for s, a in zip(seeds, after)}, {s: b[0] for s, b in zip(seeds, before)}, confidence
            ),
            "change_at_n": paired_comparison(
                {s: a[-1] for s, a in zip(seeds, after)}, {s: b[-1] for s, b in zip(seeds, before)}, confidence
            ),
        }
    return {"confidence": confidence, "methods": table, "passk": passk}

"""The sweep runner of chapters 14 and 15, and the start of one seed that chapter 12's lab shares.

A sweep trains many settings (a learning rate, a LoRA rank, a sampler, a
correction) from one warm start per seed, so that the comparison between settings
is paired: same start, same data. Chapter 14's :mod:`~grpo_tutorial.chapters.low_rank`
and chapter 15's :mod:`~grpo_tutorial.chapters.mismatch_lab` differ only in their
settings and in what they keep of a run beyond the common fields, so both run here:

- :func:`recipe_threads`: the recipe's thread count while the seed runs (the records are made single-threaded);
- :func:`seed_start`: one seed's data, model and warm start (chapter 8's recipe, :mod:`~grpo_tutorial.chapters.recipes`);
- :func:`run_setting`: a copy of the warm start trained with one setting, evaluated every ``eval_every`` steps;
  the common fields of its result, plus whatever the chapter's ``describe`` adds from the finished trainer;
- :func:`run_sweep_seed`: one seed, every setting (or those named in ``only``) from one warm start;
- :func:`runs_by_setting` and :func:`setting_summary`: the seeds' runs of each setting, and what both chapters'
  summaries say of them (final accuracy and gain with their t intervals, the held-out curve's band).

Chapters 13 and 16 compare *variants* (a setting and, for some, another reward or tool) from one warm start per
seed, each measured by a chapter's own held-out statistics; they share :func:`warm_start_until` (supervised
steps until a probe reaches the recipe's target), :func:`run_from_warm_start` and :func:`train_with_curve`
(train, measuring every ``eval_every`` steps) and :func:`summarize_variants` (each statistic's band across
seeds, and the final values paired by seed against the baseline variant).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
from typing import Any, Callable, Iterator, Sequence

import torch

from ..evaluation import evaluate_policy
from ..stats import mean_ci, paired_comparison, standard_error
from ..rewards import correctness_reward
from ..trainer import GRPOConfig, GRPOTrainer
from .recipes import TinyAdditionRecipe, build_recipe_model, make_recipe_data, paired_gain, warm_start

__all__ = [
    "VariantRecipe", "recipe_threads", "run_setting", "run_sweep_seed", "runs_by_setting", "seed_start", "setting_summary",
    "mean_or_nan", "run_from_warm_start", "sampled_heldout", "summarize_variants", "train_with_curve",
    "warm_start_until",
]

#: ``describe(trainer, first, final, curve) -> dict``: what a chapter keeps of a finished run beyond the common
#: fields (``first`` and ``final`` are the evaluations before and after training, ``curve`` the held-out curve).
Describe = Callable[[GRPOTrainer, dict, dict, list], dict]


@contextlib.contextmanager
def recipe_threads(recipe: TinyAdditionRecipe) -> Iterator[None]:
    """Run the block with ``recipe.num_threads`` torch threads (unchanged when it is None), then restore them."""
    previous = torch.get_num_threads()
    if recipe.num_threads is not None:
        torch.set_num_threads(recipe.num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def seed_start(recipe: TinyAdditionRecipe, seed: int) -> tuple[dict, Any, Any, dict]:
    """``(data, model, tokenizer, sft)``: the recipe's data, seed ``seed``'s model and its warm start's summary."""
    data = make_recipe_data(recipe)
    model, tokenizer = build_recipe_model(recipe, seed)
    sft = warm_start(model, tokenizer, data, recipe, seed, progress=False)
    return data, model, tokenizer, sft


def run_setting(start_model, tokenizer, data: dict, recipe: TinyAdditionRecipe, overrides: dict[str, Any],
                seed: int, *, describe: Describe | None = None) -> dict:
    """Train a copy of ``start_model`` with the recipe's GRPO settings and ``overrides``; evaluate as it goes.

    Returns ``overrides``, ``heldout_curve`` (``[step, accuracy, se]`` from step 0), ``reward_curve`` (each
    step's mean reward), ``start_correct`` and ``final_correct`` (0/1 per held-out problem), ``final_accuracy``,
    ``gain`` and ``gain_se`` (paired, :func:`~grpo_tutorial.chapters.recipes.paired_gain`), then what
    ``describe`` adds, then ``seconds`` (training only), ``seconds_per_step`` and ``steps``.
    """
    model = copy.deepcopy(start_model)
    config = GRPOConfig(**{**recipe.grpo_config(seed).to_dict(), **overrides})
    trainer = GRPOTrainer(model, tokenizer, correctness_reward, config)
    policy = trainer.model
    first = evaluate_policy(policy, tokenizer, data["test"], config)
    curve = [[0, first["accuracy"], first["se"]]]
    seconds, point = 0.0, first
    chunk = recipe.eval_every or recipe.grpo_steps
    while trainer.step < recipe.grpo_steps:
        target = min(recipe.grpo_steps, trainer.step + chunk)
        t0 = time.perf_counter()
        trainer.train(data["train"], target, progress=False)
        seconds += time.perf_counter() - t0
        point = evaluate_policy(policy, tokenizer, data["test"], config)
        curve.append([trainer.step, point["accuracy"], point["se"]])
    gain, gain_se = paired_gain(first["correct"], point["correct"])
    return {
        "overrides": overrides,
        "heldout_curve": curve,
        "reward_curve": [row["reward_mean"] for row in trainer.history],
        "start_correct": [int(bool(c)) for c in first["correct"]],
        "final_correct": [int(bool(c)) for c in point["correct"]],
        "final_accuracy": point["accuracy"],
        "gain": gain,
        "gain_se": gain_se,
        **(describe(trainer, first, point, curve) if describe is not None else {}),
        "seconds": seconds,
        "seconds_per_step": seconds / max(1, trainer.step),
        "steps": trainer.step,
    }


def run_sweep_seed(recipe: TinyAdditionRecipe, seed: int, settings: Callable[[Any], dict[str, dict[str, Any]]],
                   run: Callable[[str, dict[str, Any], Any, Any, dict], dict], *,
                   only: Sequence[str] | None = None, on_setting: Callable[[str, dict], None] | None = None,
                   describe_start: Callable[[Any], dict] | None = None) -> dict:
    """One seed: one warm start, then every setting (or those named in ``only``) from a copy of it.

    ``settings(model)`` names the settings and their ``GRPOConfig`` overrides (for the warm-started model's
    shapes); ``run(name, overrides, model, tokenizer, data)`` runs one (a :func:`run_setting`). Returns
    ``seed``, ``warm_start`` (steps, seconds, reached), what ``describe_start(model)`` adds, ``settings`` (each
    run's result, by name) and ``seconds`` for the whole seed.
    """
    t_seed = time.perf_counter()
    with recipe_threads(recipe):
        data, model, tokenizer, sft = seed_start(recipe, seed)
        named = settings(model)
        unknown = sorted(set(only or ()) - set(named))
        if unknown:
            raise ValueError(f"unknown settings {unknown}; the sweep has {list(named)}")
        results = {}
        for name, overrides in named.items():
            if only is not None and name not in only:
                continue
            results[name] = run(name, overrides, model, tokenizer, data)
            if on_setting is not None:
                on_setting(name, results[name])
    return {
        "seed": seed,
        "warm_start": {"steps": sft["steps"], "seconds": sft["seconds"], "reached": sft["reached"]},
        **(describe_start(model) if describe_start is not None else {}),
        "settings": results,
        "seconds": time.perf_counter() - t_seed,
    }


def runs_by_setting(seed_results: Sequence[dict]) -> dict[str, dict[int, dict]]:
    """Each setting's runs by seed, the settings in the order the seeds first ran them (:func:`run_sweep_seed`'s
    results); ValueError for no seed at all."""
    if not seed_results:
        raise ValueError("seed_results is empty; run at least one seed")
    names: list[str] = []
    for r in seed_results:
        names += [n for n in r["settings"] if n not in names]
    return {name: {r["seed"]: r["settings"][name] for r in seed_results if name in r["settings"]} for name in names}


def setting_summary(runs: dict[int, dict], confidence: float) -> dict:
    """One setting across seeds: ``final_accuracy`` and ``gain`` (:func:`~grpo_tutorial.stats.mean_ci`), the held-out
    curve's steps, mean and standard error step by step, and ``per_seed_final`` (for a comparison paired by seed)."""
    first = next(iter(runs.values()))
    curves = [[p[1] for p in run["heldout_curve"]] for run in runs.values()]
    return {
        "final_accuracy": mean_ci([run["final_accuracy"] for run in runs.values()], confidence),
        "gain": mean_ci([run["gain"] for run in runs.values()], confidence),
        "heldout_steps": [p[0] for p in first["heldout_curve"]],
        "heldout_mean": [sum(c[i] for c in curves) / len(curves) for i in range(len(curves[0]))],
        "heldout_se": [standard_error([c[i] for c in curves]) for i in range(len(curves[0]))],
        "per_seed_final": {str(s): run["final_accuracy"] for s, run in runs.items()},
    }


def train_with_curve(trainer: GRPOTrainer, rows: Sequence[dict], steps: int, every: int, point: Callable[[], dict],
                     *, progress: bool = False) -> tuple[list[dict], float]:
    """Train ``trainer`` on ``rows`` to ``steps`` steps, calling ``point()`` at the start and every ``every`` steps
    (0: at the end only). Returns the points and the seconds spent training (the measuring left out)."""
    curve = [point()]
    seconds = 0.0
    chunk = every or steps
    while trainer.step < steps:
        t0 = time.perf_counter()
        trainer.train(rows, min(steps, trainer.step + chunk), progress=progress)
        seconds += time.perf_counter() - t0
        curve.append(point())
    return curve, seconds


def summarize_variants(seeds: Sequence[dict], variants: Sequence[str], keys: Sequence[str],
                       baseline: str) -> dict[str, Any]:
    """Across seeds, per variant (those every seed ran, in the order of ``variants``): each of ``keys`` at every
    point of the curve (mean and 95% t interval; a seed whose value is NaN there is left out), and the final values'
    paired difference against ``baseline`` (the same seed's warm start on both sides)."""
    names = [v for v in variants if all(v in s["variants"] for s in seeds)]
    out: dict[str, Any] = {}
    for v in names:
        curves = [s["variants"][v]["curve"] for s in seeds]
        steps = [p["step"] for p in curves[0]]
        entry: dict[str, Any] = {"steps": steps}
        for key in keys:
            finite = [[c[i][key] for c in curves if math.isfinite(c[i][key])] for i in range(len(steps))]
            entry[key] = [mean_ci(values) if values else None for values in finite]
        if v != baseline and baseline in names:
            entry["vs_" + baseline] = {}
            for key in keys:
                final = {s["seed"]: (s["variants"][v]["curve"][-1][key], s["variants"][baseline]["curve"][-1][key])
                         for s in seeds}
                final = {seed: pair for seed, pair in final.items() if all(map(math.isfinite, pair))}
                if final:
                    entry["vs_" + baseline][key] = paired_comparison({k: a for k, (a, _) in final.items()},
                                                                     {k: b for k, (_, b) in final.items()})
        out[v] = entry
    return out


def mean_or_nan(values: Sequence[float]) -> float:
    """The mean, NaN for no values (a style or an outcome no completion had)."""
    return sum(values) / len(values) if values else math.nan


def sampled_heldout(rows: Sequence[dict], config: GRPOConfig, seed: int,
                    sample: Callable[[list, int], Any]) -> dict[str, list]:
    """One sampled completion per held-out problem, as the policy answers in training (chapters 13 and 16 read it).

    ``sample(prompts, generator_seed)`` returns a :class:`~grpo_tutorial.rollout.Rollout` of one completion per
    prompt, drawn with the run's sampling settings; the rows go in chunks of ``config.eval_batch_size``, each with
    its own seeded generator (``seed`` plus the chunk's first row), so the global random state is left as it was
    and measuring does not change the run. Returns the ``texts``, the ``lengths`` (the policy's own tokens, EOS
    included: a tool's are not counted) and ``truncated``, row by row.
    """
    texts: list[str] = []
    lengths: list[float] = []
    truncated: list[bool] = []
    for start in range(0, len(rows), config.eval_batch_size):
        rollout = sample([row["prompt"] for row in rows[start:start + config.eval_batch_size]], seed + start)
        texts += rollout.completions
        lengths += rollout.loss_mask.sum(dim=1).tolist()
        truncated += rollout.truncated.tolist()
    return {"texts": texts, "lengths": lengths, "truncated": truncated}


def warm_start_until(model, tokenizer, targets: Sequence[dict], recipe: Any, seed: int, probe: Callable[[Any], float],
                     *, progress: bool) -> dict:
    """Chapters 13's and 16's warm start: ``recipe.sft`` (seeded with ``seed``) on ``targets`` until
    ``probe(model) >= recipe.sft_target``, checked every ``recipe.sft_check_every`` supervised steps.

    Returns ``steps``, ``seconds``, ``reached`` and ``probe`` (``[step, probe value]`` at every check).
    """
    from ..sft import warm_start_until as until

    done = until(model, tokenizer, targets, dataclasses.replace(recipe.sft, seed=seed), probe, recipe.sft_target,
                 check_every=recipe.sft_check_every, progress=progress)
    return {"steps": done["steps"], "seconds": done["seconds"], "reached": done["reached"],
            "probe": [list(check) for check in done["checks"]]}


def run_from_warm_start(variant: str, seed: int, trainer: GRPOTrainer, rows: Sequence[dict], recipe: Any,
                        stats: Callable[[], dict], *, progress: bool = False) -> dict:
    """Train ``trainer`` (on a copy of a warm start) for ``recipe.grpo_steps`` steps, with ``stats()`` at step 0
    and every ``recipe.eval_every`` steps. Returns ``variant``, ``seed``, ``curve`` (``step`` and the statistics),
    ``history`` (the trainer's rows without timing fields), ``seconds`` (training only) and ``model``."""
    def point() -> dict:
        return {"step": trainer.step, **stats()}

    curve, seconds = train_with_curve(trainer, rows, recipe.grpo_steps, recipe.eval_every, point, progress=progress)
    timing = ("seconds", "tokens_per_s", "lr")
    history = [{k: v for k, v in row.items() if not k.endswith(timing)} for row in trainer.history]
    return {"variant": variant, "seed": seed, "curve": curve, "history": history, "seconds": seconds,
            "model": trainer.model}


class VariantRecipe:
    """What the recipes of chapters 13 and 16 share (dataclasses with ``sft``, an
    :class:`~grpo_tutorial.sft.SFTConfig`, and ``grpo``, a :class:`~grpo_tutorial.config.GRPOConfig`)."""

    def grpo_config(self, seed: int, **changes: Any) -> GRPOConfig:
        """The GRPO phase's config for one run, with a variant's ``changes``."""
        return dataclasses.replace(self.grpo, seed=seed, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data; :meth:`from_dict` reads it back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]):
        from ..sft import SFTConfig

        record = dict(record)
        sft, grpo = SFTConfig(**record.pop("sft")), GRPOConfig(**record.pop("grpo"))
        return cls(sft=sft, grpo=grpo, **record)

"""The LoRA chapter's experiment: full fine-tuning against LoRA adapters over a learning-rate grid, on chapter 8's task.

"LoRA Without Regret" (Schulman et al., 2025) argues that in reinforcement learning
even rank-1 adapters learn as well as the whole model, provided they sit on every
linear layer and learn at about ten times full fine-tuning's rate, a rate that hardly
depends on the rank when ``lora_alpha`` is held fixed (the adapter's update is scaled
by ``alpha / r``). This module tests that on the tiny model and the 2-digit addition
of chapter 8 (:mod:`grpo_tutorial.chapters.recipes`):

- one warm start per seed, shared by every setting of that seed (so the
  comparison between settings is paired: same start, same data);
- every setting of :meth:`LowRankSweep.settings`: full fine-tuning at each of
  ``full_lrs``; LoRA on every linear layer at ranks ``ranks``, each at each of
  ``lora_lrs``; LoRA on the attention projections only, at the rank whose count
  of trained parameters matches every-linear-layer LoRA at ``matched_rank``;
- per run: the held-out greedy accuracy curve, the final per-problem outcomes,
  the trained parameters, AdamW's state bytes and the seconds per step.

:func:`summarize_sweep` puts the seeds together with :func:`~grpo_tutorial.stats.mean_ci`
and :func:`~grpo_tutorial.stats.paired_comparison`: final accuracy and gain per
setting, the best learning rate of each family, and each family at its best rate
against full fine-tuning at its best rate, paired by seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .._checks import check_int
from ..stats import mean_ci, paired_comparison
from ..trainer import GRPOTrainer
from . import sweep as sweep_runner
from .recipes import TinyAdditionRecipe

__all__ = [
    "ATTENTION",
    "LowRankSweep",
    "combine_sweeps",
    "lora_parameter_count",
    "matched_rank",
    "run_setting",
    "run_sweep_seed",
    "summarize_sweep",
]

#: Qwen2's attention projections (LoRA "on attention only").
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
#: PEFT's name for every linear layer but the output layer.
ALL_LINEAR = "all-linear"


def _targeted(model: torch.nn.Module, targets: str | Sequence[str]) -> list[torch.nn.Linear]:
    """The linear layers LoRA wraps for ``targets`` (``"all-linear"``: every one but the output layer)."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    found = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is output:
            continue
        if targets == ALL_LINEAR or name.split(".")[-1] in targets:
            found.append(module)
    if not found:
        raise ValueError(f"no linear layer of {type(model).__name__} matches {targets!r}")
    return found


def lora_parameter_count(model: torch.nn.Module, rank: int, targets: str | Sequence[str] = ALL_LINEAR) -> int:
    """Trained parameters of rank-``rank`` LoRA on ``targets``: ``r * (in + out)`` per wrapped layer (A and B)."""
    check_int(None, "rank", rank, 1)
    return sum(rank * (layer.in_features + layer.out_features) for layer in _targeted(model, targets))


def matched_rank(model: torch.nn.Module, rank: int, targets: Sequence[str] = ATTENTION) -> int:
    """The rank on ``targets`` whose trained parameters come nearest to every-linear-layer LoRA at ``rank``."""
    goal = lora_parameter_count(model, rank)
    per_rank = lora_parameter_count(model, 1, targets)
    return max(1, round(goal / per_rank))


@dataclass
class LowRankSweep:
    """What the experiment runs (see the module). The recipe's ``grpo_steps`` and ``eval_every`` apply to every run.

    ``lora_alpha`` is held fixed across ranks, as the paper does; the default
    recipe is chapter 8's with 80 GRPO steps and 500 held-out problems, as
    chapter 12's lab.
    """

    recipe: TinyAdditionRecipe = field(
        default_factory=lambda: TinyAdditionRecipe(grpo_steps=80, eval_every=20, n_test=500))
    full_lrs: tuple[float, ...] = (3e-5, 1e-4, 3e-4, 1e-3)
    lora_lrs: tuple[float, ...] = (3e-4, 1e-3, 3e-3, 1e-2)
    ranks: tuple[int, ...] = (1, 4, 16)
    lora_alpha: float = 32.0
    matched_rank: int = 4
    attention_lrs: tuple[float, ...] | None = None  # None: the same as lora_lrs; (): no attention-only runs
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)

    def __post_init__(self) -> None:
        for name in ("seeds",):
            if not getattr(self, name):
                raise ValueError(f"LowRankSweep.{name} is empty")
        for rank in self.ranks:
            check_int("LowRankSweep", "ranks[]", rank, 1)
        check_int("LowRankSweep", "matched_rank", self.matched_rank, 1)

    def settings(self, model: torch.nn.Module) -> dict[str, dict[str, Any]]:
        """Every setting's name and its ``GRPOConfig`` fields on top of the recipe's, for ``model``'s shapes."""
        out: dict[str, dict[str, Any]] = {}
        for lr in self.full_lrs:
            out[f"full lr={lr:g}"] = {"learning_rate": lr}
        lora = {"use_peft": True, "lora_alpha": self.lora_alpha, "lora_dropout": 0.0}
        for rank in self.ranks:
            for lr in self.lora_lrs:
                out[f"all r={rank} lr={lr:g}"] = {**lora, "lora_r": rank, "lora_target_modules": ALL_LINEAR,
                                                  "learning_rate": lr}
        attention_rank = matched_rank(model, self.matched_rank)
        for lr in self.lora_lrs if self.attention_lrs is None else self.attention_lrs:
            out[f"attn r={attention_rank} lr={lr:g}"] = {**lora, "lora_r": attention_rank,
                                                         "lora_target_modules": list(ATTENTION), "learning_rate": lr}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"recipe": self.recipe.to_dict(), "full_lrs": list(self.full_lrs), "lora_lrs": list(self.lora_lrs),
                "ranks": list(self.ranks), "lora_alpha": self.lora_alpha, "matched_rank": self.matched_rank,
                "attention_lrs": None if self.attention_lrs is None else list(self.attention_lrs),
                "seeds": list(self.seeds)}


def _family(name: str) -> str:
    return name.split(" lr=")[0]


def _optimizer_size(trainer: GRPOTrainer, first: dict, final: dict, curve: list) -> dict:
    """What a LoRA run keeps beyond the common fields: the trained parameters and AdamW's state bytes."""
    trained = sum(p.numel() for group in trainer.optimizer.param_groups for p in group["params"])
    state_bytes = sum(t.numel() * t.element_size() for s in trainer.optimizer.state.values()
                      for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
    return {"trained_parameters": trained, "optimizer_state_bytes": state_bytes}


def run_setting(start_model, tokenizer, data: dict, recipe: TinyAdditionRecipe, overrides: dict[str, Any],
                seed: int) -> dict:
    """Train a copy of ``start_model`` with the recipe's GRPO settings and ``overrides``; evaluate as it goes.

    :func:`grpo_tutorial.chapters.sweep.run_setting`'s fields, plus ``trained_parameters`` and
    ``optimizer_state_bytes``.
    """
    return sweep_runner.run_setting(start_model, tokenizer, data, recipe, overrides, seed, describe=_optimizer_size)


def run_sweep_seed(sweep: LowRankSweep, seed: int, *, only: Sequence[str] | None = None,
                   on_setting: Callable[[str, dict], None] | None = None) -> dict:
    """One seed: one warm start, then every setting (or those named in ``only``) from a copy of it
    (:func:`grpo_tutorial.chapters.sweep.run_sweep_seed`, with the base model's parameter count)."""
    recipe = sweep.recipe

    def run(name: str, overrides: dict[str, Any], model, tokenizer, data: dict) -> dict:
        return run_setting(model, tokenizer, data, recipe, overrides, seed)

    return sweep_runner.run_sweep_seed(
        recipe, seed, sweep.settings, run, only=only, on_setting=on_setting,
        describe_start=lambda model: {"base_parameters": sum(p.numel() for p in model.parameters())})


def summarize_sweep(seed_results: Sequence[dict], confidence: float = 0.95) -> dict:
    """Across seeds: each setting's final accuracy and gain (mean, SE, t interval) and held-out curve band; each
    family's best learning rate (highest mean final accuracy); each family at its best rate against full
    fine-tuning at its best rate, paired by seed (difference of final accuracies)."""
    table: dict[str, dict] = {}
    for name, runs in sweep_runner.runs_by_setting(seed_results).items():
        first = next(iter(runs.values()))
        table[name] = {
            "family": _family(name),
            "learning_rate": first["overrides"]["learning_rate"],
            **sweep_runner.setting_summary(runs, confidence),
            "trained_parameters": first["trained_parameters"],
            "optimizer_state_bytes": first["optimizer_state_bytes"],
            "seconds_per_step": mean_ci([run["seconds_per_step"] for run in runs.values()], confidence)["mean"],
        }
    families: dict[str, dict] = {}
    for name, entry in table.items():
        best = families.get(entry["family"])
        if best is None or entry["final_accuracy"]["mean"] > table[best["setting"]]["final_accuracy"]["mean"]:
            families[entry["family"]] = {"setting": name, "learning_rate": entry["learning_rate"]}
    full = next((f for f in families if f == "full"), None)
    for family, best in families.items():
        best["final_accuracy"] = table[best["setting"]]["final_accuracy"]
        if full is not None and family != full:
            mine = {int(s): v for s, v in table[best["setting"]]["per_seed_final"].items()}
            theirs = {int(s): v for s, v in table[families[full]["setting"]]["per_seed_final"].items()}
            best["vs_full"] = paired_comparison(mine, theirs, confidence)
            best["lr_ratio_to_full"] = best["learning_rate"] / families[full]["learning_rate"]
    return {"confidence": confidence, "settings": table, "families": families}


def combine_sweeps(*records: dict) -> list[dict]:
    """The per-seed results of several sweep records as one list, for :func:`summarize_sweep`.

    Each record (``python -m benchmarks.lora_regret``'s output) must hold the same
    seeds with the same recipe, so every seed's warm start is the same one; a
    setting that two records both ran must have given the same final accuracy
    (on the same machine a run repeats exactly), else ValueError.
    """
    if not records:
        raise ValueError("no records to combine")
    recipe = records[0]["sweep"]["recipe"]
    seeds = [r["seed"] for r in records[0]["seeds"]]
    combined = {s: {"seed": s, "settings": {}} for s in seeds}
    for record in records:
        if record["sweep"]["recipe"] != recipe or [r["seed"] for r in record["seeds"]] != seeds:
            raise ValueError(f"{record['command']!r} ran another recipe or other seeds than {records[0]['command']!r}")
        for run in record["seeds"]:
            into = combined[run["seed"]]["settings"]
            for name, result in run["settings"].items():
                if name in into and into[name]["final_accuracy"] != result["final_accuracy"]:
                    raise ValueError(f"seed {run['seed']}, {name}: the records disagree "
                                     f"({into[name]['final_accuracy']} and {result['final_accuracy']})")
                into.setdefault(name, result)
    return [combined[s] for s in seeds]

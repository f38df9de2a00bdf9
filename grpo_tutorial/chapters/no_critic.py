"""Chapter 17, "Why no critic": GRPO, RLOO, PPO with a value model and Monte Carlo values on one task.

The task is chapter 13's long addition (:mod:`grpo_tutorial.chapters.thinking`):
completions of about 72 tokens when a sum is worked out, long enough for one
advantage per token to differ from one per completion (chapter 8's 4-token
answers are not). Every method trains a copy of the same warm start for the same
steps, and the held-out statistics of chapter 13 (:func:`~grpo_tutorial.chapters.thinking.heldout_stats`)
are measured at the same points, with the same sampling seeds.

:data:`METHODS` are the four ways to get the advantages:

* ``"grpo"``: each reward against its group (stage 3 as the package does it);
* ``"rloo"``: against the mean of the other G - 1 (``advantage_baseline="rloo"``);
* ``"ppo"``: a value model, a copy of the policy with a head (:class:`~grpo_tutorial.ppo.step.PPOStep`);
* ``"monte_carlo"``: K continuations from each of M prefixes value each prefix
  (:class:`~grpo_tutorial.ppo.vine.MonteCarloStep`).

Compute. Every method samples the same completions per step (B*G). The Monte
Carlo values sample more: their extra tokens are in each step's row
(``mc_extra_tokens``), and :func:`compute_per_step` puts them beside the step's own,
so a record can match the sampled tokens by giving that method fewer prompts
(``prompts_per_step`` in its ``changes``) or report the ratio. The value model
samples nothing, but it costs passes: per step one forward pass without gradient
over the B*G rows (stage 3) and ``num_iterations`` forward and backward passes
(stage 5), each over a model as large as the policy; :func:`run_method` reports
them, the parameters each method trains and the bytes of their weights and
AdamW moments (:func:`training_bytes`), and the seconds per step.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Any, Sequence

import torch

from ..advantages import group_advantages, token_variance
from ..ppo.critic import count_parameters
from ..ppo import PPOSettings
from ..ppo.step import PPOStep
from ..rewards import correctness_reward
from ..stage_results import Advantages, Rewards
from ..stats import mean_ci
from ..step import GRPOStep
from ..trainer import GRPOTrainer
from ..ppo.vine import MonteCarloSettings, MonteCarloStep
from .thinking import CURVE_KEYS, EVAL_SEED_OFFSET, ThinkingRecipe, heldout_stats

__all__ = ["HISTORY_KEYS", "METHODS", "MeasuredStep", "compute_per_step", "run_method", "summarize_methods",
           "training_bytes"]

#: Each method: (what it is, the GRPOConfig changes it makes).
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("GRPO: each reward against its group's mean, divided by its std", {}),
    "rloo": ("RLOO: each reward against the mean of the other G - 1 of its group", {"advantage_baseline": "rloo"}),
    "ppo": ("PPO: a value model (a copy of the policy and a head), GAE, whitened", {}),
    "monte_carlo": ("Monte Carlo values: K continuations from each of M prefixes, no value model", {}),
}

#: The history keys a run keeps per step (those a method does not write are left out).
HISTORY_KEYS = ("step", "reward_mean", "accuracy", "completion_len_mean", "loss", "kl", "entropy", "advantage_var",
                "explained_variance", "value_loss", "value_mean", "value_clipfrac", "mc_extra_tokens",
                "mc_extra_rollouts", "step_seconds", "advantages_seconds", "update_seconds", "value_seconds")


def training_bytes(modules: Sequence[torch.nn.Module], optimizers: Sequence[torch.optim.Optimizer]) -> int:
    """The bytes of the modules' weights (each tensor once) and of the optimizers' state (AdamW's two moments)."""
    seen: set[int] = set()
    total = 0
    for module in modules:
        for p in module.parameters():
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                total += p.numel() * p.element_size()
    for optimizer in optimizers:
        for state in optimizer.state.values():
            total += sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))
    return total


def compute_per_step(row: dict, group_completions: int) -> dict[str, float]:
    """A step's sampled tokens: the B*G completions' (``completion_len_mean`` times their number) and the extra."""
    own = row["completion_len_mean"] * group_completions
    extra = row.get("mc_extra_tokens", 0.0)
    return {"sampled_tokens": own + extra, "own_tokens": own, "extra_tokens": extra}


class MeasuredStep(GRPOStep):
    """GRPO's step (RLOO's with ``advantage_baseline="rloo"``), unchanged, whose row gains ``advantage_var`` as
    PPO's and the Monte Carlo step's: the variance over the real tokens of what the baseline leaves, reward minus
    baseline, before any standard deviation divides it (each token carries its completion's)."""

    def advantages(self, rewards: Rewards) -> Advantages:
        cfg, mask = self.config, rewards.rollout.completion_mask  # [N, T]
        raw = group_advantages(rewards.rewards, cfg.group_size, scale="none", std=cfg.std, nan="skip",
                               baseline=cfg.advantage_baseline).to(mask.device)  # [N]
        advantages = super().advantages(rewards)
        advantages.row["advantage_var"] = token_variance(raw, mask)  # each token carries its completion's
        return advantages


def _step_for(method: str, model, tokenizer, rewards, config, *, ppo: PPOSettings, monte_carlo: MonteCarloSettings):
    if method == "ppo":
        return PPOStep(model, tokenizer, rewards, config, settings=ppo)
    if method == "monte_carlo":
        return MonteCarloStep(model, tokenizer, rewards, config, settings=monte_carlo)
    return MeasuredStep(model, tokenizer, rewards, config)


def run_method(method: str, start_model, tokenizer, data: dict[str, list[dict]], recipe: ThinkingRecipe, seed: int,
               *, ppo: PPOSettings | None = None, monte_carlo: MonteCarloSettings | None = None,
               changes: dict[str, Any] | None = None, progress: bool = False) -> dict:
    """Train a copy of ``start_model`` with ``method`` (:data:`METHODS`) for ``recipe.grpo_steps`` steps.

    ``changes`` adds GRPOConfig changes (a compute-matched ``prompts_per_step``, say);
    ``ppo`` and ``monte_carlo`` are the settings of those methods (the chapter's
    exercise makes the critic fail with ``PPOSettings(value_lr=...)``). Returns
    ``method``, ``seed``, ``curve`` (``step`` and the held-out keys, as chapter 13's),
    ``history`` (:data:`HISTORY_KEYS` of every step, with :func:`compute_per_step`'s
    fields), ``seconds`` (training only), ``parameters`` (the policy's, the value
    model's), ``training_bytes`` (weights and AdamW moments of what trains),
    ``critic_passes`` (per step, PPO only) and ``model``.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    ppo = PPOSettings() if ppo is None else ppo
    monte_carlo = MonteCarloSettings() if monte_carlo is None else monte_carlo
    config = recipe.grpo_config(seed, **{**METHODS[method][1], **(changes or {})})
    model = copy.deepcopy(start_model)
    step = _step_for(method, model, tokenizer, [correctness_reward], config, ppo=ppo, monte_carlo=monte_carlo)
    trainer = GRPOTrainer(model, tokenizer, [correctness_reward], config, step=step)  # the trainer's loop around it
    eval_seed = EVAL_SEED_OFFSET + seed

    def point() -> dict:
        return {"step": trainer.step, **heldout_stats(model, tokenizer, data["test"], config, eval_seed)}

    curve, seconds = [point()], 0.0
    chunk = recipe.eval_every or recipe.grpo_steps
    while trainer.step < recipe.grpo_steps:
        t0 = time.perf_counter()
        trainer.train(data["train"], min(recipe.grpo_steps, trainer.step + chunk), progress=progress)
        seconds += time.perf_counter() - t0
        curve.append(point())
    n = config.batch_completions
    history = [{**{k: row[k] for k in HISTORY_KEYS if k in row}, **compute_per_step(row, n)} for row in trainer.history]
    grpo_step = trainer.grpo_step
    critic = getattr(grpo_step, "critic", None)
    modules = [model] + ([critic] if critic is not None else [])
    optimizers = [grpo_step.optimizer] + ([grpo_step.value_optimizer] if critic is not None else [])
    policy_count = sum(p.numel() for p in model.parameters())
    out = {
        "method": method, "seed": seed, "curve": curve, "history": history, "seconds": seconds,
        "parameters": count_parameters(critic, model) if critic is not None else {"policy": policy_count},
        "training_bytes": training_bytes(modules, optimizers), "model": model,
        "settings": {"config": dataclasses.asdict(config), "ppo": ppo.to_dict() if method == "ppo" else None,
                     "monte_carlo": dataclasses.asdict(monte_carlo) if method == "monte_carlo" else None},
    }
    if critic is not None:
        out["critic_passes"] = {"forward_no_grad": 1, "forward_backward": config.num_iterations}
    return out


def summarize_methods(runs: Sequence[dict], keys: Sequence[str] = ("accuracy",)) -> dict[str, Any]:
    """Across seeds, per method: each curve key at each point (mean and 95% t interval), seconds per step and
    sampled tokens per step (mean and interval over seeds of each seed's mean)."""
    out: dict[str, Any] = {}
    for method in dict.fromkeys(run["method"] for run in runs):
        mine = [run for run in runs if run["method"] == method]
        steps = [p["step"] for p in mine[0]["curve"]]
        entry: dict[str, Any] = {"steps": steps, "seeds": len(mine)}
        for key in keys:
            if key not in CURVE_KEYS:
                raise ValueError(f"key must be one of {list(CURVE_KEYS)}, got {key!r}")
            entry[key] = [mean_ci([run["curve"][i][key] for run in mine]) for i in range(len(steps))]
        for key in ("step_seconds", "sampled_tokens", "advantage_var", "explained_variance"):
            finite = [[r[key] for r in run["history"] if math.isfinite(r.get(key, math.nan))] for run in mine]
            per_seed = [sum(values) / len(values) for values in finite if values]  # a seed's mean over its steps
            if per_seed:
                entry[key] = mean_ci(per_seed)
        out[method] = entry
    return out

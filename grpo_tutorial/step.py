"""One GRPO step, top to bottom: the five stages of :mod:`grpo_tutorial.stages`, beside chapter 0's loop.

:meth:`GRPOStep.__call__` is the whole step, one call per stage, its comments in
the order and the words of chapter 0's loop (``tests/test_stages.py`` checks them):
1. sample (rollout.py), 2. reward (rewards.py), 3. advantages (advantages.py),
4. score (logprobs.py: the sampling policy's log-probs, skipped when the step is
exactly on-policy, and the reference's), 5. update (loss.py, optim.py: mu passes
over shuffled minibatches, one optimizer update each, accumulated over
micro-batches); then the history row and its warnings (metrics.py). With
``dynamic_sampling`` (DAPO) stages 1-2 run again on more prompts until enough
groups carry a signal.

It imports nothing from :mod:`grpo_tutorial.run`: the loop around the step, its
checkpoints, history file and progress bar are
:class:`~grpo_tutorial.trainer.GRPOTrainer`'s. Two extension points let new
pieces plug in without growing the step: :class:`Policies` supplies the policy
and its reference (:class:`~grpo_tutorial.lora.AdapterPolicies`: the policy
with its LoRA adapters switched off, no copy), and ``sampler``, ``(prompts, seed) -> Rollout``,
writes the completions (default: the policy itself, :meth:`GRPOStep.generate`; a sampler
that is not the learner, ``config.sampler``, is :mod:`grpo_tutorial.mismatch`'s).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch

from .advantages import group_advantages, normalize_then_sum, zero_std_groups
from .config import GRPOConfig
from .logprobs import rollout_logprobs, score_rollout
from .loss import grpo_loss, update_normalisers
from .metrics import StageClock, check_failure_modes, step_row, timed
from .mismatch import build_sampler, loss_inputs, sampler_correction
from .models import disable_dropout, frozen_reference
from .objectives import EntropyControl
from .optim import finish_update, make_optimizer, trainable_parameters
from .rewards import (
    check_unscorable, compute_rewards, extra_columns, judge_correct, reward_function_list, reward_function_means,
)
from .rollout import Rollout, generate_rollouts, keep_signal_groups, pad_token_id, sampling_kwargs
from .seeding import minibatches, sampling_seed
from .tasks import check_rows

__all__ = ["GRPOStep", "Policies", "Sampler"]

#: ``(prompts, generator_seed) -> Rollout``: what writes a step's completions (extension point).
Sampler = Callable[[list, int], Rollout]


class Policies:
    """The policy being trained and the frozen reference its KL term compares it with (extension point).

    This default holds a separate model as the reference (None without a KL
    penalty); :class:`~grpo_tutorial.lora.AdapterPolicies` yields the policy with
    its LoRA adapters switched off instead, so that no second copy is kept.
    """

    def __init__(self, policy: torch.nn.Module, reference: torch.nn.Module | None = None) -> None:
        self.policy, self.reference_model = policy, reference

    @contextmanager
    def reference(self) -> Iterator[torch.nn.Module]:
        """The reference, for the length of a scoring pass."""
        yield self.reference_model

    def sync_reference(self) -> None:
        """``ref_sync_every``: the reference becomes a copy of the policy (nothing to do without one)."""
        if self.reference_model is not None:
            self.reference_model.load_state_dict(self.policy.state_dict())


class GRPOStep:
    """One GRPO step as a callable: ``row = grpo_step(batch, state, history)``.

    It holds what the stages need across steps: the policies, the reward
    functions, the optimizer and its schedule, the entropy coefficient. ``state``
    is where the run stands (the trainer's :class:`~grpo_tutorial.run.state.RunState`:
    anything with ``step``, ``skipped_updates`` and ``warn(kind, message)``);
    the call advances ``state.step``. Arguments as :class:`~grpo_tutorial.trainer.GRPOTrainer`'s.
    """

    def __init__(self, model, tokenizer, reward_fns, config: GRPOConfig | None = None, ref_model=None, *,
                 accuracy_fn: Callable | None = None, sampler: Sampler | None = None,
                 policies: Policies | None = None) -> None:
        config = GRPOConfig() if config is None else config
        if not isinstance(config, GRPOConfig):
            raise TypeError(f"config must be a GRPOConfig, got {type(config).__name__}")
        self.reward_fns = list(reward_function_list(reward_fns, config.reward_weights))
        if getattr(tokenizer, "eos_token_id", None) is None:
            raise ValueError("tokenizer.eos_token_id is None; the trainer needs an EOS token")
        for name, fn in (("accuracy_fn", accuracy_fn), ("sampler", sampler)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be None or a function, got {type(fn).__name__}")
        if ref_model is not None and ref_model is model:
            raise ValueError("ref_model is the policy itself; the reference must be a separate, frozen copy "
                             "(pass ref_model=None to let the trainer make one, or copy.deepcopy(model))")
        self.tokenizer, self.config, self.accuracy_fn = tokenizer, config, accuracy_fn
        if config.disable_dropout:
            disable_dropout(model)
        if policies is None:  # the reference only with a KL penalty: the given one, or a frozen copy of the policy
            if config.use_peft:  # LoRA's policies wrap the model first, as GRPOTrainer does
                raise ValueError("config.use_peft needs policies=lora.adapter_policies(model, config) (GRPOTrainer's)")
            ref = frozen_reference(model, ref_model, without_dropout=config.disable_dropout) if config.beta > 0 else None
            policies = Policies(model, ref)
        self.policies = policies
        self.sampler = build_sampler(sampler, policies.policy, tokenizer, config)  # None: the policy (generate)
        self.entropy_control = EntropyControl.from_config(config)  # the entropy bonus's coefficient (adaptive: it moves)
        self.params = trainable_parameters(model)
        self.optimizer, self.scheduler = make_optimizer(self.params, config)
        #: Reuse the gradient pass's log-probs as the old policy's when a step makes exactly one
        #: update (stage 4's old-policy pass is then skipped). Tests switch it off to compare both paths.
        self.reuse_on_policy_logprobs = True
        self.last_batch: tuple | None = None  # (prompts, completions, rewards, per_fn, advantages) of the last step

    @property
    def model(self) -> torch.nn.Module:
        return self.policies.policy

    def __call__(self, batch: Sequence[dict], state: Any, history: Sequence[dict],
                 more_rows: Callable[[], list[dict]] | None = None) -> dict:
        """One step on ``batch`` (rows with ``prompt`` and ``answer``); returns its history row."""
        check_rows(batch, "batch")
        cfg, clock = self.config, StageClock()
        # 1. sample and 2. reward (with dynamic sampling: more rounds until enough groups have a signal)
        sample = self.sample(batch, state, more_rows, clock)
        rollout = sample["rollout"]
        # 3. advantages: each reward against its group (by default a z-score), [N]
        advantages = self.advantages(sample).to(rollout.completion_ids.device)
        # 4. score: the sampling policy's log-probs (unless the step is exactly on-policy) ...
        on_policy = self.reuse_on_policy_logprobs and cfg.updates_per_step == 1 and rollout.sampler_logprobs is None
        old_logp, entropy = (None, None) if on_policy else self.score(self.model, rollout, entropy=True)
        # ... beside a sampler copy's own: the importance weights (with the correction) and the mismatch's size
        weights, sample["mismatch"] = sampler_correction(old_logp, rollout, cfg)  # [N, T] or [N, 1], or None
        clock.lap("score")
        # ... and the reference's, only with a KL penalty, [N, Tc]
        with self.policies.reference() as reference:
            ref_logp = None if reference is None else self.score(reference, rollout, entropy=False)
        clock.lap("reference")
        # 5. update: mu passes over shuffled minibatches, one optimizer update each
        update = self.update(rollout, old_logp, ref_logp, advantages, state, weights)
        # the history's entropy: stage 4's pass, or on-policy the update's own pass (filled in accumulate)
        entropy = update["entropy"] if entropy is None else entropy  # [N, Tc]
        state.step += 1  # completed steps: the step that ran was number state.step
        if cfg.beta > 0 and cfg.ref_sync_every and state.step % cfg.ref_sync_every == 0:
            self.policies.sync_reference()
        clock.lap("update")
        self.last_batch = (rollout.prompts, rollout.completions, sample["rewards"], sample["per_fn"], advantages)
        # after the step: the history row, and warnings about failure modes
        return self.history_row(sample, update, entropy, clock, state, history)

    # ------------------------------------------------------------------ 1-2. sample and reward
    def sample(self, batch, state, more_rows, clock: StageClock) -> dict:
        """Stages 1-2, one round; with ``dynamic_sampling``, more rounds until the step has
        ``prompts_per_step`` groups with a learning signal (or ``max_sampling_rounds``)."""
        cfg = self.config
        rounds = [self.sample_round(batch, state, 0, clock)]
        while (
            cfg.dynamic_sampling and more_rows is not None and len(rounds) < cfg.max_sampling_rounds
            and sum(int((~r["zero_std"]).sum()) for r in rounds) < cfg.prompts_per_step
        ):
            extra = more_rows()
            check_rows(extra, "more_rows()")
            rounds.append(self.sample_round(extra, state, len(rounds), clock))
        chosen = rounds[0] if len(rounds) == 1 else keep_signal_groups(rounds, cfg.group_size, cfg.prompts_per_step,
                                                                       pad_token_id(self.tokenizer))
        return {**chosen, "groups_drawn": sum(len(r["zero_std"]) for r in rounds)}

    def sample_round(self, batch, state, round_: int, clock: StageClock) -> dict:
        """Stages 1 and 2 for one sampling round: the rollout, its rewards and which groups carry no signal."""
        cfg, G = self.config, self.config.group_size
        seed = sampling_seed(cfg.seed, state.step, round_)  # round 0: the SAMPLING stream; later ones: RESAMPLING
        # 1. sample: all B*G completions in one generate call
        rollout = (self.sampler or self.generate)([row["prompt"] for row in batch], seed)  # N = B*G completions
        clock.lap("generate")
        # 2. reward: [N] (NaN: no reward function could score the completion)
        answers = [row.get("answer") for row in batch for _ in range(G)]
        columns = extra_columns(batch, G)
        rewards, per_fn = compute_rewards(
            self.reward_fns, cfg.reward_weights, rollout.prompts, rollout.completions, answers,
            completion_ids=rollout.completion_id_lists(), **columns,
        )  # [N], {name: [N]}
        correct = judge_correct(self.accuracy_fn, rollout.prompts, rollout.completions, answers, columns)
        check_unscorable(rewards, state.warn)
        zero_std = zero_std_groups(rewards, G)  # [B]
        clock.lap("reward")
        return {"rollout": rollout, "rewards": rewards, "per_fn": per_fn, "correct": correct, "zero_std": zero_std}

    def generate(self, prompts: list, generator_seed: int) -> Rollout:
        """The default sampler: the policy itself, with the config's sampling settings."""
        return generate_rollouts(self.model, self.tokenizer, prompts,
                                 **sampling_kwargs(self.config, generator_seed=generator_seed))

    # ------------------------------------------------------------------ 3. advantages
    def advantages(self, sample: dict) -> torch.Tensor:
        """Stage 3: group-relative advantages, [N] (GDPO: of each reward function, then of their weighted sum)."""
        cfg = self.config
        if cfg.multi_objective_aggregation == "normalize_then_sum":
            per_function = torch.stack(list(sample["per_fn"].values()), dim=1)  # [N, K]
            return normalize_then_sum(per_function, cfg.group_size, cfg.reward_weights, std=cfg.std)  # [N]
        return group_advantages(sample["rewards"], cfg.group_size, scale=cfg.scale_rewards, std=cfg.std, nan="skip",
                                baseline=cfg.advantage_baseline)  # [N]

    # ------------------------------------------------------------------ 4. score
    def score(self, model: torch.nn.Module, rollout: Rollout, *, entropy: bool) -> Any:
        """Stage 4: log-probs (and entropy) of all N completions, eval mode, no gradient."""
        cfg = self.config
        return score_rollout(model, rollout, temperature=cfg.temperature, chunk=cfg.micro_size, return_entropy=entropy,
                             share_prompts=cfg.share_prompt_cache)

    # ------------------------------------------------------------------ 5. update
    def update(self, rollout: Rollout, old_logp, ref_logp, advantages: torch.Tensor, state: Any, weights=None) -> dict:
        """Stage 5: mu passes of optimizer updates over shuffled minibatches.

        Each update's gradient is accumulated over micro-batches of
        ``micro_batch_size`` completions, with the loss type's normaliser for the
        whole update (see :mod:`grpo_tutorial.objectives`). With ``old_logp`` None
        (an on-policy step: one update) the old log-probs are the gradient pass's
        own, detached, and the entropy comes from the same pass. ``weights``: a sampler copy's
        importance weights (:mod:`~grpo_tutorial.mismatch`); a sampler's ``sync()`` runs after every update.
        """
        cfg, mask = self.config, rollout.completion_mask
        out: dict[str, Any] = {"stats": [], "losses": [], "grad_norms": [], "entropy": None}
        out["seconds"] = {"forward_seconds": 0.0, "backward_seconds": 0.0, "optimizer_seconds": 0.0}
        out["lr"] = float(self.optimizer.param_groups[0]["lr"])
        if old_logp is None:  # filled by each micro-batch's pass; NaN: a row no pass reached (skipped update)
            out["entropy"] = torch.full(mask.shape, math.nan, dtype=torch.float32, device=mask.device)  # [N, Tc]
        # mu passes (num_iterations), each cut into shuffled minibatches: one optimizer update per minibatch
        updates = minibatches(len(rollout), cfg.update_size, cfg.num_iterations, cfg.seed, state.step, advantages.device)
        was_training = self.model.training
        self.model.train()
        try:
            for rows in updates:  # [M] the completions of one optimizer update
                out["lr"] = float(self.optimizer.param_groups[0]["lr"])
                self.optimizer.zero_grad(set_to_none=True)
                loss = self.accumulate(rollout, rows, old_logp, ref_logp, advantages, out, weights)
                with timed(out["seconds"], "optimizer_seconds"):  # a non-finite loss or norm: no update
                    norm, skipped = finish_update(self.params, self.optimizer, self.scheduler, cfg.max_grad_norm, loss)
                if hasattr(self.sampler, "sync"):  # a sampler copy follows the policy (mismatch.SamplerCopy)
                    self.sampler.sync()
                out["losses"].append(loss)
                out["grad_norms"].append(norm)
                if skipped is not None:  # history['skipped_updates'] counts it; the warning comes once per run
                    state.skipped_updates += 1
                    state.warn("nonfinite", f"step {state.step + 1}: {skipped}")
        finally:
            self.model.train(was_training)
        return out

    def accumulate(self, rollout, rows, old_logp, ref_logp, advantages, out, weights=None) -> float:
        """Backward over the micro-batches of one update; return the update's loss.

        Stops at the first non-finite micro-batch loss (the caller then skips
        the update), so no NaN gradient is ever accumulated. When the loss uses
        the entropy (``top_entropy_quantile``, ``entropy_coef``), it is the
        current policy's, from this gradient pass, with its gradient (as TRL).
        """
        cfg, micro, first = self.config, self.config.micro_size, len(out["stats"])  # this update's stats start at first
        mask = rollout.completion_mask
        options = self.entropy_control.loss_options(cfg.loss_options())  # the loss's settings, this update's coef
        measure = options.needs_entropy or cfg.use_adaptive_entropy  # grpo_loss gets (and sums) the entropies
        with_entropy = old_logp is None or measure  # the scoring pass returns the entropies
        truncated = rollout.truncated.to(mask.device)  # [N]
        normalisers = update_normalisers(options, mask, truncated, rows, micro)  # of the whole update: K, its tokens
        total = 0.0
        for start in range(0, len(rows), micro):
            part = rows[start : start + micro]  # [m]
            with timed(out["seconds"], "forward_seconds"):
                scored = rollout_logprobs(
                    self.model, rollout, part, temperature=cfg.temperature, return_entropy=with_entropy,
                    entropy_grad=options.needs_entropy, share_prompts=cfg.share_prompt_cache,
                )
                logp, entropies = scored if with_entropy else (scored, None)  # [m, Tc] x2
                if old_logp is None:
                    out["entropy"][part] = entropies.detach().float()
                loss, stats = grpo_loss(
                    logp, logp.detach() if old_logp is None else old_logp[part], advantages[part], mask[part],
                    options=options, ref_logp=None if ref_logp is None else ref_logp[part], truncated=truncated[part],
                    entropies=entropies if measure else None, **loss_inputs(rollout, weights, part),  # mismatch.py
                    **normalisers,
                )
                out["stats"].append(stats)
                value = float(loss.detach())
            total += value
            if not math.isfinite(value):
                return value
            with timed(out["seconds"], "backward_seconds"):
                loss.backward()
        self.entropy_control.measured(out["stats"][first:])  # adaptive: the update's entropy sets the next coefficient
        return total

    # ------------------------------------------------------------------ after the step
    def history_row(self, sample: dict, update: dict, entropy, clock: StageClock, state: Any, history) -> dict:
        """The step's history row, checked for failure modes."""
        cfg, rollout, rewards = self.config, sample["rollout"], sample["rewards"]
        row = step_row(
            step=state.step, rewards=rewards, per_function=reward_function_means(sample["per_fn"]),
            correct=sample["correct"], update_stats=update["stats"], losses=update["losses"],
            grad_norms=update["grad_norms"], entropy=entropy, mask=rollout.completion_mask,
            zero_std=zero_std_groups(rewards, cfg.group_size), truncated=rollout.truncated, lr=update["lr"],
            skipped_updates=state.skipped_updates, seconds={**clock.done(), **update["seconds"]},
        )
        row["groups_drawn"] = sample["groups_drawn"]
        row.update(sample["mismatch"])  # a sampler that is not the learner: how far apart they are (mismatch.py)
        if cfg.use_adaptive_entropy or cfg.entropy_coef != 0.0:
            row["entropy_coef"] = self.entropy_control.coef  # after the step's last update, as TRL logs it
        check_failure_modes(row, history, group_size=cfg.group_size, learning_rate=cfg.learning_rate,
                            max_new_tokens=cfg.max_new_tokens, warn=state.warn)
        return row

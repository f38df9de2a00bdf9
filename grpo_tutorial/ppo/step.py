"""One PPO step with a value model (chapter 17): :class:`~grpo_tutorial.step.GRPOStep` with two stages replaced.

The step is GRPO's, stage by stage (:mod:`grpo_tutorial.step`), except:

* 3. advantages: a no-grad pass of the value model (:mod:`grpo_tutorial.ppo.critic`)
  gives V for every completion token; the reward is each completion's score on
  its last real token (and, with ``kl_in_reward``, ``-beta * KL_t`` on every
  token; then stage 4's scoring pass runs here, since the reward needs it); GAE
  (:func:`~grpo_tutorial.ppo.gae`) turns them into one advantage per token and
  the returns, and the advantages are whitened over the batch. No group enters:
  the value model is the baseline. ``[N, T]`` advantages go to the same loss,
  :func:`~grpo_tutorial.loss.grpo_loss` (with ``kl_in_reward``, its beta is 0).
* 5. update: first the value model's updates, on the same minibatches, with its
  own AdamW and learning rate (:func:`~grpo_tutorial.ppo.value_loss` against the
  returns), then the policy's, as GRPO's; during the first
  ``value_warmup_steps`` steps only the value model trains.

The history row gains ``value_loss`` (mean over the step's value updates),
``value_clipfrac``, ``value_grad_norm``, ``value_mean``, ``explained_variance``
(of the values at sampling time, against the returns), ``advantage_var`` (the
variance of the advantages over the real tokens, before whitening) and
``value_seconds``. The settings are :class:`~grpo_tutorial.ppo.PPOSettings`; the
run's :class:`~grpo_tutorial.config.GRPOConfig` settings that assume no critic are
refused (:func:`~grpo_tutorial.ppo.check_critic_config`).

A run passes the step to the trainer, ``GRPOTrainer(model, tokenizer, rewards,
config, step=PPOStep(model, tokenizer, rewards, config))``; the trainer's
checkpoints then hold the value model and its optimizer too
(:meth:`PPOStep.extra_state`), so a PPO run killed and resumed is the same run.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import torch

from ..advantages import token_variance
from ..config import GRPOConfig
from ..kl import kl_estimate
from ..optim import clip_and_step
from ..seeding import minibatches
from ..stage_results import Advantages, Rewards, Scores, Updates
from ..step import GRPOStep
from .critic import ValueModel, build_value_model
from .formulas import PPOSettings, check_critic_config, explained_variance, gae, token_rewards, value_loss, whiten

__all__ = ["CriticAdvantages", "PPOStep"]


@dataclasses.dataclass(kw_only=True)
class CriticAdvantages(Advantages):
    """PPO's stage 3 result: GAE's per-token advantages (``values``, ``[N, T]``; ``mask``: the tokens that learn,
    those of completions with a reward), and what stage 5 trains the value model on: its values at sampling time
    (``old_values``, the clipping's anchor) and the ``returns`` (its targets), ``[N, T]`` each."""

    old_values: torch.Tensor
    returns: torch.Tensor


class PPOStep(GRPOStep):
    """PPO's step: GRPO's with a value model's advantages (stage 3) and its training (stage 5).

    Arguments as :class:`~grpo_tutorial.step.GRPOStep`'s, and:

    Args:
        settings: :class:`~grpo_tutorial.ppo.PPOSettings` (default: its defaults).
        value_model: a :class:`~grpo_tutorial.ppo.critic.ValueModel` to use (default:
            ``build_value_model(model, settings.value_model)``).
    """

    def __init__(self, model, tokenizer, reward_fns, config: GRPOConfig | None = None, ref_model=None, *,
                 settings: PPOSettings | None = None, value_model: ValueModel | None = None, **kwargs: Any) -> None:
        config = GRPOConfig() if config is None else config
        settings = PPOSettings() if settings is None else settings
        if not isinstance(config, GRPOConfig):
            raise TypeError(f"config must be a GRPOConfig, got {type(config).__name__}")
        check_critic_config(config, settings)
        super().__init__(model, tokenizer, reward_fns, config, ref_model, **kwargs)
        if value_model is not None and not isinstance(value_model, ValueModel):
            raise TypeError(f"value_model must be a ValueModel (grpo_tutorial.ppo.critic), got {type(value_model).__name__}")
        self.settings = settings
        self.critic = build_value_model(self.model, settings.value_model) if value_model is None else value_model
        self.value_optimizer = torch.optim.AdamW(self.critic.trainable_parameters(), lr=settings.value_lr,
                                                 weight_decay=0.0)
        if settings.kl_in_reward:  # the reward needs the sampling policy's log-probs at stage 3: no on-policy shortcut
            self.reuse_on_policy_logprobs = False

    # ------------------------------------------------------------------ the checkpoint
    def extra_state(self) -> dict:
        """The value model's weights and its optimizer's state (a checkpoint holds them beside the policy's)."""
        return {"critic": self.critic.state_dict(), "value_optimizer": self.value_optimizer.state_dict()}

    def load_extra_state(self, state: dict) -> None:
        """Undo :meth:`extra_state`; a checkpoint without the value model (saved by another step) is refused:
        resumed with a new critic, the run would not be the run."""
        if "critic" not in state:
            raise ValueError("this checkpoint holds no value model (it was not saved by a PPOStep); resuming PPO "
                             "from it would start a new critic. Resume it with the step that saved it")
        self.critic.load_state_dict(state["critic"])
        self.value_optimizer.load_state_dict(state["value_optimizer"])

    # ------------------------------------------------------------------ 3. advantages
    def advantages(self, rewards: Rewards) -> CriticAdvantages:
        """Stage 3: GAE's per-token advantages ``[N, T]`` from the value model's values (whitened), with the values
        and returns stage 5 trains the value model on."""
        cfg, s, rollout = self.config, self.settings, rewards.rollout
        mask = rollout.completion_mask  # [N, T]
        scored = rewards.rewards.to(mask.device)  # [N]; NaN: no reward function could score it
        live = mask * (~torch.isnan(scored)).to(mask.dtype)[:, None]  # [N, T]: the tokens that learn
        kl = scores = None
        if s.kl_in_reward:  # stage 4's pass, here: the reward needs the policy's and the reference's log-probs
            scores = self.score(rollout)  # handed on: stage 4 does not run again
            kl = kl_estimate(scores.old_logp, scores.ref_logp, kind=cfg.kl_kind)  # [N, T]
        values = self.value_pass(rollout)  # [N, T], no gradient
        per_token = token_rewards(torch.nan_to_num(scored, nan=0.0), mask, kl, cfg.beta)  # [N, T]
        raw, returns = gae(per_token, values, mask, s.gamma, s.lam)  # [N, T] x2
        advantages = whiten(raw, live) if s.whiten and live.sum() >= 2 else raw * live  # [N, T]
        n = live.sum().clamp(min=1)
        row = {"explained_variance": explained_variance(values, returns, live),
               "advantage_var": token_variance(raw, live), "value_mean": float((values * live).sum() / n)}
        return CriticAdvantages(advantages, live, row, scores, old_values=values, returns=returns)

    @torch.no_grad()
    def value_pass(self, rollout) -> torch.Tensor:
        """The value model's values of every completion token, ``[N, T]``, in eval mode, in micro-batches."""
        was_training = self.critic.training
        self.critic.eval()
        try:
            chunks = [self.critic.values(rollout, torch.arange(start, min(start + self.config.micro_size, len(rollout)),
                                                               device=rollout.completion_ids.device))
                      for start in range(0, len(rollout), self.config.micro_size)]
        finally:
            self.critic.train(was_training)
        return torch.cat(chunks).float() * rollout.completion_mask

    # ------------------------------------------------------------------ 5. update
    def update(self, rollout, scores: Scores, advantages: CriticAdvantages, state: Any) -> Updates:
        """Stage 5: the value model's updates, then the policy's (none during the value warm-up)."""
        start = time.perf_counter()
        value_row = self.train_value_model(rollout, advantages, state)
        value_seconds = time.perf_counter() - start
        if state.step < self.settings.value_warmup_steps:
            out = self.hold_policy(rollout, scores)
        else:
            out = super().update(rollout, scores, advantages, state)
        out.seconds["value_seconds"] = value_seconds
        out.row.update(value_row)
        return out

    def train_value_model(self, rollout, advantages: CriticAdvantages, state: Any) -> dict[str, float]:
        """The value model's updates on the step's minibatches (as the policy's), against stage 3's returns: its
        loss, clip fraction and grad norm (means over the updates)."""
        cfg, mask, micro = self.config, advantages.mask, self.config.micro_size
        params = self.critic.trainable_parameters()
        losses, norms, clipfracs = [], [], []
        self.critic.train()
        for rows in minibatches(len(rollout), cfg.update_size, cfg.num_iterations, cfg.seed, state.step, mask.device):
            tokens = mask[rows].sum()
            if tokens == 0:  # no scored completion in this update
                continue
            self.value_optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for start in range(0, len(rows), micro):
                part = rows[start : start + micro]
                values = self.critic.values(rollout, part).float()  # [m, T], with gradient
                loss, stats = value_loss(values, advantages.old_values[part], advantages.returns[part], mask[part],
                                         self.settings.cliprange_value, num_tokens=tokens)
                loss.backward()
                total += float(loss.detach())
                clipfracs.append(stats["value_clipfrac"])
            norms.append(clip_and_step(params, self.value_optimizer, None, cfg.max_grad_norm))  # as the policy's
            losses.append(total)
        mean = lambda xs: float(sum(xs) / len(xs)) if xs else math.nan  # noqa: E731
        return {"value_loss": mean(losses), "value_clipfrac": mean(clipfracs), "value_grad_norm": mean(norms)}

    def hold_policy(self, rollout, scores: Scores) -> Updates:
        """The value warm-up's stage 5 for the policy: no update; the entropy from a no-grad pass when on-policy."""
        entropy = self.logprobs(self.model, rollout, entropy=True)[1] if scores.old_logp is None else None
        return Updates(lr=float(self.optimizer.param_groups[0]["lr"]), entropy=entropy)

    def loss(self, logp, old_logp, advantages, mask, **inputs: Any) -> tuple[torch.Tensor, dict]:
        """GRPO's loss on the per-token advantages; with ``kl_in_reward`` its KL term is off (the reward has it)."""
        if self.settings.kl_in_reward:
            inputs["options"] = dataclasses.replace(inputs["options"], beta=0.0)
        return super().loss(logp, old_logp, advantages, mask, **inputs)

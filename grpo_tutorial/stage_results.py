"""What the stages of one step hand each other: one small dataclass per stage (:mod:`grpo_tutorial.stages`).

:meth:`GRPOStep.__call__ <grpo_tutorial.step.GRPOStep.__call__>` reads top to
bottom as five calls, each taking the results before it::

    rollout = self.sample(batch, step)                    # 1. a Rollout (grpo_tutorial.rollout)
    rewards = self.reward(batch, rollout, state)          # 2. Rewards
    advantages = self.advantages(rewards)                 # 3. Advantages
    scores = self.score(rollout)                          # 4. Scores
    updates = self.update(rollout, scores, advantages, state)  # 5. Updates

A step that changes a stage (PPO's value model, the Monte Carlo values, a
chapter's measured or broken step) overrides that stage's method and returns the
same type, or a subclass with what its later stage needs
(:class:`~grpo_tutorial.ppo.step.CriticAdvantages`); the fields it adds to the
history row go in the ``row`` of stage 3's or stage 5's result (the stages the
package's own steps change). Nothing passes between the stages on the step object.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .rollout import Rollout

__all__ = ["Advantages", "Rewards", "Scores", "Updates"]


@dataclass
class Rewards:
    """Stage 2's result: the rollout's rewards, and what the history and the rounds of dynamic sampling read.

    Attributes:
        rollout: stage 1's :class:`~grpo_tutorial.rollout.Rollout` (after dynamic
            sampling: the groups it kept).
        rewards: ``[N]``, the weighted sum of the functions' (NaN: no function could score it).
        per_fn: ``{name: [N]}``, each reward function's own.
        correct: N booleans (or None without an accuracy function): whether each answer is right.
        answers: N reference answers (the row's ``answer``, repeated G times).
        zero_std: ``[B]``, True for a group whose rewards are all equal (no signal).
        groups_drawn: the groups sampled this step (more than B with dynamic sampling).
        columns: the batch's other columns, N values each, as the reward functions got them.
        step: the step they were sampled at (its number before the step: ``state.step``; it seeds what depends on it).
    """

    rollout: Rollout
    rewards: torch.Tensor
    per_fn: dict[str, torch.Tensor]
    correct: list | None
    answers: list
    zero_std: torch.Tensor
    groups_drawn: int
    columns: dict[str, list]
    step: int


@dataclass
class Advantages:
    """Stage 3's result.

    Attributes:
        values: ``[N]`` (one per completion, GRPO's) or ``[N, T]`` (one per token: PPO's, the Monte Carlo values').
        mask: ``[N, T]``, with per-token values: the tokens whose mean is each completion's
            :meth:`per_completion` (None with ``[N]``).
        row: fields this stage adds to the history row (``advantage_var``, say).
        scores: stage 4's :class:`Scores` when stage 3 needed them (PPO with the KL in its reward):
            stage 4 then does not run again.
    """

    values: torch.Tensor
    mask: torch.Tensor | None = None
    row: dict[str, float] = field(default_factory=dict)
    scores: Scores | None = None

    def to(self, device: torch.device | str) -> Advantages:
        """The same result with ``values`` on ``device``."""
        return replace(self, values=self.values.to(device))

    def per_completion(self) -> torch.Tensor:
        """One advantage per completion ``[N]``, what the run logs beside each: the value itself, or the mean over
        ``mask`` of the per-token values (0 for a completion with no token in it)."""
        if self.mask is None:
            return self.values
        return (self.values * self.mask).sum(dim=1) / self.mask.sum(dim=1).clamp(min=1)


@dataclass
class Scores:
    """Stage 4's result (no gradient).

    Attributes:
        old_logp, entropy: ``[N, Tc]``, the sampling policy's log-probs and entropy;
            None when the step is exactly on-policy (the update's own pass gives them).
        weights: a sampler copy's importance weights (``[N, T]`` or ``[N, 1]``; None
            without a copy; :mod:`~grpo_tutorial.mismatch`).
        mismatch: the history's fields of how far that copy is from the learner (``{}`` without one).
        ref_logp: ``[N, Tc]``, the reference's log-probs (None without a KL penalty).
        seconds: the seconds of the reference's pass (``reference_seconds``).
    """

    old_logp: torch.Tensor | None
    entropy: torch.Tensor | None
    weights: torch.Tensor | None
    mismatch: dict[str, float]
    ref_logp: torch.Tensor | None
    seconds: dict[str, float]


@dataclass
class Updates:
    """Stage 5's result: what the step's optimizer updates measured.

    Attributes:
        lr: the learning rate of the last update.
        entropy: ``[N, Tc]``, the entropy from the update's own pass when stage 4 gave none (NaN: a row no pass
            reached), else None.
        stats: the loss's statistics, one dict per micro-batch; ``losses``, ``grad_norms``: one per update.
        seconds: ``forward_seconds``, ``backward_seconds``, ``optimizer_seconds`` (and what a step adds).
        row: fields this stage adds to the history row (the value model's, say).
    """

    lr: float
    entropy: torch.Tensor | None = None
    stats: list[dict] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    seconds: dict[str, float] = field(
        default_factory=lambda: {"forward_seconds": 0.0, "backward_seconds": 0.0, "optimizer_seconds": 0.0})
    row: dict[str, Any] = field(default_factory=dict)

"""DAPO's dynamic sampling: stages 1 and 2 again, on more prompts, until a step has enough groups with a signal.

A group whose G completions all earned the same reward has advantages of 0 and
teaches nothing (chapter 2). DAPO (Yu et al., 2025) keeps drawing prompts until
``prompts_per_step`` groups carry a signal; :meth:`~grpo_tutorial.step.GRPOStep.__call__`
runs :func:`more_rounds` after stage 2 when ``GRPOConfig.dynamic_sampling`` is on.
The rounds' bookkeeping reads stage 2's results (the rewards and which groups are
all-equal), so it lives here, after both stages, not in stage 1's :mod:`~grpo_tutorial.rollout`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from .rollout import concat_groups, merge_sampler_stats
from .stage_results import Rewards

__all__ = ["keep_signal_groups", "more_rounds"]


def keep_signal_groups(rounds: Sequence[Rewards], group_size: int, size: int, pad_id: int) -> Rewards:
    """DAPO's dynamic sampling: ``size`` groups from several sampling rounds, those with a learning signal first.

    Each round is stage 2's :class:`~grpo_tutorial.stage_results.Rewards` (its ``zero_std``, ``[B]``, is True for a
    group whose rewards are all equal). The groups with a signal are taken in the order drawn; if there are fewer
    than ``size``, the first zero-std groups fill the step up. Returns one ``Rewards`` of those groups (joined by
    :func:`concat_groups`), its ``groups_drawn`` the groups of every round.
    """
    G = group_size
    order = [(k, g) for k, r in enumerate(rounds) for g in range(len(r.zero_std)) if not r.zero_std[g]]
    order += [(k, g) for k, r in enumerate(rounds) for g in range(len(r.zero_std)) if r.zero_std[g]]
    picked = [(rounds[k], g) for k, g in order[:size]]  # signal groups first, group by group
    rollout = concat_groups([(r.rollout, [g]) for r, g in picked], pad_id)
    rollout.sampler_stats = merge_sampler_stats([r.rollout.sampler_stats for r in rounds])  # every round's

    def rows(values: Sequence[tuple[torch.Tensor, int]]) -> torch.Tensor:
        return torch.cat([v[g * G : (g + 1) * G] for v, g in values])

    rewards = rows([(r.rewards, g) for r, g in picked])  # [N]
    per_fn = {name: rows([(r.per_fn[name], g) for r, g in picked]) for name in rounds[0].per_fn}
    correct = None
    if all(r.correct is not None for r in rounds):
        correct = [c for r, g in picked for c in r.correct[g * G : (g + 1) * G]]
    answers = [a for r, g in picked for a in r.answers[g * G : (g + 1) * G]]
    # the columns every round has (a batch keeps a column only if all its rows have it)
    shared = [name for name in rounds[0].columns if all(name in r.columns for r in rounds)]
    columns = {name: [v for r, g in picked for v in r.columns[name][g * G : (g + 1) * G]] for name in shared}
    zero_std = torch.stack([r.zero_std[g] for r, g in picked])  # [size]
    return Rewards(rollout, rewards, per_fn, correct, answers, zero_std, sum(len(r.zero_std) for r in rounds), columns,
                   rounds[0].step)


def more_rounds(first: Rewards, draw: Callable[[int], Rewards], config: Any, pad_id: int) -> Rewards:
    """DAPO's dynamic sampling: stages 1 and 2 again until the step has enough groups with a learning signal.

    ``first`` is round 0's :class:`~grpo_tutorial.stage_results.Rewards`; ``draw(k)`` samples and rewards more
    prompts as round ``k``. Rounds are drawn while fewer than ``config.prompts_per_step`` groups carry a signal, up
    to ``config.max_sampling_rounds`` rounds in all. Returns round 0 itself when one round was enough, else the
    groups :func:`keep_signal_groups` keeps.
    """
    rounds = [first]
    while (len(rounds) < config.max_sampling_rounds
           and sum(int((~r.zero_std).sum()) for r in rounds) < config.prompts_per_step):
        rounds.append(draw(len(rounds)))
    if len(rounds) == 1:
        return first
    return keep_signal_groups(rounds, config.group_size, config.prompts_per_step, pad_id)

"""Monte Carlo values without a critic (VinePPO's idea, Kazemnejad et al. 2024), for chapter 17.

Between GRPO (one advantage per completion, no value model) and PPO (a learned
value model, :mod:`grpo_tutorial.ppo.step`): estimate the value of a prefix of a
completion by sampling. From each of M prefixes, K more continuations are drawn
with the run's own sampling settings; the prefix's value is the mean reward of
its K continuations (each scored as the prefix followed by the continuation).
The tokens between cut points j and j + 1 get the advantage
V(prefix_{j+1}) - V(prefix_j), and the last segment the completion's own reward
minus V(prefix_last): with no reward before the end, this is GAE with
gamma = lambda = 1 over the segments, with sampled values instead of learned ones.

The cut points are evenly spaced positions of the token budget,
``round(j * max_new_tokens / M)`` for j = 0 .. M - 1 (the first is 0: the prompt
alone); a completion uses those before its last token, so a short completion
has fewer prefixes. The same positions for every completion let all the
prefixes of one cut point go through one ``generate`` call (M calls in a step,
each of every live prefix times K rows): each continuation then has the budget
that the completion had left at that point, and the prompt, prefix and
continuation fit in the model's context as the completion did. The extra
rollouts cost compute: ``extra_tokens`` counts every token they generated (and
the history row carries it), so a chapter can match the compute of the methods.

Prefixes go to :func:`~grpo_tutorial.rollout.generate_rollouts` as text (the
rendered prompt and the decoded prefix), so the sampling is exactly the run's
(:func:`~grpo_tutorial.rollout.sampling_kwargs`); a tokenizer that does not give
back the same tokens from that text is refused. A prefix that holds the unknown
token (an untrained model samples it) is refused by ``generate_rollouts`` as a
prompt, so it gets no value (NaN: its segments' advantages are 0).
:class:`MonteCarloStep` is the step with these advantages in stage 3; its
continuations come from the policy itself, even when a sampler copy writes the
completions (``GRPOConfig.sampler``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from .._checks import check_int
from ..advantages import token_variance
from ..rewards import compute_rewards
from ..rollout import encode_prompts, generate_rollouts, render_prompts, sampling_kwargs
from ..seeding import derive_seed
from ..stage_results import Advantages, Rewards
from ..step import GRPOStep
from .formulas import PPOSettings, check_critic_config

__all__ = ["MONTE_CARLO", "MonteCarloSettings", "MonteCarloStep", "cut_points", "monte_carlo_advantages"]

#: The seed stream of the extra rollouts (:mod:`grpo_tutorial.seeding`'s numbering: one past its last stream).
MONTE_CARLO = 5


@dataclass(frozen=True)
class MonteCarloSettings:
    """M and K of the Monte Carlo values.

    Attributes:
        num_prefixes: M, the cut points per completion (the first is the prompt alone), >= 1.
        rollouts_per_prefix: K, the continuations sampled from each prefix, >= 1.
    """

    num_prefixes: int = 4
    rollouts_per_prefix: int = 4

    def __post_init__(self) -> None:
        check_int(type(self).__name__, "num_prefixes", self.num_prefixes, 1)
        check_int(type(self).__name__, "rollouts_per_prefix", self.rollouts_per_prefix, 1)


def cut_points(max_new_tokens: int, num_prefixes: int) -> list[int]:
    """The prefix lengths: ``round(j * max_new_tokens / M)`` for j < M, without repeats (0 first)."""
    check_int(None, "max_new_tokens", max_new_tokens, 1)
    check_int(None, "num_prefixes", num_prefixes, 1)
    return sorted({round(j * max_new_tokens / num_prefixes) for j in range(num_prefixes)})


def monte_carlo_advantages(model, tokenizer, rollout, rewards: torch.Tensor, reward_fns, config, settings:
                           MonteCarloSettings, *, answers: Sequence, columns: Mapping[str, Sequence] | None = None,
                           step: int = 0) -> dict[str, Any]:
    """The per-token advantages ``[N, T]`` of ``rollout`` from sampled prefix values, and what they cost.

    Args:
        model, tokenizer: the policy, which samples the continuations.
        rollout: the step's :class:`~grpo_tutorial.rollout.Rollout`; ``rewards``: its ``[N]`` rewards.
        reward_fns: the run's reward functions; ``config``: its
            :class:`~grpo_tutorial.config.GRPOConfig` (sampling settings, reward weights, seed).
        answers, columns: each completion's answer and extra dataset columns (N entries each).
        step: the step, for the seeds (``derive_seed(seed, MONTE_CARLO, step, j)`` for cut point j).

    Returns:
        ``advantages`` ``[N, T]`` (0 on padding, and where a value is NaN: no
        continuation could be scored), ``values`` ``[N, M']`` (NaN where a
        completion has no such prefix), ``cuts`` (the M' cut points),
        ``extra_tokens`` (tokens the continuations generated), ``extra_rollouts``.
    """
    mask = rollout.completion_mask  # [N, T]
    lengths = mask.sum(dim=1).long().tolist()  # [N]
    cuts = cut_points(config.max_new_tokens, settings.num_prefixes)
    K = settings.rollouts_per_prefix
    values = torch.full((len(rollout), len(cuts)), math.nan)  # [N, M']
    extra_tokens = extra_rollouts = 0
    unknown = getattr(tokenizer, "unk_token_id", None)
    for j, cut in enumerate(cuts):
        rows = [i for i, length in enumerate(lengths) if cut < length  # completions with a token after the cut,
                and unknown not in rollout.completion_ids[i, :cut].tolist()]  # whose prefix generate_rollouts takes
        if rows:
            means, tokens = _prefix_values(model, tokenizer, rollout, rows, cut, reward_fns, config, K, answers,
                                           columns or {}, derive_seed(config.seed, MONTE_CARLO, step, j))
            values[rows, j] = means
            extra_tokens, extra_rollouts = extra_tokens + tokens, extra_rollouts + K * len(rows)
    advantages = torch.zeros(mask.shape)  # [N, T]
    for i, length in enumerate(lengths):
        live = [c for c in cuts if c < length]
        ends = live[1:] + [length]
        targets = values[i, 1:len(live)].tolist() + [float(rewards[i])]  # V(next prefix), the reward at the end
        for j, (start, end) in enumerate(zip(live, ends)):
            gain = targets[j] - float(values[i, j])
            advantages[i, start:end] = 0.0 if math.isnan(gain) else gain
    return {"advantages": advantages.to(mask.device) * mask, "values": values, "cuts": cuts,
            "extra_tokens": extra_tokens, "extra_rollouts": extra_rollouts}


def _prefix_values(model, tokenizer, rollout, rows: list[int], cut: int, reward_fns, config, K: int, answers,
                   columns: Mapping, seed: int) -> tuple[torch.Tensor, int]:
    """The mean reward of K continuations of each row's first ``cut`` tokens (one generate call), and their tokens."""
    prompts = [rollout.prompts[i] for i in rows]
    rendered = render_prompts(tokenizer, prompts, system_prompt=config.system_prompt,
                              use_chat_template=config.use_chat_template)
    prefixes = [rollout.completion_ids[i, :cut].tolist() for i in rows]
    texts = [text + tokenizer.decode(ids) for text, ids in zip(rendered, prefixes)]
    _check_round_trip(tokenizer, prompts, prefixes, texts, config)
    more = generate_rollouts(model, tokenizer, texts, **sampling_kwargs(
        config, group_size=K, max_new_tokens=config.max_new_tokens - cut, generator_seed=seed, system_prompt=None,
        use_chat_template=False))  # [len(rows) * K] rows, group by group
    ids = more.completion_id_lists()
    repeat = [(n, i) for n, i in enumerate(rows) for _ in range(K)]  # the row of each continuation
    full_ids = [prefixes[n] + c for (n, _), c in zip(repeat, ids)]
    completions = [tokenizer.decode(p, skip_special_tokens=True) + c for p, c in
                   zip([prefixes[n] for n, _ in repeat], more.completions)]
    scores, _ = compute_rewards(
        reward_fns, config.reward_weights, [rollout.prompts[i] for _, i in repeat], completions,
        [answers[i] for _, i in repeat], completion_ids=full_ids,
        **{name: [column[i] for _, i in repeat] for name, column in columns.items()},
    )  # [len(rows) * K], NaN: no function could score it
    return torch.nanmean(scores.float().view(len(rows), K), dim=1), int(more.completion_mask.sum())


def _check_round_trip(tokenizer, prompts, prefixes, texts, config) -> None:
    """The prefix prompts' text must encode to the prompt's tokens followed by the prefix's, as sampled."""
    before = encode_prompts(tokenizer, prompts, system_prompt=config.system_prompt,
                            use_chat_template=config.use_chat_template)
    after = encode_prompts(tokenizer, texts, use_chat_template=False)
    for prompt, prefix, text, got in zip(before, prefixes, texts, after):
        if got != prompt + prefix:
            raise ValueError(f"the tokenizer does not give back the sampled tokens from the prefix's text {text!r}; "
                             "the Monte Carlo values need a tokenizer whose decode and encode round-trip")


class MonteCarloStep(GRPOStep):
    """The step with Monte Carlo values (stage 3): per-token advantages from K rollouts at each of M prefixes.

    ``settings``: :class:`MonteCarloSettings`. The advantages are used as they
    are (no group, no whitening). The history row gains ``mc_extra_tokens`` and
    ``mc_extra_rollouts``. Refuses the settings of the group advantages it replaces,
    ``dynamic_sampling`` among them (with per-token values an all-equal group still has a
    signal), as a critic's step does (:func:`~grpo_tutorial.ppo.check_critic_config`).
    """

    def __init__(self, model, tokenizer, reward_fns, config=None, ref_model=None, *,
                 settings: MonteCarloSettings | None = None, **kwargs: Any) -> None:
        super().__init__(model, tokenizer, reward_fns, config, ref_model, **kwargs)
        check_critic_config(self.config, PPOSettings())  # the same refusals as a critic's: no group advantages
        self.settings = MonteCarloSettings() if settings is None else settings
        if not isinstance(self.settings, MonteCarloSettings):
            raise TypeError(f"settings must be a MonteCarloSettings, got {type(self.settings).__name__}")

    def advantages(self, rewards: Rewards) -> Advantages:
        """Stage 3: the Monte Carlo values' per-token advantages, ``[N, T]``."""
        rollout = rewards.rollout
        out = monte_carlo_advantages(self.model, self.tokenizer, rollout, rewards.rewards, self.reward_fns, self.config,
                                     self.settings, answers=rewards.answers, columns=rewards.columns,
                                     step=rewards.step)
        mask = rollout.completion_mask
        row = {"mc_extra_tokens": float(out["extra_tokens"]), "mc_extra_rollouts": float(out["extra_rollouts"]),
               "advantage_var": token_variance(out["advantages"], mask)}
        return Advantages(out["advantages"], mask, row)

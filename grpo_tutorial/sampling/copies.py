"""Samplers that are not the learner (chapter 15): copies of the policy, chosen by ``GRPOConfig.sampler``.

``"bfloat16"``, the policy cast to bfloat16; ``"stale"``, the policy as it was
``sampler_staleness`` optimizer updates ago; ``"top_p"``, the policy itself
sampling from the nucleus of ``top_p``, which the trainer's softmax does not know;
``"float16"``, the fast sampler of a GPU without bfloat16 (a T4): the policy, its
adapters merged, cast to float16, sampled with :mod:`~grpo_tutorial.sampling.fast`'s
static cache and guarded against non-finite logits. Each keeps, with the rollout,
its own per-token log-probs of what it sampled (``Rollout.sampler_logprobs``),
which :mod:`grpo_tutorial.mismatch` corrects for and measures.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from typing import Any

import torch

from .._checks import check_choice
from ..config import SAMPLERS
from ..logprobs import score_rollout
from ..rollout import Rollout
from .base import PolicySampler
from .fast import FALLBACKS, FastSampler, NonFiniteGuard, use_static_cache

__all__ = ["SamplerCopy", "sampled_only", "top_p_logprobs"]


def sampled_only(logp: torch.Tensor, rollout: Rollout) -> torch.Tensor:
    """A sampler's log-probs ``[N, T]`` kept on the tokens it sampled (float32), 0.0 elsewhere: on padding and on a
    tool's tokens, as TRL stores them (a top-p sampler's -inf outside its nucleus never meets the mask's 0)."""
    return torch.where(rollout.loss_mask.bool(), logp.float(), torch.zeros((), dtype=torch.float32,
                                                                            device=logp.device))


@torch.no_grad()
def top_p_logprobs(
    model: torch.nn.Module, rollout: Rollout, *, temperature: float, top_p: float, chunk: int | None = None
) -> torch.Tensor:
    """Log-probs of the rollout's tokens under nucleus sampling: softmax(logits / T) kept to its top-p set, renormalised.

    The nucleus at each position is the smallest set of the most likely tokens
    whose probability reaches ``top_p`` (a token is kept when the tokens more
    likely than it hold less than ``top_p``), as ``generate``'s top-p warper
    keeps it after the temperature. A sampled token is always counted in its
    nucleus (should float rounding have put it just outside), so every log-prob
    is finite. The log-prob is log pi_T(token) - log(mass of the nucleus): at
    least the full softmax's, since the nucleus holds at most all the mass.
    Eval mode, no gradient; ``[N, Tc]`` float32, 0 on padding.
    """
    if not (isinstance(top_p, float) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be a float in (0, 1], got {top_p!r}")
    n, tc = len(rollout), rollout.completion_ids.shape[1]
    chunk = n if chunk is None else chunk
    was_training = model.training
    model.eval()
    parts = []
    try:
        for start in range(0, n, chunk):
            rows = torch.arange(start, min(start + chunk, n))
            ids, attention = rollout.input_ids[rows], rollout.attention_mask[rows]  # [m, Tp+Tc] x2
            positions = (attention.long().cumsum(dim=-1) - 1).clamp(min=0)  # [m, Tp+Tc], as generate counts them
            out = model(input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=tc + 1,
                        use_cache=False)
            logp = torch.log_softmax(out.logits[:, :-1].float() / temperature, dim=-1)  # [m, Tc, V]
            tokens = rollout.completion_ids[rows].unsqueeze(-1)  # [m, Tc, 1]
            sorted_logp, order = logp.sort(dim=-1, descending=True)  # [m, Tc, V] x2
            before = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()  # [m, Tc, V]: mass of the likelier tokens
            kept = torch.zeros_like(logp, dtype=torch.bool).scatter(-1, order, before < top_p)  # [m, Tc, V]
            kept = kept.scatter(-1, tokens, True)  # the sampled token, always
            log_mass = torch.logsumexp(logp.masked_fill(~kept, -math.inf), dim=-1)  # [m, Tc]
            parts.append(logp.gather(-1, tokens).squeeze(-1) - log_mass)  # [m, Tc]
    finally:
        model.train(was_training)
    return torch.cat(parts) * rollout.completion_mask  # [N, Tc]


class SamplerCopy(PolicySampler):
    """A sampler that is not the learner: the step's ``sampler``, ``(prompts, seed) -> Rollout``.

    ``kind`` is ``GRPOConfig.sampler``'s:

    - ``"bfloat16"``: a copy of the policy cast to bfloat16 (a generation engine
      in 16-bit precision). After each sync its weights are exactly the
      policy's, cast (``load_state_dict`` casts);
    - ``"stale"``: a float32 copy that lags ``staleness`` optimizer updates
      behind the policy (asynchronous RL: the completions of step s come from the
      weights of k updates earlier). It keeps the last k snapshots of the
      policy's weights, so it holds k copies of them;
    - ``"top_p"``: the policy itself, no copy, generating with ``config.top_p``
      (nucleus sampling), a distribution the trainer's softmax does not know;
    - ``"float16"``: a copy of the policy, its adapters merged
      (:func:`~grpo_tutorial.sampling.fast.merged_copy`), in float16, generating
      through a :class:`~grpo_tutorial.sampling.fast.FastSampler` (the static
      cache where ``config.static_cache`` says). Every call is guarded: when its
      logits (:class:`~grpo_tutorial.sampling.fast.NonFiniteGuard`) or its own
      log-probs of the sample are not finite, the rollout is made again by the
      float32 policy with the same seed, scored by it, counted in the history's
      ``sampler/fallbacks`` and warned about once.

    Each rollout carries the sampler's own per-token log-probs of what it sampled
    (``sampler_logprobs``, ``[N, Tc]``, 0 on padding), scored by the copy after
    generating (as a generation engine reports its own log-probs); the top-p
    sampler's are those of the nucleus, renormalised (:func:`top_p_logprobs`).
    The step calls :meth:`sync` after every optimizer update. An evaluation
    generates with the learner (:attr:`evaluation_model`), not with the copy.

    With tools (:attr:`toolbox`, set by the step), the copy writes the whole tool
    rollout (:func:`~grpo_tutorial.tools.generate_tool_rollouts`, pausing at each call,
    continuing from token ids), and its log-probs of the tool's tokens are 0.0, as
    TRL's are (nobody sampled them); the correction and its diagnostics read the
    sampled tokens only (:func:`sampler_correction`). The float16 copy's fallback
    makes the rollout again with the calls it already answered (``answered``), so no
    tool runs twice for the same call.
    """

    is_learner = False

    def __init__(self, policy: torch.nn.Module, tokenizer: Any, config: Any, kind: str) -> None:
        check_choice(None, "kind", kind, SAMPLERS[1:])
        self.engine: FastSampler | None = None  # "float16": generates from the merged float16 copy
        super().__init__(policy, tokenizer, config)
        self.kind = kind
        self.staleness = config.sampler_staleness if kind == "stale" else 0
        self.snapshots: deque[dict[str, torch.Tensor]] = deque()  # "stale": the policy after each of the last k updates
        if kind == "float16":
            self.engine = FastSampler(policy, tokenizer, config, merge=True, static=use_static_cache(config, policy),
                                      dtype=torch.float16)
            self.model = self.engine.model
        else:
            self.model = policy if kind == "top_p" else copy.deepcopy(policy)
        if kind in ("bfloat16", "stale"):
            self.model.requires_grad_(False)
            if kind == "bfloat16":
                self.model.to(torch.bfloat16)
        self.updates = 0  # optimizer updates seen since the copy was made (or reset)
        self.fallbacks = 0  # "float16": rollouts made again in float32

    @property
    def toolbox(self) -> Any:
        """The step's tools (:class:`~grpo_tutorial.tools.ToolBox`), or None; the float16 copy's engine has them too."""
        return self._toolbox

    @toolbox.setter
    def toolbox(self, box: Any) -> None:
        self._toolbox = box
        if self.engine is not None:
            self.engine.toolbox = box

    @property
    def evaluation_model(self) -> torch.nn.Module:
        """The model an evaluation generates with: the learner (the copy is what the run samples from, not the policy
        it evaluates)."""
        return self.policy

    def __call__(self, prompts: list, generator_seed: int) -> Rollout:
        cfg = self.config
        if self.kind == "float16":
            return self._guarded(prompts, generator_seed)
        rollout = self.generate(self.model, prompts, generator_seed, top_p=cfg.top_p if self.kind == "top_p" else 1.0,
                                onednn=None if self.kind == "bfloat16" else cfg.onednn_generation)  # None: off in bf16
        if self.kind == "top_p":
            logp = top_p_logprobs(self.model, rollout, temperature=cfg.temperature, top_p=float(cfg.top_p),
                                  chunk=cfg.micro_size)
        else:
            logp = score_rollout(self.model, rollout, temperature=cfg.temperature, chunk=cfg.micro_size)
        rollout.sampler_logprobs = sampled_only(logp, rollout)  # [N, Tc], 0 on padding and on a tool's tokens
        return rollout

    def _guarded(self, prompts: list, generator_seed: int) -> Rollout:
        """The float16 copy's rollout, or (non-finite logits or log-probs) the float32 policy's, with the same seed."""
        cfg, guard, answered = self.config, NonFiniteGuard(), {}  # answered: the calls made, not made again
        rollout = self.engine.rollout(self.model, prompts, generator_seed, guard=guard, answered=answered)
        logp = score_rollout(self.model, rollout, temperature=cfg.temperature, chunk=cfg.micro_size)  # [N, Tc]
        finite = not guard.tripped() and bool(torch.isfinite(logp[rollout.loss_mask.bool()]).all())
        stats = {**rollout.sampler_stats, FALLBACKS: 0.0}
        if not finite:
            self.fallbacks += 1
            self.engine.warn("float16", "the float16 sampler copy gave non-finite logits or log-probs (a float16 "
                             "overflow); that rollout was made again by the float32 policy. The history's "
                             f"{FALLBACKS!r} counts each; if it is often 1, set GRPOConfig.sampler='policy'")
            rollout = self.generate(self.policy, prompts, generator_seed, answered=answered)
            logp = score_rollout(self.policy, rollout, temperature=cfg.temperature, chunk=cfg.micro_size)
            stats[FALLBACKS] = 1.0
        rollout.sampler_logprobs = sampled_only(logp, rollout)  # [N, Tc], 0 on padding and on a tool's tokens
        rollout.sampler_stats = stats
        return rollout

    def sync(self) -> None:
        """After an optimizer update: the copy follows the policy (bfloat16: at once; stale: k updates later)."""
        self.updates += 1
        if self.kind == "float16":
            self.engine.sync()
        elif self.kind == "bfloat16":
            self.model.load_state_dict(self.policy.state_dict())
        elif self.kind == "stale":
            self.snapshots.append({k: v.detach().clone() for k, v in self.policy.state_dict().items()})
            if len(self.snapshots) > self.staleness:
                self.model.load_state_dict(self.snapshots.popleft())

    def reset(self) -> None:
        """The copy becomes the policy as it is now, with no snapshots (after a checkpoint is loaded).

        A resumed ``"stale"`` run therefore samples from fresher weights for its
        first k updates than the run that was interrupted did.
        """
        self.snapshots.clear()
        self.updates = 0
        if self.kind == "float16":
            self.engine.sync()
        elif self.kind != "top_p":
            self.model.load_state_dict(self.policy.state_dict())



"""When the sampler is not the learner: sampler copies of the policy, and TRL's importance-sampling correction.

In the book's default step one model both samples the completions (stage 1) and
scores them (stage 4), so the first pass's ratio pi_theta / pi_old is exactly 1.
Real GRPO runs generate in another engine: a bfloat16 or quantized copy, a copy
that is k optimizer updates stale (asynchronous RL), or one that samples with
top-p, which the trainer's softmax does not know. The completions then come from
a sampler mu that is not pi_old, and the loss's first-pass ratio no longer
corrects for it. This module holds both halves of that story:

- the sampler copies (:class:`SamplerCopy`, chosen by ``GRPOConfig.sampler``):
  ``"bfloat16"``, the policy cast to bfloat16; ``"stale"``, the policy as it was
  ``sampler_staleness`` optimizer updates ago; ``"top_p"``, the policy itself
  sampling from the nucleus of ``top_p``; ``"float16"``, the fast sampler of a
  GPU without bfloat16 (a T4): the policy, its adapters merged, cast to float16,
  sampled with :mod:`grpo_tutorial.fast_sampler`'s static cache and guarded
  against non-finite logits. Each is the step's ``sampler`` and
  keeps, with the rollout, its own per-token log-probs of what it sampled
  (``Rollout.sampler_logprobs``); the step calls :meth:`SamplerCopy.sync` after
  every optimizer update;
- the correction TRL 1.16 applies with vLLM (``vllm_importance_sampling_correction``):
  :func:`sampler_weights`, a per-token (or per-sequence) weight
  pi_old / mu, truncated or masked outside ``[clip_min, clip_max]``, that
  multiplies each token's loss (``grpo_loss(..., sampler_weights=...)``), with
  TRL's four modes and semantics;
- the diagnostics verl and TRL log for the mismatch (:func:`mismatch_diagnostics`):
  how far the two log-probs are apart, the mismatch KL, how many tokens and
  sequences fall outside the bounds, and the effective sample size; the step adds
  them to the history row whenever the rollout carries the sampler's log-probs.

The default sampler (``"policy"``) is the book's: one model, exactly on-policy,
no sampler log-probs, no correction, so nothing here runs and no number moves.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from typing import Any

import torch

from ._checks import check_choice, check_number, config_error, require_tensor, same_shape
from .config import IS_MODES, SAMPLERS
from .fast_sampler import FALLBACKS, FastSampler, NonFiniteGuard, build_fast_sampler, use_static_cache
from .logprobs import score_rollout
from .rollout import Rollout, generate_rollouts, sampling_kwargs

__all__ = [
    "IS_MODES", "SAMPLERS", "SamplerCopy", "build_sampler", "loss_inputs", "mismatch_diagnostics",
    "sampler_correction", "sampler_weights", "top_p_logprobs",
]


# ---------------------------------------------------------------------------
# The correction: TRL's importance-sampling weights, and the diagnostics
# ---------------------------------------------------------------------------


def _log_ratio(logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log(pi_old / mu) per token, ``[N, T]``: 0 on padding and where the sampler's log-prob is NaN (unknown)."""
    return torch.nan_to_num((logp - sampler_logp) * mask, nan=0.0)  # [N, T]


def _check_logprobs(logp, sampler_logp, mask) -> None:
    require_tensor("logp", logp, dim=2, floating=True)
    require_tensor("sampler_logp", sampler_logp, dim=2, floating=True)
    require_tensor("mask", mask, dim=2)
    same_shape(logp=logp, sampler_logp=sampler_logp, mask=mask)


def _check_bounds(clip_min, clip_max) -> None:
    check_number(None, "clip_min", clip_min, lambda v: v >= 0, "None or a number >= 0", optional=True)
    check_number(None, "clip_max", clip_max, lambda v: v > 0, "None or a number > 0", optional=True)
    if clip_min is not None and clip_max is not None and clip_min >= clip_max:
        raise config_error(None, "clip_min", clip_min, f"less than clip_max = {clip_max!r}")


@torch.no_grad()
def sampler_weights(
    logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> torch.Tensor:
    """TRL's importance-sampling weights for a sampler that is not the learner (no gradient).

    The completions were drawn from the sampler mu, but the loss treats them as
    draws from pi_old, the trainer's policy at sampling time. The weight
    rho = pi_old / mu, multiplied into each token's loss, corrects the
    expectation; truncating or masking it keeps its variance bounded. The four
    modes are TRL's ``vllm_importance_sampling_mode``:

    - ``"token_truncate"``: one ratio per token, clipped to ``[clip_min, clip_max]``;
    - ``"token_mask"``: one ratio per token, set to 0 outside the bounds;
    - ``"sequence_truncate"``: one ratio per completion (the product of its token
      ratios), clipped, applied to every token of the completion;
    - ``"sequence_mask"`` (TRL's default): one ratio per completion, set to 0
      outside the bounds (the whole completion leaves the loss).

    A bound that is None is no bound (``clip_min=None`` is TRL's default). As in
    TRL, padding and tokens whose sampler log-prob is NaN (the engine could not
    give one) contribute a log-ratio of 0: a ratio of exactly 1, never NaN.

    Args:
        logp: ``[N, T]`` the trainer's log-probs of the sampled tokens at sampling
            time (stage 4's old-policy pass; TRL's ``old_per_token_logps``).
        sampler_logp: ``[N, T]`` the sampler's own log-probs of the same tokens
            (TRL's ``sampling_per_token_logps``); NaN where unknown.
        mask: ``[N, T]`` 1 for real completion tokens.
        mode: one of :data:`IS_MODES`.
        clip_min, clip_max: the bounds C_min and C_max (TRL's defaults None, 3.0).

    Returns:
        ``[N, T]`` weights in the token modes, ``[N, 1]`` in the sequence modes
        (it broadcasts over the tokens), in ``logp``'s dtype.
    """
    _check_logprobs(logp, sampler_logp, mask)
    check_choice(None, "mode", mode, IS_MODES)
    _check_bounds(clip_min, clip_max)
    log_ratio = _log_ratio(logp, sampler_logp, mask.to(logp.dtype))  # [N, T]
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(dim=-1, keepdim=True)  # [N, 1]: the completion's log-ratio
    ratio = torch.exp(log_ratio)  # [N, T] or [N, 1]
    if mode.endswith("truncate"):
        if clip_min is None and clip_max is None:
            raise ValueError(f"mode={mode!r} needs clip_min or clip_max (at least one bound to truncate at)")
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


@torch.no_grad()
def mismatch_diagnostics(
    logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> dict[str, float]:
    """How far the sampler is from the learner, as plain floats (what verl and TRL log).

    With r = pi_old / mu per token (log r = ``logp - sampler_logp``), over the
    real tokens (``mask``; tokens whose sampler log-prob is NaN are left out of
    the token statistics, as TRL leaves them out of its ``sampling_logp_difference``,
    and count as log r = 0 in the sequence ones, as in :func:`sampler_weights`):

    - ``mismatch/logp_diff_mean``, ``mismatch/logp_diff_max``: mean and max of
      ``|log r|`` (TRL's ``sampling/sampling_logp_difference/mean`` and ``max``);
    - ``mismatch/kl``: the mismatch KL(mu || pi_old), estimated with k3,
      r - 1 - log r (>= 0 per token; the completions are mu's draws), as a mean
      over the real tokens;
    - ``mismatch/kl_sequence``: the same per completion, summed over its tokens
      (the KL of whole completions), then averaged over the completions;
    - ``mismatch/token_outside``: the share of real tokens whose ratio lies
      outside ``[clip_min, clip_max]`` (what the token modes truncate or mask);
    - ``mismatch/sequence_outside``: the share of completions whose sequence
      ratio (the product of its token ratios) lies outside the bounds;
    - ``mismatch/ess``: the normalised effective sample size of the sequence
      ratios w_i, (sum w)^2 / (N sum w^2), in (0, 1]: 1 when every completion
      weighs the same, 1/N when one completion carries all the weight.

    Args: as :func:`sampler_weights` (``clip_min`` and ``clip_max`` None = no bound).
    """
    _check_logprobs(logp, sampler_logp, mask)
    _check_bounds(clip_min, clip_max)
    real = mask.bool()  # [N, T]
    diff = logp.double() - sampler_logp.double()  # [N, T], NaN where the sampler gave none
    known = real & ~torch.isnan(diff)  # [N, T]
    tokens = diff[known]  # [K]
    k3 = torch.expm1(tokens) - tokens  # [K]: r - 1 - log r
    per_seq = torch.where(known, torch.expm1(diff) - diff, 0.0).sum(dim=-1)  # [N]
    seq_log = _log_ratio(logp.double(), sampler_logp.double(), mask.double()).sum(dim=-1)  # [N]
    low = -math.inf if clip_min is None else math.log(clip_min) if clip_min > 0 else -math.inf
    high = math.inf if clip_max is None else math.log(clip_max)
    token_out = ((tokens < low) | (tokens > high)).double()  # [K]
    seq_out = ((seq_log < low) | (seq_log > high)).double()  # [N]
    w = torch.exp(seq_log - seq_log.max())  # [N]: the sequence ratios, scaled (the ESS does not see the scale)
    empty = tokens.numel() == 0
    return {
        "mismatch/logp_diff_mean": 0.0 if empty else float(tokens.abs().mean()),
        "mismatch/logp_diff_max": 0.0 if empty else float(tokens.abs().max()),
        "mismatch/kl": 0.0 if empty else float(k3.mean()),
        "mismatch/kl_sequence": float(per_seq.mean()),
        "mismatch/token_outside": 0.0 if empty else float(token_out.mean()),
        "mismatch/sequence_outside": float(seq_out.mean()),
        "mismatch/ess": float(w.sum() ** 2 / (len(w) * (w**2).sum())),
    }


def sampler_correction(old_logp: torch.Tensor | None, rollout: Rollout, config: Any) -> tuple[torch.Tensor | None, dict]:
    """The step's use of this module after stage 4: ``(weights, diagnostics)``.

    Without the sampler's log-probs (the default sampler) it is ``(None, {})``, or
    ``(None, stats)`` for a fast sampler's rollout (its ``sampler_stats``, which
    also join the diagnostics of a sampler copy).
    With them, the diagnostics (:func:`mismatch_diagnostics`) against
    ``old_logp``, the trainer's log-probs of the rollout (``[N, T]``), and, with
    ``config.vllm_importance_sampling_correction``, the weights
    (:func:`sampler_weights`, ``[N, T]`` or ``[N, 1]``) that the loss multiplies in,
    and their mean over the real tokens (over the completions in the sequence
    modes) in the diagnostics as ``mismatch/weight_mean`` (TRL logs
    ``sampling/importance_sampling_ratio/mean``).
    """
    sampler_logp, stats = rollout.sampler_logprobs, dict(rollout.sampler_stats or {})  # a fast sampler's timings
    if sampler_logp is None:
        if config.vllm_importance_sampling_correction:
            raise ValueError(
                "GRPOConfig.vllm_importance_sampling_correction=True, but the sampler gave no sampler_logprobs; "
                "set GRPOConfig.sampler to a sampler copy, or return Rollout(..., sampler_logprobs=[N, T])"
            )
        return None, stats
    if old_logp is None:
        raise ValueError("sampler_correction needs the trainer's log-probs of the rollout (old_logp), got None")
    cfg, mask = config, rollout.loss_mask  # the tokens the sampler sampled: a tool's are not (TRL's mask)
    sampler_logp = sampler_logp.to(old_logp.device, old_logp.dtype)  # [N, T]
    low, high = cfg.vllm_importance_sampling_clip_min, cfg.vllm_importance_sampling_clip_max
    diagnostics = {**mismatch_diagnostics(old_logp, sampler_logp, mask, low, high), **stats}
    if not cfg.vllm_importance_sampling_correction:
        return None, diagnostics
    weights = sampler_weights(old_logp, sampler_logp, mask, cfg.vllm_importance_sampling_mode, low, high)
    diagnostics["mismatch/weight_mean"] = float(weights.mean()) if weights.shape[1] == 1 else float(
        weights[mask.bool()].mean())
    return weights, diagnostics


def loss_inputs(rollout: Rollout, weights: torch.Tensor | None, rows: torch.Tensor) -> dict:
    """What a micro-batch of ``rows`` gives ``grpo_loss`` of a sampler that is not the learner (none: ``{}``).

    ``sampler_weights``, the rows of :func:`sampler_correction`'s weights (with
    the correction), and ``sampler_logp``, the rows of the sampler's own
    log-probs, from which the off-policy mask measures the drift (as TRL's does
    with vLLM, with or without the correction).
    """
    out = {}
    if weights is not None:
        out["sampler_weights"] = weights[rows]  # [m, T] or [m, 1]
    if rollout.sampler_logprobs is not None:
        out["sampler_logp"] = rollout.sampler_logprobs[rows.to(rollout.sampler_logprobs.device)]  # [m, T]
    return out


# ---------------------------------------------------------------------------
# The sampler copies
# ---------------------------------------------------------------------------


def sample_with(model: torch.nn.Module, tokenizer: Any, prompts: list, toolbox: Any = None, *,
                answered: dict | None = None, **kwargs: Any) -> Rollout:
    """One rollout of ``model``: :func:`~grpo_tutorial.rollout.generate_rollouts`, or with a ``toolbox`` (the step's
    tools) :func:`~grpo_tutorial.tools.generate_tool_rollouts`, which pauses at each call and continues from the
    token ids (``answered``: its calls already answered, not run again)."""
    if toolbox is None:
        return generate_rollouts(model, tokenizer, prompts, **kwargs)
    from .tools import generate_tool_rollouts

    return generate_tool_rollouts(model, tokenizer, prompts, toolbox, answered=answered, **kwargs)


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


class SamplerCopy:
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
      (:func:`~grpo_tutorial.fast_sampler.merged_copy`), in float16, generating
      through a :class:`~grpo_tutorial.fast_sampler.FastSampler` (the static
      cache where ``config.static_cache`` says). Every call is guarded: when its
      logits (:class:`~grpo_tutorial.fast_sampler.NonFiniteGuard`) or its own
      log-probs of the sample are not finite, the rollout is made again by the
      float32 policy with the same seed, scored by it, counted in the history's
      ``sampler/fallbacks`` and warned about once.

    Each rollout carries the sampler's own per-token log-probs of what it sampled
    (``sampler_logprobs``, ``[N, Tc]``, 0 on padding), scored by the copy after
    generating (as a generation engine reports its own log-probs); the top-p
    sampler's are those of the nucleus, renormalised (:func:`top_p_logprobs`).
    The step calls :meth:`sync` after every optimizer update.

    With tools (:attr:`toolbox`, set by the step), the copy writes the whole tool
    rollout (:func:`~grpo_tutorial.tools.generate_tool_rollouts`, pausing at each call,
    continuing from token ids), and its log-probs of the tool's tokens are 0.0, as
    TRL's are (nobody sampled them); the correction and its diagnostics read the
    sampled tokens only (:func:`sampler_correction`). The float16 copy's fallback
    makes the rollout again with the calls it already answered (``answered``), so no
    tool runs twice for the same call.
    """

    def __init__(self, policy: torch.nn.Module, tokenizer: Any, config: Any, kind: str) -> None:
        check_choice(None, "kind", kind, SAMPLERS[1:])
        self.policy, self.tokenizer, self.config, self.kind = policy, tokenizer, config, kind
        self.staleness = config.sampler_staleness if kind == "stale" else 0
        self.snapshots: deque[dict[str, torch.Tensor]] = deque()  # "stale": the policy after each of the last k updates
        self.engine: FastSampler | None = None  # "float16": generates from the merged float16 copy
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
        self._toolbox: Any = None  # the step's tools (grpo_tutorial.tools.ToolBox), if it has any

    @property
    def toolbox(self) -> Any:
        """The step's tools (:class:`~grpo_tutorial.tools.ToolBox`), or None; the float16 copy's engine has them too."""
        return self._toolbox

    @toolbox.setter
    def toolbox(self, box: Any) -> None:
        self._toolbox = box
        if self.engine is not None:
            self.engine.toolbox = box

    def __call__(self, prompts: list, generator_seed: int) -> Rollout:
        cfg = self.config
        if self.kind == "float16":
            return self._guarded(prompts, generator_seed)
        rollout = sample_with(self.model, self.tokenizer, prompts, self.toolbox, **sampling_kwargs(
            cfg, generator_seed=generator_seed, top_p=cfg.top_p if self.kind == "top_p" else 1.0,
            onednn=None if self.kind == "bfloat16" else cfg.onednn_generation,  # None: off for a bfloat16 model
        ))
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
            rollout = sample_with(self.policy, self.tokenizer, prompts, self.toolbox, answered=answered,
                                  **sampling_kwargs(cfg, generator_seed=generator_seed))
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


def build_sampler(given: Any, policy: torch.nn.Module, tokenizer: Any, config: Any) -> Any:
    """The step's sampler: ``given`` (a ``sampler=`` function), or ``config.sampler``'s copy of ``policy``.

    For the default ``"policy"``: a :class:`~grpo_tutorial.fast_sampler.FastSampler`
    where merging adapters or the static cache is on (on a CUDA GPU, by default),
    else None (the step's own ``generate``). A given
    sampler and a ``config.sampler`` other than ``"policy"`` are refused together,
    and so is the correction with neither (the policy reports no log-probs of its own).
    """
    if given is not None and config.sampler != "policy":
        raise ValueError(
            f"sampler= was given and GRPOConfig.sampler={config.sampler!r} too; choose the sampler one way "
            "(GRPOConfig.sampler='policy' with sampler=, or no sampler= with a sampler copy)"
        )
    if given is not None:
        return given
    if config.sampler == "policy":
        if config.vllm_importance_sampling_correction:
            raise ValueError(
                "GRPOConfig.vllm_importance_sampling_correction=True needs a sampler that is not the learner: set "
                "GRPOConfig.sampler ('bfloat16', 'stale', 'top_p' or 'float16'), or pass sampler= a function whose "
                "rollouts carry sampler_logprobs"
            )
        return build_fast_sampler(policy, tokenizer, config)
    return SamplerCopy(policy, tokenizer, config, config.sampler)

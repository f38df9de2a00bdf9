"""When the sampler is not the learner: TRL's importance-sampling correction, and the mismatch's diagnostics.

In the book's default step one model both samples the completions (stage 1) and
scores them (stage 4), so the first pass's ratio pi_theta / pi_old is exactly 1.
Real GRPO runs generate in another engine: a bfloat16 or quantized copy, a copy
that is k optimizer updates stale (asynchronous RL), or one that samples with
top-p, which the trainer's softmax does not know. The completions then come from
a sampler mu that is not pi_old, and the loss's first-pass ratio no longer
corrects for it. The samplers themselves, those copies among them
(:class:`~grpo_tutorial.sampling.copies.SamplerCopy`, chosen by ``GRPOConfig.sampler``),
live in :mod:`grpo_tutorial.sampling`; each keeps, with the rollout, its own
per-token log-probs of what it sampled (``Rollout.sampler_logprobs``). This
module is what the step does with them:

- the correction TRL 1.16 applies with vLLM (``vllm_importance_sampling_correction``):
  :func:`sampler_weights`, a per-token (or per-sequence) weight
  pi_old / mu, truncated or masked outside ``[clip_min, clip_max]``, that
  multiplies each token's loss (``grpo_loss(..., sampler_weights=...)``), with
  TRL's four modes and semantics; :func:`sampler_correction` applies it to a
  step's rollout, over the tokens the sampler sampled (not a tool's);
- the diagnostics verl and TRL log for the mismatch (:func:`mismatch_diagnostics`):
  how far the two log-probs are apart, the mismatch KL, how many tokens and
  sequences fall outside the bounds, and the effective sample size; the step adds
  them to the history row whenever the rollout carries the sampler's log-probs.

The default sampler (``"policy"``) is the book's: one model, exactly on-policy,
no sampler log-probs, no correction, so nothing here runs and no number moves.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ._checks import check_choice, check_number, config_error, require_tensor, same_shape
from .config import IS_MODES
from .rollout import Rollout

__all__ = ["IS_MODES", "loss_inputs", "mismatch_diagnostics", "sampler_correction", "sampler_weights"]


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

"""Stage 6 of a GRPO step: the clipped surrogate objective and its aggregation.

For completion i, token t, with ratio rho = pi_theta / pi_old and advantage A_i:

    loss_{i,t} = -min(rho * A_i, clip(rho, 1 - eps_low, 1 + eps_high) * A_i)
                 + beta * KL_{i,t}

``loss_type`` decides how the per-token losses become one number:

* ``"grpo"``: mean over each sequence's tokens, then mean over sequences
  (DeepSeekMath). A long completion's tokens each weigh less: length bias.
* ``"bnpo"`` / ``"dapo"``: sum over all tokens / number of tokens (DAPO's
  token-level loss). Every token weighs the same. On one batch the two are
  equal. Once an update is split into micro-batches (gradient accumulation)
  they differ, as in TRL: ``dapo`` divides by the tokens of the whole update,
  ``bnpo`` by the tokens of each micro-batch (see :mod:`grpo_tutorial.objectives`).
* ``"dr_grpo"``: sum over all tokens / (N * max_completion_length), a constant,
  so no length enters the normaliser (Dr. GRPO).
"""

from __future__ import annotations

import torch

from ._checks import one_of, require_tensor, same_shape
from .kl import KL_KINDS, kl_estimate
from .objectives import LOSS_TYPES, aggregate_tokens, clipped_surrogate, masked_log_ratio

__all__ = ["LOSS_TYPES", "aggregate_tokens", "grpo_loss", "sequence_logprob_loss"]


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
    kl_kind: str = "k3",
    gradient_accumulation_steps: int = 1,
    num_items_in_batch: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss (to minimise) and a dict of diagnostics.

    Args:
        logp: ``[N, T]`` log pi_theta of the sampled tokens, with gradient.
        old_logp: ``[N, T]`` log pi_old, recorded at sampling time (no gradient).
        advantages: ``[N]`` one advantage per completion.
        mask: ``[N, T]`` 1 for real completion tokens, 0 for padding.
        ref_logp: ``[N, T]`` log pi_ref, required when ``beta > 0``.
        beta: weight of the KL penalty.
        clip_eps: eps_low; the ratio may not go below ``1 - clip_eps``.
        clip_eps_high: eps_high (DAPO's clip-higher); defaults to ``clip_eps``.
        loss_type: ``"grpo"``, ``"bnpo"``, ``"dapo"`` or ``"dr_grpo"``.
        max_completion_length: the constant for ``"dr_grpo"`` (default: T).
        kl_kind: which estimator (``"k1"``, ``"k2"``, ``"k3"``) the penalty uses.
        gradient_accumulation_steps, num_items_in_batch: the normalisers for an
            update split into micro-batches (see :mod:`grpo_tutorial.objectives`);
            TRL's names. The defaults give the loss of this batch alone.

    Returns:
        ``(loss, stats)``: stats are plain floats, measured over masked tokens:
        ``clip_frac_low`` (ratio < 1-eps_low with A < 0: clipped, no gradient),
        ``clip_frac_high`` (ratio > 1+eps_high with A > 0), ``clip_frac`` (their
        sum), ``kl`` (mean estimate; NaN when no ``ref_logp`` is given),
        ``ratio_mean``, ``ratio_max``, ``adv_mean``, ``adv_std``.
    """
    one_of("loss_type", loss_type, LOSS_TYPES)
    one_of("kl_kind", kl_kind, KL_KINDS)
    require_tensor("logp", logp, dim=2, floating=True)
    require_tensor("old_logp", old_logp, dim=2, floating=True)
    require_tensor("mask", mask, dim=2)
    require_tensor("advantages", advantages, dim=1, floating=True)
    if ref_logp is not None:
        require_tensor("ref_logp", ref_logp, dim=2, floating=True)
    same_shape(logp=logp, old_logp=old_logp, mask=mask, ref_logp=ref_logp)
    if advantages.shape[0] != logp.shape[0]:
        raise ValueError(
            f"advantages has {advantages.shape[0]} entries but logp has {logp.shape[0]} rows; expected one advantage per completion"
        )
    if not 0.0 < clip_eps < 1.0:
        raise ValueError(f"clip_eps must lie in (0, 1), got {clip_eps}")
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not eps_high > 0.0:
        raise ValueError(f"clip_eps_high must be > 0, got {clip_eps_high}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta > 0 and ref_logp is None:
        raise ValueError(f"beta={beta} > 0 needs ref_logp (the reference policy's log-probs)")
    mask = mask.to(logp.dtype)
    if mask.sum() == 0:
        raise ValueError("mask is all zeros: there are no completion tokens to train on")

    adv = advantages.detach().to(logp.dtype)[:, None]  # [N, 1]
    ratio = torch.exp(masked_log_ratio(logp, old_logp, mask))  # [N, T]
    per_token = clipped_surrogate(ratio, adv, clip_eps, eps_high)  # [N, T]
    kl = None
    if ref_logp is not None:
        # As for the ratio: padded positions get log-ratio 0, so a huge gap
        # between policy and reference on pad tokens cannot turn into NaN grads.
        ref_safe = torch.where(mask.bool(), ref_logp.detach(), logp.detach())  # [N, T]
        kl = kl_estimate(logp, ref_safe, kind=kl_kind)  # [N, T]
        if beta > 0:
            per_token = per_token + beta * kl  # [N, T]
    loss = aggregate_tokens(
        per_token, mask, loss_type, max_completion_length,
        gradient_accumulation_steps=gradient_accumulation_steps, num_items_in_batch=num_items_in_batch,
    )

    with torch.no_grad():
        n_tok = mask.sum()
        low = ((ratio < 1.0 - clip_eps) & (adv < 0)).to(mask.dtype) * mask
        high = ((ratio > 1.0 + eps_high) & (adv > 0)).to(mask.dtype) * mask
        ratio_masked = ratio.masked_select(mask.bool())
        stats = {
            "clip_frac_low": float(low.sum() / n_tok),
            "clip_frac_high": float(high.sum() / n_tok),
            "clip_frac": float((low.sum() + high.sum()) / n_tok),
            "kl": float(torch.where(mask.bool(), kl, 0.0).sum() / n_tok) if kl is not None else float("nan"),
            "ratio_mean": float(ratio_masked.mean()),
            "ratio_max": float(ratio_masked.max()),
            "adv_mean": float(advantages.mean()),
            "adv_std": float(advantages.std()) if advantages.numel() > 1 else 0.0,
        }
    return loss, stats


def sequence_logprob_loss(seq_logp: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """The plain policy-gradient loss, -mean_i(A_i * log pi(o_i | q)).

    Its gradient is the REINFORCE estimator with the group baseline folded into
    A. ``seq_logp`` is the summed log-prob of each whole completion, ``[N]``.
    """
    require_tensor("seq_logp", seq_logp, dim=1, floating=True)
    require_tensor("advantages", advantages, dim=1, floating=True)
    if seq_logp.shape != advantages.shape:
        raise ValueError(f"seq_logp has shape {tuple(seq_logp.shape)} but advantages has {tuple(advantages.shape)}")
    return -(advantages.detach() * seq_logp).mean()

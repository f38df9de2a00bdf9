"""Stage 6 of a GRPO step: the clipped surrogate objective and its aggregation.

For completion i, token t, with ratio rho = pi_theta / pi_old and advantage A_i:

    loss_{i,t} = -min(rho * A_i, clip(rho, 1 - eps_low, 1 + eps_high) * A_i)
                 + beta * KL_{i,t}

``loss_type`` decides how the per-token losses become one number:

* ``"grpo"``: mean over each sequence's tokens, then mean over sequences
  (DeepSeekMath). A long completion's tokens each weigh less: length bias.
* ``"bnpo"`` / ``"dapo"``: sum over all tokens / number of tokens (DAPO's
  token-level loss). Every token weighs the same. In a single process the two
  are identical; TRL differs only in how it normalises across processes.
* ``"dr_grpo"``: sum over all tokens / (N * max_completion_length), a constant,
  so no length enters the normaliser (Dr. GRPO).
"""

from __future__ import annotations

import torch

from ._checks import one_of, require_tensor, same_shape
from .kl import KL_KINDS, kl_estimate

LOSS_TYPES = ("grpo", "bnpo", "dapo", "dr_grpo")


def aggregate_tokens(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
) -> torch.Tensor:
    """Reduce a ``[N, T]`` per-token quantity to a scalar the way ``loss_type`` says."""
    one_of("loss_type", loss_type, LOSS_TYPES)
    # where(), not multiplication: a NaN/inf at a padded position must not leak in.
    masked = torch.where(mask.bool(), per_token, torch.zeros_like(per_token))  # [N, T]
    if loss_type == "grpo":
        per_seq = masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # [N]
        return per_seq.mean()
    if loss_type in ("bnpo", "dapo"):
        return masked.sum() / mask.sum().clamp(min=1.0)
    length = per_token.shape[1] if max_completion_length is None else max_completion_length
    if not isinstance(length, int) or length < per_token.shape[1]:
        raise ValueError(
            f"max_completion_length must be an int >= the completion width {per_token.shape[1]}, got {length!r}"
        )
    return masked.sum() / (per_token.shape[0] * length)


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
    # Padded positions get log-ratio 0 (ratio 1) before exp(), so whatever the
    # model said about pad tokens can never overflow into inf * 0 = NaN.
    log_ratio = torch.where(mask.bool(), logp - old_logp.detach(), torch.zeros_like(logp))  # [N, T]
    ratio = torch.exp(log_ratio)  # [N, T]
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high)  # [N, T]
    per_token = -torch.min(ratio * adv, clipped_ratio * adv)  # [N, T]
    kl = None
    if ref_logp is not None:
        # As for the ratio: padded positions get log-ratio 0, so a huge gap
        # between policy and reference on pad tokens cannot turn into NaN grads.
        ref_safe = torch.where(mask.bool(), ref_logp.detach(), logp.detach())  # [N, T]
        kl = kl_estimate(logp, ref_safe, kind=kl_kind)  # [N, T]
        if beta > 0:
            per_token = per_token + beta * kl
    loss = aggregate_tokens(per_token, mask, loss_type, max_completion_length)

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

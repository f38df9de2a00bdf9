"""The pieces of stage 6's loss, one small function each.

:func:`grpo_loss` (loss.py) is these pieces in a row::

    log-ratio  ->  importance weight  ->  per-token objective  ->  + beta * KL  ->  aggregation
    (masked)       (token)                (clipped surrogate)                      (loss_type)

A variant of GRPO changes one piece: a new ratio (GSPO's sequence ratio), a new
per-token objective (CISPO, SAPO), a new aggregation (DAPO's token mean). Each is
a function here, chosen by name, so ``grpo_loss`` stays a straight line.

Gradient accumulation. When one optimizer update is split into K micro-batches,
each aggregation keeps the normaliser TRL gives it, so that ``grpo``, ``dr_grpo``
and ``dapo`` give the gradient of the whole update and ``bnpo`` normalises per
micro-batch:

* ``grpo``, ``bnpo``, ``dr_grpo``: this micro-batch's value / K
  (``gradient_accumulation_steps``). For ``grpo`` and ``dr_grpo`` with equal
  micro-batches that sums to the whole update's value; ``bnpo`` divides each
  micro-batch by its own token count, so it does not.
* ``dapo``: the token sum / the tokens of the whole update (``num_items_in_batch``).
"""

from __future__ import annotations

import torch

from ._checks import one_of

__all__ = [
    "LOSS_TYPES",
    "aggregate_tokens",
    "clipped_surrogate",
    "masked_log_ratio",
]

LOSS_TYPES = ("grpo", "bnpo", "dapo", "dr_grpo")


def masked_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` log pi_theta - log pi_old, and exactly 0 at padded positions.

    Padded positions get log-ratio 0 (ratio 1) before ``exp()``, so whatever the
    model said about pad tokens can never overflow into inf * 0 = NaN.
    """
    return torch.where(mask.bool(), logp - old_logp.detach(), torch.zeros_like(logp))  # [N, T]


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_eps: float, clip_eps_high: float
) -> torch.Tensor:
    """PPO's per-token loss, -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A).

    ``ratio`` is ``[N, T]``, ``advantages`` ``[N, 1]``; returns ``[N, T]``.
    """
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps_high)  # [N, T]
    return -torch.min(ratio * advantages, clipped_ratio * advantages)  # [N, T]


def aggregate_tokens(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
    *,
    gradient_accumulation_steps: int = 1,
    num_items_in_batch: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a ``[N, T]`` per-token quantity to a scalar the way ``loss_type`` says.

    ``gradient_accumulation_steps`` and ``num_items_in_batch`` are the
    accumulation normalisers of the module docstring; their defaults (1, and
    this batch's own token count) give the loss of this batch alone.
    """
    one_of("loss_type", loss_type, LOSS_TYPES)
    if not isinstance(gradient_accumulation_steps, int) or gradient_accumulation_steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be an int >= 1, got {gradient_accumulation_steps!r}")
    # where(), not multiplication: a NaN/inf at a padded position must not leak in.
    masked = torch.where(mask.bool(), per_token, torch.zeros_like(per_token))  # [N, T]
    if loss_type == "dapo":
        tokens = mask.sum() if num_items_in_batch is None else torch.as_tensor(num_items_in_batch, dtype=masked.dtype)
        return masked.sum() / tokens.clamp(min=1.0)
    if loss_type == "grpo":
        per_seq = masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # [N]
        loss = per_seq.mean()
    elif loss_type == "bnpo":
        loss = masked.sum() / mask.sum().clamp(min=1.0)
    else:  # dr_grpo
        length = per_token.shape[1] if max_completion_length is None else max_completion_length
        if not isinstance(length, int) or length < per_token.shape[1]:
            raise ValueError(
                f"max_completion_length must be an int >= the completion width {per_token.shape[1]}, got {length!r}"
            )
        loss = masked.sum() / (per_token.shape[0] * length)
    return loss if gradient_accumulation_steps == 1 else loss / gradient_accumulation_steps

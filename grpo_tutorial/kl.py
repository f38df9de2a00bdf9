"""Stage 5 of a GRPO step (update): estimating the KL divergence to the frozen reference.

GRPO keeps the policy pi_theta near a reference pi_ref with a penalty beta * KL.
The exact KL needs a sum over the whole vocabulary at every position; instead we
estimate KL(pi_theta || pi_ref) from the tokens pi_theta actually sampled. With
log_r = log pi_ref(x) - log pi_theta(x) and x ~ pi_theta, Schulman (2020) gives

    k1 = -log_r                 unbiased, high variance, can be negative
    k2 = log_r**2 / 2           biased, low variance, never negative
    k3 = exp(log_r) - log_r - 1 unbiased, low variance, never negative

DeepSeekMath uses k3.
"""

from __future__ import annotations

import torch

from ._checks import one_of, require_tensor

KL_KINDS = ("k1", "k2", "k3")


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled by pi_theta.

    Args:
        logp: log pi_theta of the sampled tokens, any shape (usually ``[N, T]``).
        ref_logp: log pi_ref of the same tokens, same shape.
        kind: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        A tensor of the same shape. Average it over (masked) tokens for the KL.
    """
    one_of("kind", kind, KL_KINDS)
    require_tensor("logp", logp, floating=True)
    require_tensor("ref_logp", ref_logp, floating=True)
    if logp.shape != ref_logp.shape:
        raise ValueError(f"ref_logp has shape {tuple(ref_logp.shape)} but logp has {tuple(logp.shape)}")
    log_r = ref_logp - logp  # log(pi_ref / pi_theta)
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r**2
    return torch.expm1(log_r) - log_r  # exp(log_r) - 1 - log_r, accurate near 0

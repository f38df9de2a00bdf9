"""The pieces of the loss of stage 5 (update), one small function each.

:func:`grpo_loss` (loss.py) is these pieces in a row::

    log-ratio -> importance weight -> per-token objective -> loss masks -> + beta * KL -> aggregation (- entropy bonus)
    (masked)     (token | sequence)   (clip | cispo | sapo   (truncated,   (x ratio:
                                       | vespo)               off-policy,   bias-corrected)
                                                              top entropy)

A variant of GRPO changes one piece: a new ratio (GSPO's sequence ratio), a new
per-token objective (CISPO, SAPO, VESPO, a two-sided clip with ``delta``), a new
mask (DAPO's truncation mask, the 80/20 high-entropy tokens, DeepSeek-V3.2's
off-policy sequence mask), a new KL term (DeepSeek-V3.2's ratio-weighted k3), a
new aggregation (DAPO's token mean, LUSPO's length-scaled sequence sum). Each is
a function here, chosen by name from a table (:data:`IMPORTANCE_WEIGHTS`,
:data:`OBJECTIVES`, :data:`AGGREGATIONS`), so ``grpo_loss`` stays a straight line.
The entropy bonus's coefficient may move between updates (Skywork-OR1's adaptive
entropy control, :func:`adapt_entropy_coef`); the step keeps that state in an
:class:`EntropyControl` (``GRPOStep.entropy_control``), which the trainer checkpoints.
The names and the numbers are TRL 1.16's (``tests/test_trl_agreement.py`` runs
TRL's own ``_compute_loss`` on the same tensors); the one deliberate difference
is CISPO's cap, see :func:`cispo_objective`.

Gradient accumulation. When one optimizer update is split into K micro-batches,
each aggregation keeps the normaliser TRL gives it, so that ``grpo``, ``dr_grpo``
and ``dapo`` give the gradient of the whole update and ``bnpo`` normalises per
micro-batch:

* ``grpo``, ``bnpo``, ``dr_grpo`` (and ``sapo``, aggregated like ``grpo``):
  this micro-batch's value / K (``gradient_accumulation_steps``). For ``grpo``
  and ``dr_grpo`` with equal micro-batches that sums to the whole update's
  value; ``bnpo`` divides each micro-batch by its own token count, so it does not.
* ``luspo``: the mean over sequences of each sequence's token *sum*, / K, as
  ``grpo``'s mean over sequences of token means is.
* ``dapo`` (and ``cispo`` and ``vespo``, aggregated like ``dapo``): the token sum
  / the tokens of the whole update (``num_items_in_batch``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import torch

from ._checks import check_int, one_of

__all__ = [
    "AGGREGATIONS",
    "EntropyControl",
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSS_TYPES",
    "OBJECTIVES",
    "adapt_entropy_coef",
    "aggregate_tokens",
    "applied_entropy_coef",
    "cispo_objective",
    "clipped_surrogate",
    "entropy_bonus",
    "high_entropy_mask",
    "importance_weighted_kl",
    "importance_weights",
    "masked_log_ratio",
    "off_policy_mask",
    "per_token_objective",
    "sapo_objective",
    "truncation_mask",
    "vespo_objective",
    "vespo_weights",
]

#: Every ``loss_type``: the four aggregations of the clipped surrogate; CISPO,
#: SAPO and VESPO, which change the per-token objective (and reuse an
#: aggregation); LUSPO, GSPO's clipped surrogate with a length-scaled aggregation.
LOSS_TYPES = ("grpo", "bnpo", "dapo", "dr_grpo", "cispo", "sapo", "luspo", "vespo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


# ---------------------------------------------------------------------------
# 1. the importance weight
# ---------------------------------------------------------------------------


def masked_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` log pi_theta - log pi_old, and exactly 0 at padded positions.

    Padded positions get log-ratio 0 (ratio 1) before ``exp()``, so whatever the
    model said about pad tokens can never overflow into inf * 0 = NaN.
    """
    return torch.where(mask.bool(), logp - old_logp.detach(), torch.zeros_like(logp))  # [N, T]


def token_log_weights(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """PPO/GRPO: every token has its own ratio, ``[N, T]``."""
    return log_ratio


def sequence_log_weights(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO: one ratio per sequence, the geometric mean of its token ratios.

    ``log s_i = (1/|o_i|) sum_t log(pi_theta / pi_old)``, length-normalised so a
    long completion's ratio does not explode; broadcast back to ``[N, T]``, so
    every token of a sequence carries the same ratio (and the gradient of each
    token's log-prob is shared out through the mean).
    """
    mean = (log_ratio * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)  # [N, 1]
    return mean.expand_as(log_ratio)  # [N, T]


IMPORTANCE_WEIGHTS = {"token": token_log_weights, "sequence": sequence_log_weights}


def importance_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str = "token") -> torch.Tensor:
    """``[N, T]`` importance weight pi_theta / pi_old at ``level`` (TRL's ``importance_sampling_level``)."""
    one_of("importance_sampling_level", level, IMPORTANCE_SAMPLING_LEVELS)
    return torch.exp(IMPORTANCE_WEIGHTS[level](log_ratio, mask))  # [N, T]


# ---------------------------------------------------------------------------
# 2. the per-token objective (a loss: lower is better)
# ---------------------------------------------------------------------------


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float,
    clip_eps_high: float,
    delta: float | None = None,
) -> torch.Tensor:
    """PPO's per-token loss, -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A).

    ``delta`` (INTELLECT-2's two-sided clip): the unclipped term uses
    ``min(rho, delta)``, so a token with A < 0 whose ratio ran far above 1 can no
    longer make the loss (and its gradient) arbitrarily large: the ratio term is
    capped at ``delta`` (> 1 + eps_high). ``None`` keeps PPO's one-sided clip.

    ``ratio`` is ``[N, T]``, ``advantages`` ``[N, 1]``; returns ``[N, T]``.
    """
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps_high)  # [N, T]
    if delta is not None:
        ratio = torch.clamp(ratio, max=delta)  # [N, T]
    return -torch.min(ratio * advantages, clipped_ratio * advantages)  # [N, T]


def cispo_objective(
    ratio: torch.Tensor, advantages: torch.Tensor, logp: torch.Tensor, clip_eps_high: float
) -> torch.Tensor:
    """CISPO (MiniMax-M1): -sg(min(rho, 1 + eps_high)) * A * log pi_theta.

    The importance weight is clipped and *detached*, and multiplies the log-prob
    (REINFORCE's form), so a token whose ratio is clipped still gets a gradient,
    ``-min(rho, 1 + eps_high) * A``; PPO's clip gives such a token none.

    The cap is ``1 + clip_eps_high``, the upper end of the ratio range as for
    every other loss type (MiniMax-M1's ``1 + eps_high^IS``). TRL caps at
    ``epsilon_high`` itself (ScaleRL's ``eps_max``, recommended 5.0), so TRL's
    ``epsilon_high=5.0`` is our ``clip_eps_high=4.0``. We keep one meaning for
    ``clip_eps_high`` because TRL's, left at its default (``epsilon_high``
    falls back to ``epsilon = 0.2``), caps every weight at 0.2.
    """
    weight = torch.clamp(ratio, max=1.0 + clip_eps_high).detach()  # [N, T]
    return -weight * advantages * logp  # [N, T]


def sapo_objective(
    ratio: torch.Tensor, advantages: torch.Tensor, temperature_pos: float, temperature_neg: float
) -> torch.Tensor:
    """SAPO: a smooth gate instead of a hard clip, -(4 / tau) * sigmoid(tau * (rho - 1)) * A.

    Its gradient in rho is ``4 * s * (1 - s)`` with ``s = sigmoid(tau (rho - 1))``:
    exactly 1 at rho = 1 (as the plain surrogate), fading smoothly as rho moves
    away, never cut to 0 at a boundary. ``tau`` is ``temperature_pos`` for
    A > 0 and ``temperature_neg`` otherwise (TRL's split).
    """
    tau = torch.where(advantages > 0, temperature_pos, temperature_neg).to(ratio.dtype)  # [N, 1]
    return -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * advantages  # [N, T]


#: VESPO's log-ratio clamps, as in TRL 1.16 and the VESPO authors' code: each token's
#: log-ratio to [-20, 20], the sequence's sum to [log 1e-8, 20].
_VESPO_TOKEN_CLAMP = 20.0
_VESPO_LOG_W_MIN = math.log(1e-8)


@torch.no_grad()
def vespo_weights(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    sampler_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """VESPO's detached, Gamma-shaped weight of each sequence, ``[N, 1]``.

    ``w`` is the *sequence* importance weight pi_theta(o) / pi_old(o), the
    product of the token ratios (the sum of the log-ratios, with no division by
    the length, unlike GSPO's geometric mean), and

        phi(w) = e^lambda * w^k * e^(-lambda * w),   so phi(1) = 1,

    with ``(k, lambda) = (k_pos, lambda_pos)`` for A >= 0 and ``(k_neg,
    lambda_neg)`` for A < 0 (VESPO, Shen et al. 2026; TRL's defaults 2, 3, 3, 2).
    The weight peaks at ``w = k / lambda`` and falls smoothly to 0 on both sides:
    no hard clip, but a sequence whose weight ran far from 1 in either direction
    barely trains. It is computed under ``no_grad``: a coefficient on the
    gradient, never differentiated. Each token's log-ratio is clamped to
    [-20, 20] and the sum to [log 1e-8, 20] first, and a non-finite weight
    becomes 0, as in TRL.

    ``log_ratio`` and ``mask`` are ``[N, T]``, ``advantages`` ``[N, 1]``.
    ``sampler_weights`` (``[N, T]`` or ``[N, 1]``): a sampler's importance
    weights pi_old / mu (:func:`~grpo_tutorial.mismatch.sampler_weights`), which
    VESPO folds into w instead of multiplying the loss, as TRL does: the sum of
    their logs, each clamped to [log 1e-8, 20], joins the sequence's log-ratio
    before the sum is clamped, so w becomes pi_theta(o) / mu(o).
    """
    clamped = torch.clamp(log_ratio, -_VESPO_TOKEN_CLAMP, _VESPO_TOKEN_CLAMP)  # [N, T]
    log_w = (clamped * mask).sum(dim=-1, keepdim=True)  # [N, 1]
    if sampler_weights is not None:  # a zero weight (masked) becomes 1e-8
        log_w = log_w + torch.clamp(torch.log(sampler_weights), _VESPO_LOG_W_MIN, _VESPO_TOKEN_CLAMP).sum(
            dim=-1, keepdim=True)  # [N, 1]
    log_w = torch.clamp(log_w, _VESPO_LOG_W_MIN, _VESPO_TOKEN_CLAMP)  # [N, 1]
    positive = advantages >= 0  # [N, 1]
    k = torch.where(positive, k_pos, k_neg).to(log_w.dtype)  # [N, 1]
    lam = torch.where(positive, lambda_pos, lambda_neg).to(log_w.dtype).clamp(min=1e-4)  # [N, 1]
    log_phi = lam + k * log_w - lam * torch.exp(log_w)  # [N, 1]
    return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)  # [N, 1]


def vespo_objective(weight: torch.Tensor, advantages: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """VESPO's per-token loss, -phi(w) * A * log pi_theta, with phi(w) from :func:`vespo_weights`.

    REINFORCE's form, as CISPO's: the gradient of a token is ``-phi(w) * A``
    times the gradient of its log-prob. ``weight`` is ``[N, 1]`` (detached),
    ``advantages`` ``[N, 1]``, ``logp`` ``[N, T]``; returns ``[N, T]``.
    """
    return -weight.detach() * advantages * logp  # [N, T]


#: loss_type -> per-token objective, all with one signature.
OBJECTIVES = {
    **{
        name: lambda ratio, adv, logp, o: clipped_surrogate(ratio, adv, o["clip_eps"], o["clip_eps_high"], o["delta"])
        for name in ("grpo", "bnpo", "dapo", "dr_grpo", "luspo")
    },
    "cispo": lambda ratio, adv, logp, o: cispo_objective(ratio, adv, logp, o["clip_eps_high"]),
    "sapo": lambda ratio, adv, logp, o: sapo_objective(
        ratio, adv, o["sapo_temperature_pos"], o["sapo_temperature_neg"]
    ),
    "vespo": lambda ratio, adv, logp, o: vespo_objective(o["vespo_weight"], adv, logp),
}


def per_token_objective(
    loss_type: str, ratio: torch.Tensor, advantages: torch.Tensor, logp: torch.Tensor, **options
) -> torch.Tensor:
    """``[N, T]`` per-token loss of ``loss_type``; ``options`` holds ``clip_eps``,
    ``clip_eps_high``, ``delta``, ``sapo_temperature_pos``, ``sapo_temperature_neg``
    and, for ``"vespo"``, ``vespo_weight`` (:func:`vespo_weights`)."""
    one_of("loss_type", loss_type, LOSS_TYPES)
    return OBJECTIVES[loss_type](ratio, advantages, logp, options)


def importance_weighted_kl(kl: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3.2's bias-corrected KL term: the per-token estimate times the ratio pi_theta / pi_old.

    The tokens were sampled by pi_old, so ``ratio * k3`` is the importance-
    sampled estimate of KL(pi_theta || pi_ref). The ratio is *not* detached, and
    that changes the gradient even on-policy, where its value is exactly 1:
    d(ratio * k3)/d log pi = ratio * (k3 + 1 - pi_ref / pi), which at ratio 1
    is ``log(pi / pi_ref)``, the per-sample gradient of the reverse KL itself
    (E[grad log pi * log(pi / pi_ref)] = grad KL). Plain k3's is
    ``1 - pi_ref / pi``, which is biased (it is the gradient of the *forward*
    KL in expectation). TRL 1.16: ``use_bias_correction_kl=True``.

    ``kl`` is ``[N, T]``; ``ratio`` the importance weight, ``[N, T]`` (token
    level; with GSPO's sequence level, each sequence's ratio on all its tokens,
    and then the gradient is no longer exactly the reverse KL's: TRL's docstring
    says the same of its sequence level).
    """
    return kl * ratio  # [N, T]


# ---------------------------------------------------------------------------
# 3. loss masks: which tokens train
# ---------------------------------------------------------------------------


def truncation_mask(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """DAPO's overlong filter: ``mask`` with every truncated completion's row set to 0.

    A completion cut off at ``max_new_tokens`` has no final answer, so its
    (low) reward says nothing about its tokens. TRL zeroes these rows of the
    completion mask, so they drop out of the loss *and* of the token counts
    (``dapo``'s normaliser, the entropy quantile, the entropy bonus); with
    ``grpo`` they still count as sequences in the mean over N. Same here.
    """
    return mask * (~truncated.bool()).to(mask.dtype)[:, None]  # [N, T]


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """``[N, T]`` bool: the tokens whose entropy is in the top ``top_quantile`` of this batch.

    "Beyond the 80/20 rule" trains only on the high-entropy "forking" tokens.
    The threshold is the ``1 - top_quantile`` quantile of the entropies of the
    counted tokens; a token is kept if its entropy is >= it (so ties at the
    threshold are kept, and 0.0 keeps the highest-entropy token(s)). As in TRL,
    the quantile is taken over the tokens of the batch passed in: with
    gradient accumulation, one micro-batch.
    """
    counted = mask.bool()  # [N, T]
    values = entropies.detach()[counted].float()  # [K]
    if values.numel() == 0:
        return torch.zeros_like(counted)
    threshold = torch.quantile(values, 1.0 - top_quantile)
    return (entropies.detach() * mask >= threshold) & counted  # [N, T]


def off_policy_mask(
    advantages: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, threshold: float
) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask, ``[N, 1]`` (1 keep, 0 drop).

    A sequence is dropped when its advantage is negative *and* the policy has
    moved far from the one that sampled it: the mean over its tokens of
    ``log pi_old - log pi_theta`` (a KL estimate) exceeds ``threshold``.
    Pushing down a sample the current policy would no longer produce is mostly
    noise. In this package the sampler and the scorer are the same model by
    default, so on-policy (mu = 1, one update per step) the estimate is exactly
    0 and the mask keeps everything; it acts only on the later updates of a step
    (mu > 1, or several minibatches). With a sampler that is not the learner,
    ``grpo_loss`` passes the sampler's own log-probs as ``old_logp`` (as TRL does
    with vLLM's).
    """
    kl = torch.where(mask.bool(), old_logp.detach() - logp.detach(), torch.zeros_like(logp))  # [N, T]
    seq_kl = kl.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)  # [N, 1]
    return ((advantages >= 0) | (seq_kl <= threshold)).to(logp.dtype)  # [N, 1]


# ---------------------------------------------------------------------------
# 4. aggregation, and the entropy bonus
# ---------------------------------------------------------------------------


def _sequence_mean(masked, mask, max_completion_length):
    return (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).mean()


def _sequence_sum_mean(masked, mask, max_completion_length):
    return masked.sum(dim=1).mean()


def _token_mean(masked, mask, max_completion_length):
    return masked.sum() / mask.sum().clamp(min=1.0)


def _constant_normaliser(masked, mask, max_completion_length):
    length = masked.shape[1] if max_completion_length is None else max_completion_length
    check_int(None, "max_completion_length", length, masked.shape[1],
              hint=f"; it must cover the completion width, {masked.shape[1]} tokens")
    return masked.sum() / (masked.shape[0] * length)


#: loss_type -> how its per-token losses become one number (``dapo``,
#: ``cispo`` and ``vespo`` are handled apart: their normaliser is the whole
#: update's token count). ``luspo`` (LUSPO, Liu et al. 2026) is GSPO's loss with
#: each sequence's loss scaled by its length: with a sequence-level ratio every
#: token of a sequence carries the same loss, so the token sum is
#: ``|o_i| * loss_i`` and the mean over sequences of those is LUSPO's objective.
AGGREGATIONS = {
    "grpo": _sequence_mean,
    "sapo": _sequence_mean,
    "luspo": _sequence_sum_mean,
    "bnpo": _token_mean,
    "dr_grpo": _constant_normaliser,
    "dapo": None,
    "cispo": None,
    "vespo": None,
}


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
    check_int(None, "gradient_accumulation_steps", gradient_accumulation_steps, 1)
    # where(), not multiplication: a NaN/inf at a padded position must not leak in.
    masked = torch.where(mask.bool(), per_token, torch.zeros_like(per_token))  # [N, T]
    reduce = AGGREGATIONS[loss_type]
    if reduce is None:  # dapo, cispo, vespo: tokens of the whole update
        tokens = mask.sum() if num_items_in_batch is None else torch.as_tensor(num_items_in_batch, dtype=masked.dtype)
        return masked.sum() / tokens.clamp(min=1.0)
    loss = reduce(masked, mask, max_completion_length)
    return loss if gradient_accumulation_steps == 1 else loss / gradient_accumulation_steps


def entropy_bonus(entropies: torch.Tensor, mask: torch.Tensor, gradient_accumulation_steps: int = 1) -> torch.Tensor:
    """The mean per-token entropy over ``mask``, / K under accumulation (a scalar, with gradient).

    ``grpo_loss`` subtracts ``entropy_coef`` times this. As in TRL, it is the
    same token mean whatever the loss type (not that type's normaliser), so
    ``entropy_coef`` means the same for every loss type.
    """
    masked = torch.where(mask.bool(), entropies, torch.zeros_like(entropies))  # [N, T]
    return masked.sum() / mask.sum().clamp(min=1.0) / gradient_accumulation_steps


def applied_entropy_coef(coef: float, last_entropy: float, target: float) -> float:
    """Skywork-OR1's gate: the coefficient applied this update, ``coef`` if the last entropy <= ``target``, else 0.

    ``last_entropy`` is the mean entropy measured over the previous optimizer
    update (``inf`` before the first, so the first update applies no bonus, as
    in TRL 1.16).
    """
    return float(coef) if last_entropy <= target else 0.0


def adapt_entropy_coef(
    coef: float, entropy: float, *, target: float, delta: float, coef_min: float, coef_max: float
) -> float:
    """Skywork-OR1's adaptive entropy control: the next update's coefficient.

    After each optimizer update, the mean per-token entropy of that update's
    (counted) tokens is compared with ``target``: at or below it, the
    coefficient rises by ``delta`` (more push towards exploration), above it,
    it falls by ``delta``; either way it stays in ``[coef_min, coef_max]``.
    Combined with :func:`applied_entropy_coef`, the bonus acts only while the
    entropy is at or below the target (TRL 1.16's ``use_adaptive_entropy``).
    """
    if entropy <= target:
        return min(float(coef) + delta, coef_max)
    return max(float(coef) - delta, coef_min)


@dataclasses.dataclass
class EntropyControl:
    """The entropy bonus's coefficient across a run's updates: fixed, or adaptive (Skywork-OR1).

    With ``adaptive`` False, :attr:`coef` is ``entropy_coef`` for the whole run.
    With ``adaptive`` True, each update applies :func:`applied_entropy_coef` of
    the coefficient and the entropy the last update measured, and
    :meth:`measured` sets the next coefficient (:func:`adapt_entropy_coef`).
    Checkpoints keep :meth:`to_meta`.
    """

    coef: float
    adaptive: bool = False
    target: float = 0.2
    delta: float = 0.005
    coef_min: float = 0.0
    coef_max: float = 1.0
    last_entropy: float = math.inf  # the last update's mean entropy (inf: none measured yet)

    @classmethod
    def from_config(cls, config: Any, saved: dict | None = None) -> "EntropyControl":
        """The control a run with ``config`` (a ``GRPOConfig``) starts with, or, from ``saved``, resumes with."""
        control = cls(
            float(config.entropy_coef), config.use_adaptive_entropy, config.entropy_target,
            config.entropy_coef_delta, config.entropy_coef_min, config.entropy_coef_max,
        )
        if saved:  # to_meta's form (a checkpoint from before the control has none: start afresh)
            control.coef = float(saved["coef"])
            control.last_entropy = math.inf if saved["last_entropy"] is None else float(saved["last_entropy"])
        return control

    def loss_options(self, options: Any) -> Any:
        """``options`` (a ``LossOptions``) with this update's coefficient: the controller's, if the entropy is low."""
        if not self.adaptive:
            return options
        coef = applied_entropy_coef(self.coef, self.last_entropy, self.target)
        return dataclasses.replace(options, entropy_coef=coef)

    def measured(self, update_stats: Sequence[dict]) -> None:
        """After an update: its mean entropy, from its micro-batches' ``entropy_sum`` and ``entropy_tokens``
        (``grpo_loss``'s stats), sets the next update's coefficient."""
        if not self.adaptive:
            return
        entropy_sum, entropy_tokens = 0.0, 0.0
        for stats in update_stats:  # in order, as the micro-batches ran
            entropy_sum, entropy_tokens = entropy_sum + stats["entropy_sum"], entropy_tokens + stats["entropy_tokens"]
        self.last_entropy = entropy_sum / max(entropy_tokens, 1.0)
        self.coef = adapt_entropy_coef(
            self.coef, self.last_entropy, target=self.target, delta=self.delta,
            coef_min=self.coef_min, coef_max=self.coef_max,
        )

    def to_meta(self) -> dict:
        """The checkpoint form (None: no entropy measured yet)."""
        return {"coef": self.coef, "last_entropy": None if math.isinf(self.last_entropy) else self.last_entropy}

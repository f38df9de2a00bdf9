"""Stage 5 of a GRPO step (update): the clipped surrogate objective and its aggregation.

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
* ``"cispo"`` (MiniMax-M1): a clipped, detached weight times log pi, so clipped
  tokens keep a gradient; aggregated like ``"dapo"``.
* ``"sapo"``: a sigmoid gate instead of the hard clip; aggregated like ``"grpo"``.
* ``"luspo"`` (LUSPO): GSPO's clipped surrogate (it needs
  ``importance_sampling_level="sequence"``), each sequence's loss scaled by its
  length: the mean over sequences of the token *sums*.
* ``"vespo"`` (VESPO): no clip; a detached Gamma-shaped weight of the sequence's
  importance weight times A * log pi (REINFORCE's form); aggregated like ``"dapo"``.

The other variant options (GSPO's sequence ratio, ``delta``, truncation
masking, the high-entropy tokens, the entropy bonus, the off-policy mask,
DeepSeek-V3.2's bias-corrected KL) have TRL's names; each is one function of
:mod:`grpo_tutorial.objectives`. Their defaults leave the loss exactly as above.

Every setting of the loss is one field of :class:`LossOptions`, a frozen
dataclass: the only place where a loss setting is defined, documented and
checked. :class:`~grpo_tutorial.config.GRPOConfig` keeps the same names as flat
fields (TRL's) and builds one with ``config.loss_options()``, which the step
passes as ``grpo_loss(..., options=...)``. A notebook passes the few settings the
chapters vary by name instead (``grpo_loss(..., loss_type="dapo", beta=0.04)``:
:data:`NAMED_OPTIONS`), which builds the object.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, fields
from typing import Any

import torch

from ._checks import check_choice, check_flag, check_int, check_number, config_error, is_number, require_tensor, same_shape
from .kl import KL_KINDS, kl_estimate
from .objectives import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    aggregate_tokens,
    entropy_bonus,
    high_entropy_mask,
    importance_weighted_kl,
    importance_weights,
    masked_log_ratio,
    off_policy_mask,
    per_token_objective,
    truncation_mask,
    vespo_weights,
)

__all__ = [
    "LOSS_TYPES", "LossOptions", "NAMED_OPTIONS", "aggregate_tokens", "grpo_loss", "sequence_logprob_loss",
    "update_normalisers",
]


@dataclass(frozen=True)
class LossOptions:
    """Every setting of the loss (stage 5), defined, documented and checked here only.

    :class:`GRPOConfig <grpo_tutorial.config.GRPOConfig>` has a field of each
    name (TRL's flat names, for the command line) and builds this object with
    ``config.loss_options()``, with ``max_completion_length`` set to its
    ``max_new_tokens``. Build it directly too: ``LossOptions(loss_type="dapo")``.
    ``owner`` only names the object in error messages (``GRPOConfig.delta must be
    ...`` when the config builds it).

    A bad value raises ``ValueError`` naming the field, the value and what it
    should be (``TypeError`` when the value has the wrong type); so does an
    option that the chosen ``loss_type`` would silently ignore (``delta`` with
    CISPO, SAPO or VESPO) or that contradicts it (LUSPO without GSPO's
    sequence-level ratio, VESPO with it).

    Attributes:
        loss_type: ``"grpo"``, ``"bnpo"``, ``"dapo"``, ``"dr_grpo"``, ``"cispo"``
            (MiniMax-M1: a clipped, detached weight times log pi, so clipped
            tokens keep a gradient; its cap is ``1 + clip_eps_high``, which may
            then be >= 1: TRL's ``epsilon_high=5.0`` is ``clip_eps_high=4.0``),
            ``"sapo"`` (a sigmoid gate instead of the clip), ``"luspo"`` (LUSPO:
            GSPO's loss with each sequence's loss scaled by its length; needs
            ``importance_sampling_level="sequence"``) or ``"vespo"`` (VESPO: no
            clip, a detached Gamma-shaped weight of the sequence's importance
            weight; aggregated like ``"dapo"``). How each aggregates: the module docstring.
        clip_eps, clip_eps_high: PPO clip range (1 - eps, 1 + eps_high);
            ``clip_eps_high=None`` means symmetric. DAPO's clip-higher uses 0.28.
            The loss takes any ``clip_eps_high > 0`` (chapter 4 switches the clip
            off with 1e6); a training run's :class:`~grpo_tutorial.config.GRPOConfig`
            keeps it in (0, 1) except for CISPO, whose cap lies far above 2.
        beta: KL penalty weight; 0 = no penalty (and the trainer keeps no
            reference model at all).
        kl_kind: ``"k1"``, ``"k2"`` or ``"k3"`` (the estimator in the penalty).
        max_completion_length: ``dr_grpo``'s constant (None = the batch's width;
            the config passes its ``max_new_tokens``).
        importance_sampling_level: ``"token"`` (one ratio per token) or
            ``"sequence"`` (GSPO: one length-normalised ratio per completion).
        delta: None, or a cap on the ratio in the unclipped term of the clipped
            surrogate (INTELLECT-2's two-sided clip); must be > 1 + clip_eps_high.
        sapo_temperature_pos, sapo_temperature_neg: SAPO's gate temperatures for
            positive and non-positive advantages (TRL's defaults 1.0 and 1.05).
        mask_truncated_completions: completions cut off at ``max_new_tokens``
            get no loss and no gradient, and their tokens leave every token
            count (DAPO's overlong filter; TRL zeroes their loss mask the same way).
        top_entropy_quantile: train only on the tokens in this top fraction of
            per-token entropy, per micro-batch as in TRL (1.0 = all tokens; the
            80/20 paper uses 0.2).
        entropy_coef: subtract this times the mean per-token entropy (an
            entropy bonus; 0 = off). With the config's ``use_adaptive_entropy``,
            the coefficient it starts from. Both entropy options use the
            *current* policy's entropy with its gradient, from the gradient pass
            (as TRL does), never the no-grad old-policy pass; the history's
            ``entropy`` stays the sampling policy's.
        off_policy_mask_threshold: None, or drop from the loss the completions
            with a negative advantage whose mean log(pi_old / pi_theta) exceeds
            it (DeepSeek-V3.2). With the default sampler, sampler and scorer are one model, so it
            only acts on the later updates of an off-policy step (mu > 1 or
            several minibatches); on-policy it keeps everything. With a sampler
            that is not the learner (``GRPOConfig.sampler``) the drift is
            measured from the sampler's own log-probs, as TRL's is with vLLM.
        use_bias_correction_kl: multiply the KL term by the importance ratio
            pi_theta / pi_old, not detached (DeepSeek-V3.2). On-policy the
            penalty's value is unchanged (the ratio is 1), but its gradient per
            token becomes log(pi / pi_ref), the reverse KL's, where plain k3's,
            1 - pi_ref / pi, pulls on average towards the *forward* KL
            (chapter 5). Default False, where TRL 1.16's is True: the package's
            defaults are DeepSeekMath's GRPO objective (as ``loss_type="grpo"``
            is, where TRL's default is ``"dapo"``), and later refinements are
            switched on by name; so every chapter's and golden run's numbers
            stay those of the plain k3 penalty. Set True to match TRL's default.
            It only matters with ``beta > 0``. The reverse-KL gradient is exact
            at ``importance_sampling_level="token"``; at ``"sequence"`` each
            sequence's one ratio multiplies the KL of all its tokens, as in TRL.
        vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg: the shape
            of VESPO's weight phi(w) = e^lambda w^k e^(-lambda w) for positive
            and negative advantages (TRL's defaults 2, 3, 3, 2; the weight
            peaks at w = k / lambda).
    """

    loss_type: str = "grpo"
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    beta: float = 0.0
    kl_kind: str = "k3"
    max_completion_length: int | None = None
    importance_sampling_level: str = "token"
    delta: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    mask_truncated_completions: bool = False
    top_entropy_quantile: float = 1.0
    entropy_coef: float = 0.0
    off_policy_mask_threshold: float | None = None
    use_bias_correction_kl: bool = False
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    owner: InitVar[str] = "LossOptions"

    def __post_init__(self, owner: str) -> None:
        o = owner
        check_choice(o, "loss_type", self.loss_type, LOSS_TYPES)
        check_number(o, "clip_eps", self.clip_eps, lambda v: 0 < v < 1, "a number in (0, 1), e.g. 0.2")
        check_number(o, "clip_eps_high", self.clip_eps_high, lambda v: v > 0,
                     "None or a number > 0 (e.g. 0.28; CISPO's cap is 1 + clip_eps_high)", optional=True)
        check_number(o, "beta", self.beta, lambda v: v >= 0, "a number >= 0 (0 = no KL penalty)")
        check_choice(o, "kl_kind", self.kl_kind, KL_KINDS)
        check_int(o, "max_completion_length", self.max_completion_length, 1, optional=True)
        check_choice(o, "importance_sampling_level", self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
        if self.loss_type == "luspo" and self.importance_sampling_level != "sequence":
            raise config_error(o, "importance_sampling_level", self.importance_sampling_level,
                               "'sequence' with loss_type='luspo'",
                               ": LUSPO scales GSPO's sequence-level loss by each sequence's length")
        if self.loss_type == "vespo" and self.importance_sampling_level != "token":
            raise config_error(o, "importance_sampling_level", self.importance_sampling_level,
                               "'token' with loss_type='vespo'",
                               ": VESPO builds its own sequence weight from the token log-ratios")
        if self.delta is not None and self.loss_type in ("cispo", "sapo", "vespo"):
            raise config_error(o, "delta", self.delta, f"None with loss_type={self.loss_type!r}",
                               ": delta caps the clipped surrogate's ratio, which this loss type does not use")
        eps_high = self.eps_high
        if is_number(eps_high):
            check_number(o, "delta", self.delta, lambda v: v > 1 + eps_high,
                         f"None or a number > 1 + clip_eps_high = {1 + eps_high:g}", optional=True)
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            check_number(o, name, getattr(self, name), lambda v: v > 0, "a number > 0")
        check_flag(o, "mask_truncated_completions", self.mask_truncated_completions)
        check_number(o, "top_entropy_quantile", self.top_entropy_quantile, lambda v: 0 <= v <= 1,
                     "a number in [0, 1] (1.0 = every token; the 80/20 paper uses 0.2)")
        check_number(o, "entropy_coef", self.entropy_coef, lambda v: True, "a number (0 = no entropy bonus)")
        check_number(o, "off_policy_mask_threshold", self.off_policy_mask_threshold, lambda v: v >= 0,
                     "None or a number >= 0 (e.g. 0.5)", optional=True)
        check_flag(o, "use_bias_correction_kl", self.use_bias_correction_kl)
        for name in ("vespo_k_pos", "vespo_k_neg"):
            check_number(o, name, getattr(self, name), lambda v: v >= 0, "a number >= 0 (the power of w in VESPO's weight)")
        for name in ("vespo_lambda_pos", "vespo_lambda_neg"):
            check_number(o, name, getattr(self, name), lambda v: v > 0, "a number > 0 (the decay rate in VESPO's weight)")

    @property
    def eps_high(self) -> float:
        """The upper clip, ``clip_eps_high``, or ``clip_eps`` when it is None (symmetric)."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    @property
    def needs_entropy(self) -> bool:
        """Whether the loss uses the current policy's per-token entropy (with its gradient)."""
        return self.top_entropy_quantile < 1.0 or self.entropy_coef != 0.0


#: The settings :func:`grpo_loss` also takes by name (the ones the chapters vary); the rest go in ``options``.
NAMED_OPTIONS = ("loss_type", "beta", "clip_eps", "clip_eps_high", "kl_kind", "max_completion_length",
                 "importance_sampling_level", "use_bias_correction_kl")


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    sampler_weights: torch.Tensor | None = None,
    sampler_logp: torch.Tensor | None = None,
    options: LossOptions | None = None,
    gradient_accumulation_steps: int = 1,
    num_items_in_batch: float | torch.Tensor | None = None,
    **settings: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss (to minimise) and a dict of diagnostics.

    The settings are one :class:`LossOptions` (``options``: what the step passes,
    ``config.loss_options()``), whose fields document every setting; or, for the
    settings the chapters vary (:data:`NAMED_OPTIONS`), keywords of the same
    names, which build a ``LossOptions`` (the others at their defaults). Each
    setting's name, default and check are ``LossOptions``' alone: none is
    written here. A name that is not in :data:`NAMED_OPTIONS` is refused with a
    ``TypeError`` that lists them; a setting passed beside ``options`` is
    refused with a ``ValueError``, even one equal to the options' own value
    (one way or the other: ``dataclasses.replace(options, beta=...)``).

    Args:
        logp: ``[N, T]`` log pi_theta of the sampled tokens, with gradient.
        old_logp: ``[N, T]`` log pi_old, recorded at sampling time (no gradient).
        advantages: ``[N]`` one advantage per completion (GRPO), or ``[N, T]``
            one per token (PPO's GAE, :mod:`grpo_tutorial.ppo`), the shape of
            ``logp``. Per-token advantages are refused with VESPO and the
            off-policy mask, which read the sign of one advantage per completion.
        mask: ``[N, T]`` 1 for real completion tokens, 0 for padding.
        ref_logp: ``[N, T]`` log pi_ref, required when ``beta > 0``.
        truncated: ``[N]`` bool, the completions cut off by the budget; required
            by ``mask_truncated_completions``.
        entropies: ``[N, T]`` per-token entropy of the *current* policy (the
            gradient pass), required by ``top_entropy_quantile < 1`` and
            ``entropy_coef != 0``.
        sampler_weights: ``[N, T]`` or ``[N, 1]``, or None: the importance
            weights of a sampler that is not the learner
            (:func:`~grpo_tutorial.mismatch.sampler_weights`, TRL's
            ``importance_sampling_ratio``). Each token's policy loss is
            multiplied by its weight, after the off-policy and entropy masks and
            before the KL term is added, as TRL multiplies them in; VESPO folds
            them into its sequence weight instead (TRL's ``get_gamma_weights``).
        sampler_logp: ``[N, T]`` or None: the sampler's own log-probs of the
            tokens (``Rollout.sampler_logprobs``; NaN where unknown). When given,
            ``off_policy_mask_threshold`` measures the drift from the sampler,
            not from ``old_logp``, as TRL's does with vLLM (a NaN token counts
            as no drift, as in TRL); nothing else reads it.
        options: every setting as one :class:`LossOptions`.
        gradient_accumulation_steps, num_items_in_batch: the normalisers for an
            update split into micro-batches (see :mod:`grpo_tutorial.objectives`);
            TRL's names. The defaults give the loss of this batch alone. They
            belong to the call (:func:`update_normalisers`), not to the settings.
        **settings: instead of ``options``, the :class:`LossOptions` fields
            named in :data:`NAMED_OPTIONS` (``loss_type``, ``beta``,
            ``clip_eps``, ``clip_eps_high``, ``kl_kind``,
            ``max_completion_length``, ``importance_sampling_level``,
            ``use_bias_correction_kl``), by name.

    Returns:
        ``(loss, stats)``: stats are plain floats, measured over masked tokens:
        ``clip_frac_low`` (ratio < 1-eps_low with A < 0: clipped, no gradient),
        ``clip_frac_high`` (ratio > 1+eps_high with A > 0), ``clip_frac`` (their
        sum), ``kl`` (mean of the KL term, times the ratio with
        ``use_bias_correction_kl``; NaN when no ``ref_logp`` is given),
        ``ratio_mean``, ``ratio_max``, ``adv_mean``, ``adv_std``; when
        ``entropies`` are given, also ``entropy_sum`` and ``entropy_tokens``,
        the sum of the entropies over the tokens the bonus acts on and their
        count (adaptive entropy control measures the update's entropy with them).
    """
    opts = _options(options, settings)
    _check_inputs(logp, old_logp, advantages, mask, ref_logp, opts, truncated, entropies)
    _check_sampler_inputs(logp, sampler_weights, sampler_logp)
    mask = mask.to(logp.dtype)
    # the loss's own mask: the rollout's mask minus truncated completions (never mutate the rollout's)
    loss_mask = truncation_mask(mask, truncated) if opts.mask_truncated_completions else mask  # [N, T]

    adv = advantages.detach().to(logp.dtype)  # [N] or, per token, [N, T]
    adv = adv[:, None] if adv.dim() == 1 else adv  # [N, 1] (broadcast over the tokens) or [N, T]
    log_ratio = masked_log_ratio(logp, old_logp, mask)  # [N, T]
    ratio = importance_weights(log_ratio, mask, opts.importance_sampling_level)  # [N, T]
    per_token = _objective(opts, ratio, adv, logp, log_ratio, loss_mask, sampler_weights)  # [N, T]
    if opts.off_policy_mask_threshold is not None:
        sampled = old_logp if sampler_logp is None else torch.where(torch.isnan(sampler_logp), logp.detach(), sampler_logp)
        per_token = per_token * off_policy_mask(adv, logp, sampled, loss_mask, opts.off_policy_mask_threshold)  # [N, T]
    keep = high_entropy_mask(entropies, loss_mask, opts.top_entropy_quantile) if opts.top_entropy_quantile < 1.0 else None
    if keep is not None:
        per_token = per_token * keep  # [N, T]
    if sampler_weights is not None and opts.loss_type != "vespo":  # a sampler that is not the learner (TRL's)
        per_token = per_token * sampler_weights.detach().to(per_token.dtype)  # [N, T]
    kl = None if ref_logp is None else _kl_term(logp, ref_logp, mask, ratio, opts)  # [N, T]
    if kl is not None and opts.beta > 0:
        per_token = per_token + opts.beta * kl  # [N, T]
    loss = aggregate_tokens(
        per_token, loss_mask, opts.loss_type, opts.max_completion_length,
        gradient_accumulation_steps=gradient_accumulation_steps, num_items_in_batch=num_items_in_batch,
    )
    bonus_mask = loss_mask if keep is None else loss_mask * keep  # [N, T]: the tokens the bonus acts on
    if opts.entropy_coef != 0.0:
        loss = loss - opts.entropy_coef * entropy_bonus(entropies, bonus_mask, gradient_accumulation_steps)
    return loss, _loss_stats(ratio, adv, advantages, mask, kl, opts, entropies, bonus_mask)


def _options(options: LossOptions | None, settings: dict[str, Any]) -> LossOptions:
    """The one :class:`LossOptions` of a :func:`grpo_loss` call: ``options``, or the settings given by name built into one."""
    unknown = sorted(set(settings) - set(NAMED_OPTIONS))
    if unknown:
        others = [f.name for f in fields(LossOptions) if f.name not in NAMED_OPTIONS]
        raise TypeError(
            f"grpo_loss got unexpected keyword argument(s) {unknown}: the settings it takes by name are "
            f"{list(NAMED_OPTIONS)}; the other settings of the loss, {others}, go in options=LossOptions(...)"
        )
    if options is None:
        return LossOptions(**settings)
    if not isinstance(options, LossOptions):
        raise TypeError(f"options must be a LossOptions (e.g. config.loss_options()), got {type(options).__name__}")
    if settings:
        given = sorted(settings)
        raise ValueError(
            f"grpo_loss got options and also the keyword(s) {given}; pass the settings one way: "
            f"dataclasses.replace(options, {given[0]}=...) or keywords alone"
        )
    return options


def _objective(opts: LossOptions, ratio, adv, logp, log_ratio, loss_mask, sampler_weights) -> torch.Tensor:
    """The per-token objective of ``opts.loss_type``, ``[N, T]``; VESPO's sequence weight is built for it here."""
    vespo_weight = None
    if opts.loss_type == "vespo":
        vespo_weight = vespo_weights(
            log_ratio, loss_mask, adv, opts.vespo_k_pos, opts.vespo_lambda_pos, opts.vespo_k_neg, opts.vespo_lambda_neg,
            sampler_weights=None if sampler_weights is None else sampler_weights.detach().to(logp.dtype),
        )  # [N, 1], detached
    return per_token_objective(
        opts.loss_type, ratio, adv, logp, clip_eps=opts.clip_eps, clip_eps_high=opts.eps_high, delta=opts.delta,
        sapo_temperature_pos=opts.sapo_temperature_pos, sapo_temperature_neg=opts.sapo_temperature_neg,
        vespo_weight=vespo_weight,
    )  # [N, T]


def _kl_term(logp, ref_logp, mask, ratio, opts: LossOptions) -> torch.Tensor:
    """The per-token KL to the reference (times the ratio with ``use_bias_correction_kl``), ``[N, T]``."""
    # As for the ratio: padded positions get log-ratio 0, so a huge gap
    # between policy and reference on pad tokens cannot turn into NaN grads.
    ref_safe = torch.where(mask.bool(), ref_logp.detach(), logp.detach())  # [N, T]
    kl = kl_estimate(logp, ref_safe, kind=opts.kl_kind)  # [N, T]
    return importance_weighted_kl(kl, ratio) if opts.use_bias_correction_kl else kl


@torch.no_grad()
def _loss_stats(ratio, adv, advantages, mask, kl, opts: LossOptions, entropies, bonus_mask) -> dict[str, float]:
    """:func:`grpo_loss`'s diagnostics, plain floats over the masked tokens."""
    n_tok = mask.sum()
    low = ((ratio < 1.0 - opts.clip_eps) & (adv < 0)).to(mask.dtype) * mask
    high = ((ratio > 1.0 + opts.eps_high) & (adv > 0)).to(mask.dtype) * mask
    ratio_masked = ratio.masked_select(mask.bool())
    stats = {
        "clip_frac_low": float(low.sum() / n_tok),
        "clip_frac_high": float(high.sum() / n_tok),
        "clip_frac": float((low.sum() + high.sum()) / n_tok),
        "kl": float(torch.where(mask.bool(), kl, 0.0).sum() / n_tok) if kl is not None else float("nan"),
        "ratio_mean": float(ratio_masked.mean()),
        "ratio_max": float(ratio_masked.max()),
        **_advantage_stats(advantages, mask),
    }
    if entropies is not None:
        stats["entropy_sum"] = float(torch.where(bonus_mask.bool(), entropies, 0.0).sum())
        stats["entropy_tokens"] = float(bonus_mask.sum())
    return stats


def _advantage_stats(advantages: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``adv_mean`` and ``adv_std``: over the completions (``[N]``), or over the masked tokens (``[N, T]``)."""
    values = advantages if advantages.dim() == 1 else advantages.masked_select(mask.bool())  # [N] or [K]
    return {"adv_mean": float(values.mean()), "adv_std": float(values.std()) if values.numel() > 1 else 0.0}


def _check_inputs(logp, old_logp, advantages, mask, ref_logp, opts: LossOptions, truncated, entropies) -> None:
    """The tensors' kinds and shapes, and those the options need."""
    require_tensor("logp", logp, dim=2, floating=True)
    require_tensor("old_logp", old_logp, dim=2, floating=True)
    require_tensor("mask", mask, dim=2)
    require_tensor("advantages", advantages, floating=True)
    if advantages.dim() == 2 and advantages.shape == logp.shape:  # one advantage per token (PPO's GAE)
        _check_per_token_advantages(opts)
    elif advantages.dim() != 1:
        raise ValueError(f"advantages must have 1 dimensions, got shape {tuple(advantages.shape)} (one advantage "
                         f"per completion, [N]; or one per token, [N, T], the shape of logp {tuple(logp.shape)})")
    if ref_logp is not None:
        require_tensor("ref_logp", ref_logp, dim=2, floating=True)
    same_shape(logp=logp, old_logp=old_logp, mask=mask, ref_logp=ref_logp)
    if advantages.shape[0] != logp.shape[0]:
        raise ValueError(
            f"advantages has {advantages.shape[0]} entries but logp has {logp.shape[0]} rows; expected one advantage per completion"
        )
    if opts.beta > 0 and ref_logp is None:
        raise ValueError(f"beta={opts.beta} > 0 needs ref_logp (the reference policy's log-probs)")
    _check_option_tensors(logp, opts, truncated, entropies)
    if mask.sum() == 0:
        raise ValueError("mask is all zeros: there are no completion tokens to train on")


def _check_per_token_advantages(opts: LossOptions) -> None:
    """``[N, T]`` advantages (one per token) go with a loss that does not read one sign per completion."""
    if opts.loss_type == "vespo":
        raise ValueError("advantages of shape [N, T] (one per token) cannot go with loss_type='vespo': VESPO's "
                         "weight of a completion depends on the sign of its one advantage; pass [N] advantages")
    if opts.off_policy_mask_threshold is not None:
        raise ValueError("advantages of shape [N, T] (one per token) cannot go with off_policy_mask_threshold: the "
                         "mask drops completions by the sign of their one advantage; pass [N] advantages")


def _check_sampler_inputs(logp: torch.Tensor, weights, sampler_logp) -> None:
    """``sampler_weights``: None, or a float tensor ``[N, T]`` or ``[N, 1]``; ``sampler_logp``: None, or ``[N, T]``."""
    if weights is not None:
        require_tensor("sampler_weights", weights, dim=2, floating=True)
        n, t = logp.shape
        if tuple(weights.shape) not in ((n, t), (n, 1)):
            raise ValueError(f"sampler_weights must have shape ({n}, {t}) or ({n}, 1), got {tuple(weights.shape)}")
    if sampler_logp is not None:
        require_tensor("sampler_logp", sampler_logp, dim=2, floating=True)
        same_shape(logp=logp, sampler_logp=sampler_logp)


def update_normalisers(
    options: LossOptions, mask: torch.Tensor, truncated: torch.Tensor, rows: torch.Tensor, micro_size: int
) -> dict:
    """:func:`grpo_loss`'s normalisers for one optimizer update of ``rows``, split into micro-batches of ``micro_size``.

    ``gradient_accumulation_steps`` is the number of micro-batches K, and
    ``num_items_in_batch`` the tokens the whole update counts (``dapo``'s,
    ``cispo``'s and ``vespo``'s normaliser): those of ``mask`` (``[N, T]``),
    less the truncated completions' (``truncated``, ``[N]``) with
    ``mask_truncated_completions``. Pass them to every micro-batch's call.
    """
    counted = truncation_mask(mask, truncated) if options.mask_truncated_completions else mask  # [N, T]
    return {"gradient_accumulation_steps": len(rows) // micro_size, "num_items_in_batch": counted[rows].sum()}


def _check_option_tensors(logp: torch.Tensor, opts: LossOptions, truncated, entropies) -> None:
    """The tensors some options need: ``truncated`` for truncation masking, ``entropies`` for the entropy options."""
    if opts.mask_truncated_completions:
        if truncated is None:
            raise ValueError("mask_truncated_completions=True needs truncated, a [N] bool tensor (Rollout.truncated)")
        is_flags = isinstance(truncated, torch.Tensor) and truncated.dtype == torch.bool
        if not is_flags or tuple(truncated.shape) != (logp.shape[0],):
            raise ValueError(
                f"truncated must be a bool tensor of shape ({logp.shape[0]},), got "
                f"{getattr(truncated, 'dtype', type(truncated).__name__)} {tuple(getattr(truncated, 'shape', ()))}"
            )
    if opts.needs_entropy and entropies is None:
        raise ValueError(
            "top_entropy_quantile < 1 and entropy_coef != 0 each need entropies, the [N, T] per-token entropy "
            "of the current policy (completion_logprobs(..., return_entropy=True, entropy_grad=True))"
        )
    if entropies is not None:
        require_tensor("entropies", entropies, dim=2, floating=True)
        same_shape(logp=logp, entropies=entropies)


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

"""Stage 3 of a GRPO step: group-relative advantages.

Each prompt gets G sampled completions, and each completion a scalar reward. GRPO
replaces PPO's learned value function (the critic) with the group itself: a
completion's advantage is how much better it scored than its siblings,

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)

(DeepSeekMath, eq. 3 / the outcome-supervision case). Dr. GRPO drops the division.

Two relatives change the baseline (what a reward is compared with), and compose
with any ``scale``:

* RLOO (``baseline="rloo"``): the mean of the *other* G - 1 rewards of the group,
  ``A_i = r_i - (sum_j r_j - r_i) / (G - 1) = G / (G - 1) * (r_i - mean)``.
  A completion's own reward is not in its baseline, so the estimate is unbiased.
* REINFORCE++ (``baseline="batch"`` with ``scale="batch"``): one baseline for the
  whole batch, ``A_i = (r_i - mean(r_batch)) / (std(r_batch) + eps)``. A group
  whose rewards are all equal still gets a non-zero advantage (the baseline is
  not its own mean). ``baseline="group"`` with ``scale="batch"`` is
  "REINFORCE++ with baseline" (TRL's ``scale_rewards="batch"``).

With several reward functions, GRPO sums the weighted rewards first and then
z-scores the sum (TRL's ``multi_objective_aggregation="sum_then_normalize"``).
GDPO (:func:`normalize_then_sum`) z-scores each reward function within its group
first, sums those with the weights, and z-scores the sum over the whole batch,
so a reward on a large scale cannot drown out one on a small scale.
"""

from __future__ import annotations

import math

import torch

from ._checks import as_float_tensor, check_int, one_of, require_tensor

SCALES = ("group", "batch", "none")
#: TRL's ``multi_objective_aggregation``: sum the weighted rewards, then normalise
#: (GRPO, the default), or normalise each reward function, then sum (GDPO).
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
BASELINES = ("group", "rloo", "batch")
STDS = ("sample", "population")
NAN_POLICIES = ("raise", "skip")


def group_advantages(
    rewards,
    group_size: int | None = None,
    *,
    scale: str = "group",
    std: str = "sample",
    eps: float = 1e-4,
    nan: str = "raise",
    baseline: str = "group",
) -> torch.Tensor:
    """Z-score each reward within its group (or against another baseline).

    Args:
        rewards: ``[P, G]`` (P prompts, G completions each) or flat ``[P*G]``
            ordered group by group, in which case ``group_size`` is required.
        group_size: G, for flat input. If given with 2-D input it must match.
        scale: ``"group"`` divides by each group's std (GRPO), ``"batch"`` by the
            std of all rewards in the batch, ``"none"`` only subtracts the group
            mean (Dr. GRPO).
        std: ``"sample"`` (Bessel's n-1, as torch and TRL) or ``"population"``
            (n, numpy's default).
        eps: added to the std so a near-constant group cannot divide by ~0.
        nan: what a NaN reward (a completion no reward function could score)
            means. ``"raise"`` (default) refuses it. ``"skip"`` leaves it out of
            its group's mean and std, as TRL 1.16 does, and gives it advantage 0.
        baseline: ``"group"`` (the group mean, GRPO), ``"rloo"`` (the mean of
            the other members of the group) or ``"batch"`` (the mean of every
            reward in the batch, REINFORCE++); see the module docstring.
            ``"batch"`` cannot be combined with ``scale="group"``.

    Returns:
        Advantages with the same shape as ``rewards``. With a group or RLOO
        baseline, a group whose rewards are all equal gets exactly 0: it carries
        no learning signal. So does, with ``nan="skip"``, a group with fewer
        than two scorable rewards. An unscorable completion always gets 0.
    """
    _check_options(scale, std, eps, nan, baseline)
    r = as_float_tensor("rewards", rewards)
    grouped = _as_groups(r, group_size)  # [P, G]
    allowed = torch.isfinite(grouped) | (torch.isnan(grouped) if nan == "skip" else False)  # [P, G]
    if not allowed.all():
        bad = (~allowed).nonzero()[0].tolist()
        raise ValueError(
            f"rewards contain NaN or inf (first at group {bad[0]}, member {bad[1]})"
            + ("" if nan == "skip" else "; pass nan='skip' to leave unscorable (NaN) completions out")
        )
    if torch.isnan(grouped).any():
        return _advantages_skipping_nan(grouped, scale, std, eps, baseline).reshape(r.shape)
    return _advantages_all_finite(grouped, scale, std, eps, baseline).reshape(r.shape)


def _check_options(scale: str, std: str, eps: float, nan: str, baseline: str) -> None:
    """:func:`group_advantages`' keyword options: known names, a combination that makes sense, eps >= 0."""
    one_of("scale", scale, SCALES)
    one_of("std", std, STDS)
    one_of("nan", nan, NAN_POLICIES)
    one_of("baseline", baseline, BASELINES)
    if baseline == "batch" and scale == "group":
        raise ValueError(
            "baseline='batch' with scale='group' would divide batch-centred rewards by a group's std, which is 0 "
            "for a group of equal rewards; use scale='batch' (REINFORCE++) or scale='none'"
        )
    if not isinstance(eps, (int, float)) or eps < 0:
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")


def _as_groups(r: torch.Tensor, group_size: int | None) -> torch.Tensor:
    """``[P, G]`` rewards from ``[P, G]`` or flat ``[P*G]`` ones, checked: not empty, G >= 2."""
    if r.dim() == 1:
        if group_size is None:
            raise ValueError(
                f"rewards is flat with shape {tuple(r.shape)}; pass group_size=G, or reshape to [P, G]"
            )
        check_int(None, "group_size", group_size, 1)
        if r.numel() % group_size != 0:
            raise ValueError(
                f"rewards has {r.numel()} entries, which is not a multiple of group_size={group_size}"
            )
        grouped = r.view(-1, group_size)  # [P, G]
    elif r.dim() == 2:
        if group_size is not None and group_size != r.shape[1]:
            raise ValueError(
                f"group_size={group_size} does not match rewards of shape {tuple(r.shape)} (G = {r.shape[1]})"
            )
        grouped = r  # [P, G]
    else:
        raise ValueError(f"rewards must have shape [P, G] or [P*G], got shape {tuple(r.shape)}")
    if grouped.shape[0] == 0:
        raise ValueError("rewards is empty")
    G = grouped.shape[1]
    if G < 2:
        raise ValueError(
            f"group size is {G}: a group needs at least 2 completions to have a baseline (use G >= 2)"
        )
    return grouped


def _advantages_all_finite(grouped: torch.Tensor, scale: str, std: str, eps: float, baseline: str) -> torch.Tensor:
    """:func:`group_advantages` of ``[P, G]`` rewards that are all finite."""
    G = grouped.shape[1]
    unbiased = std == "sample"
    if baseline == "batch":
        centred = grouped - grouped.mean()  # [P, G]
    else:
        centred = grouped - grouped.mean(dim=1, keepdim=True)  # [P, G]
        if baseline == "rloo":
            centred = centred * (G / (G - 1))  # r_i - mean of the other G - 1
    if scale == "group":
        advantages = centred / (grouped.std(dim=1, keepdim=True, unbiased=unbiased) + eps)
    elif scale == "batch":
        advantages = centred / (grouped.std(unbiased=unbiased) + eps)
    else:  # "none": Dr. GRPO keeps the raw reward scale
        advantages = centred
    if baseline != "batch":
        # Floating-point means of equal numbers need not be exact; force exact zeros.
        constant = (grouped == grouped[:, :1]).all(dim=1)  # [P]
        advantages = advantages.masked_fill(constant[:, None], 0.0)
    return advantages  # [P, G]


def zero_std_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[P]`` True for the groups that carry no learning signal.

    A group has no signal when its scorable (non-NaN) rewards are all equal, or
    when fewer than two of them are scorable. These are exactly the groups whose
    advantages :func:`group_advantages` sets to 0.
    """
    grouped = rewards.reshape(-1, group_size)  # [P, G]
    valid = ~torch.isnan(grouped)  # [P, G]
    low = torch.where(valid, grouped, torch.full_like(grouped, math.inf)).amin(dim=1)  # [P]
    high = torch.where(valid, grouped, torch.full_like(grouped, -math.inf)).amax(dim=1)  # [P]
    return (valid.sum(dim=1) < 2) | (low == high)


def token_variance(advantages: torch.Tensor, mask: torch.Tensor) -> float:
    """The variance of a step's advantages over its real tokens: how noisy a baseline leaves the signal.

    ``advantages`` is ``[N, T]`` (per token: PPO's GAE, the Monte Carlo values'
    segments) or ``[N]`` (one per completion, GRPO's and RLOO's, which every token
    of the completion carries); ``mask`` is ``[N, T]``, 1 on the tokens that learn.
    The mean and the variance (population, divided by the n real tokens) are
    over the masked entries only; chapter 17 compares the baselines by it,
    measured before any standard deviation divides the advantages. 0 when no
    token is real.
    """
    require_tensor("advantages", advantages, floating=True)
    require_tensor("mask", mask, dim=2)
    values = advantages[:, None] if advantages.dim() == 1 else advantages  # [N, T] or [N, 1]
    if values.dim() != 2 or values.shape[0] != mask.shape[0] or values.shape[1] not in (1, mask.shape[1]):
        raise ValueError(f"advantages of shape {tuple(advantages.shape)} do not fit a mask of {tuple(mask.shape)}")
    m = mask.to(values.dtype)  # [N, T]
    n = m.sum().clamp(min=1)
    mean = (values * m).sum() / n
    return float((((values - mean) * m) ** 2).sum() / n)


def _advantages_skipping_nan(
    grouped: torch.Tensor, scale: str, std: str, eps: float, baseline: str = "group"
) -> torch.Tensor:
    """:func:`group_advantages` of ``[P, G]`` rewards where NaN marks an unscorable completion."""
    valid = ~torch.isnan(grouped)  # [P, G]
    count = valid.sum(dim=1, keepdim=True)  # [P, 1]
    values = torch.where(valid, grouped, torch.zeros_like(grouped))  # [P, G]
    mean = values.sum(dim=1, keepdim=True) / count.clamp(min=1)  # [P, 1]
    centred = torch.where(valid, grouped - mean, torch.zeros_like(grouped))  # [P, G]
    ddof = 1 if std == "sample" else 0
    # the group's std, of the rewards themselves (before RLOO's factor, as without NaN)
    group_spread = torch.sqrt((centred**2).sum(dim=1, keepdim=True) / (count - ddof).clamp(min=1))  # [P, 1]
    if baseline == "rloo":  # the mean of the other scorable members
        centred = centred * (count / (count - 1).clamp(min=1))  # [P, G]
    if scale == "group":
        advantages = centred / (group_spread + eps)  # [P, G]
    elif scale == "batch":
        kept = grouped[valid]  # [K]
        spread = kept.std(unbiased=ddof == 1) if kept.numel() > 1 else kept.new_zeros(())
        advantages = centred / (spread + eps)  # [P, G]
    else:
        advantages = centred  # [P, G]
    if baseline == "batch":
        kept = grouped[valid]  # [K]
        advantages = torch.where(valid, grouped - kept.mean(), torch.zeros_like(grouped))  # [P, G]
        if scale == "batch":
            spread = kept.std(unbiased=ddof == 1) if kept.numel() > 1 else kept.new_zeros(())
            advantages = advantages / (spread + eps)  # [P, G]
        return advantages.masked_fill(~valid, 0.0)  # [P, G]
    no_signal = zero_std_groups(grouped, grouped.shape[1])  # [P]
    return advantages.masked_fill(no_signal[:, None] | ~valid, 0.0)  # [P, G]


def normalize_then_sum(
    per_function,
    group_size: int,
    weights=None,
    *,
    std: str = "sample",
    eps: float = 1e-4,
) -> torch.Tensor:
    """GDPO's advantages: each reward function z-scored in its group, weighted, summed, then z-scored over the batch.

    For completion i of a group, with rewards ``r_ik`` from K functions,

        z_ik = (r_ik - mean_group(r_k)) / (std_group(r_k) + eps)
        s_i  = sum_k w_k * z_ik
        A_i  = (s_i - mean_batch(s)) / (std_batch(s) + eps)

    (GDPO, Liu et al. 2026; TRL 1.16's ``multi_objective_aggregation=
    "normalize_then_sum"``, which ignores ``scale_rewards``). Summing first, as
    GRPO does, lets the function with the largest spread decide the ranking
    within a group; here every function counts in units of its own spread,
    and ``w_k`` says how much.

    Args:
        per_function: ``[N, K]`` rewards (N = P*G completions, ordered group by
            group; K reward functions). NaN marks a completion a function could
            not score: it is left out of that function's group mean and std and
            contributes 0 to the sum. A completion no function could score
            gets advantage 0 and is left out of the batch statistics.
        group_size: G.
        weights: K weights (None = all 1).
        std: ``"sample"`` (Bessel, as TRL) or ``"population"``.
        eps: added to each std, as in :func:`group_advantages`.

    Returns:
        ``[N]`` advantages. A group in which every function gave all its
        (scorable) members the same reward, or scored fewer than two of them,
        carries no signal and gets exactly 0, as in :func:`group_advantages`.
    """
    one_of("std", std, STDS)
    if not isinstance(eps, (int, float)) or eps < 0:
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")
    r = as_float_tensor("per_function", per_function)
    if r.dim() != 2:
        raise ValueError(f"per_function must have shape [N, K] (completions x reward functions), got {tuple(r.shape)}")
    n, k = r.shape
    check_int(None, "group_size", group_size, 2, hint="; a group needs a baseline")
    if n == 0 or n % group_size != 0:
        raise ValueError(f"per_function has {n} rows, which is not a positive multiple of group_size={group_size}")
    w = torch.ones(k, dtype=r.dtype) if weights is None else as_float_tensor("weights", weights).to(r.dtype)
    if w.shape != (k,):
        raise ValueError(f"weights has {w.numel()} entries but per_function has {k} reward functions (columns)")
    if torch.isinf(r).any():
        raise ValueError("per_function contains inf; a reward must be a finite number, or NaN for 'cannot score'")
    ddof = 1 if std == "sample" else 0

    grouped = r.view(-1, group_size, k)  # [P, G, K]
    valid = ~torch.isnan(grouped)  # [P, G, K]
    count = valid.sum(dim=1, keepdim=True)  # [P, 1, K]
    values = torch.where(valid, grouped, torch.zeros_like(grouped))  # [P, G, K]
    mean = values.sum(dim=1, keepdim=True) / count.clamp(min=1)  # [P, 1, K]
    centred = torch.where(valid, grouped - mean, torch.zeros_like(grouped))  # [P, G, K]
    spread = torch.sqrt((centred**2).sum(dim=1, keepdim=True) / (count - ddof).clamp(min=1))  # [P, 1, K]
    # a function with fewer than two scorable members, or all of them equal, adds nothing to its group
    low = torch.where(valid, grouped, torch.full_like(grouped, math.inf)).amin(dim=1, keepdim=True)  # [P, 1, K]
    high = torch.where(valid, grouped, torch.full_like(grouped, -math.inf)).amax(dim=1, keepdim=True)  # [P, 1, K]
    silent = (count < 2) | (low == high)  # [P, 1, K]
    z = (centred / (spread + eps)).masked_fill(silent, 0.0)  # [P, G, K]
    summed = (z * w).sum(dim=2).reshape(n)  # [N]

    scorable = valid.any(dim=2).reshape(n)  # [N]
    kept = summed[scorable]  # [M]
    if kept.numel() > 1:
        centre = kept.mean()
        scale = torch.sqrt(((kept - centre) ** 2).sum() / max(kept.numel() - ddof, 1))
    else:
        centre, scale = summed.new_zeros(()), summed.new_zeros(())
    advantages = (summed - centre) / (scale + eps)  # [N]
    no_signal = silent.all(dim=2).expand(-1, group_size).reshape(n)  # [N]
    return advantages.masked_fill(no_signal | ~scorable, 0.0)

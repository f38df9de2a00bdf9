"""Chapter 5's tools for checking the KL estimators of :mod:`grpo_tutorial.kl`.

None of these is needed to train. They compute what the estimators k1, k2 and k3
(:func:`grpo_tutorial.kl.kl_estimate`) are compared against in chapter 5: the exact
KL of two Gaussians or two categorical distributions, the bias and spread of each
estimator over samples, the exact expected gradient a penalty sends to the logits,
and the closed-form optimum of the KL-regularised objective.
"""

from __future__ import annotations

import torch

from grpo_tutorial._checks import one_of, require_tensor
from grpo_tutorial.kl import KL_KINDS, kl_estimate
from grpo_tutorial.objectives import importance_weighted_kl

PENALTY_FORMS = ("k1", "k2", "k3", "k3_ratio", "k1_reward")


def _positive(name: str, value) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.float64) if not isinstance(value, torch.Tensor) else value
    if not t.is_floating_point():
        t = t.double()
    if not bool(torch.all(t > 0)):
        raise ValueError(f"{name} must be > 0 (a standard deviation), got {value!r}")
    return t


def gaussian_kl(mu_q, sigma_q, mu_p, sigma_p) -> torch.Tensor:
    """Exact KL(N(mu_q, sigma_q^2) || N(mu_p, sigma_p^2)) in nats.

    The first distribution is the one samples come from (pi_theta in GRPO, Schulman's q);
    the second is the one it is compared with (pi_ref, Schulman's p)::

        KL = log(sigma_p / sigma_q) + (sigma_q^2 + (mu_q - mu_p)^2) / (2 sigma_p^2) - 1/2

    Arguments may be floats or tensors (they broadcast); the result is a float64 tensor
    unless tensors of another float dtype are passed.
    """
    sq = _positive("sigma_q", sigma_q)
    sp = _positive("sigma_p", sigma_p)
    mq = torch.as_tensor(mu_q, dtype=sq.dtype)
    mp = torch.as_tensor(mu_p, dtype=sq.dtype)
    return torch.log(sp / sq) + (sq**2 + (mq - mp) ** 2) / (2 * sp**2) - 0.5


def _check_normalised(name: str, logp: torch.Tensor, dim: int) -> None:
    total = torch.logsumexp(logp.detach().double(), dim=dim)  # [...], log of the total mass
    tol = 1e-2 if logp.dtype in (torch.float16, torch.bfloat16) else 1e-3
    worst = total.abs().max().item()
    if not worst <= tol:  # also catches NaN
        raise ValueError(
            f"{name} must hold log-probabilities that sum to 1 along dim {dim} (use log_softmax, "
            f"not raw logits); the log of the total mass is off by up to {worst:.3g}"
        )


def _check_vocab_pair(name: str, values: torch.Tensor, ref_logp: torch.Tensor) -> None:
    """``values`` and ``ref_logp``: float tensors of one shape with a vocabulary dimension."""
    require_tensor(name, values, floating=True)
    require_tensor("ref_logp", ref_logp, floating=True)
    if values.shape != ref_logp.shape:
        raise ValueError(f"ref_logp has shape {tuple(ref_logp.shape)} but {name} has {tuple(values.shape)}")
    if values.dim() == 0:
        raise ValueError(f"{name} must have a vocabulary dimension, got a 0-d tensor")


def categorical_kl(logp: torch.Tensor, ref_logp: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Exact KL(pi || pi_ref) = sum_v pi(v) (log pi(v) - log pi_ref(v)) over the vocabulary.

    Args:
        logp: full log-probability vectors of pi, e.g. ``[N, T, V]`` from ``log_softmax``.
        ref_logp: the reference's log-probabilities, same shape.
        dim: the vocabulary dimension.

    Returns:
        The KL with ``dim`` summed out, e.g. ``[N, T]``. Entries where pi(v) = 0 add
        nothing; an entry where pi(v) > 0 but pi_ref(v) = 0 makes the KL infinite.
        Differentiable in both arguments.
    """
    _check_vocab_pair("logp", logp, ref_logp)
    _check_normalised("logp", logp, dim)
    _check_normalised("ref_logp", ref_logp, dim)
    p = logp.exp()  # [..., V]
    # Tokens pi never picks (log pi = -inf) add 0. Replace their log-ratio before the
    # product, so neither the value nor the gradient meets 0 * inf = NaN.
    log_ratio = torch.where(p > 0, logp - ref_logp, torch.zeros_like(p))  # [..., V]
    return (p * log_ratio).sum(dim=dim)


def estimator_stats(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    true_kl: float,
    kinds: tuple[str, ...] = KL_KINDS,
) -> dict[str, dict[str, float]]:
    """Bias and spread of each estimator over samples, against a known true KL.

    Args:
        logp: log pi(x_i) of samples x_i drawn from pi (Schulman's q), any shape.
        ref_logp: log pi_ref(x_i) of the same samples (Schulman's p).
        true_kl: the exact KL(pi || pi_ref), > 0.
        kinds: which of ``"k1"``, ``"k2"``, ``"k3"`` to evaluate.

    Returns:
        ``{kind: {"mean", "bias", "std", "stderr", "rel_bias", "rel_std"}}`` as floats:
        the sample mean of the single-sample estimates, its bias (mean - true_kl), their
        standard deviation, the standard error of the mean, and bias and std divided by
        ``true_kl`` (the two columns of Schulman's table). Computed in float64.
    """
    require_tensor("logp", logp, floating=True)
    require_tensor("ref_logp", ref_logp, floating=True)
    if logp.shape != ref_logp.shape:
        raise ValueError(f"ref_logp has shape {tuple(ref_logp.shape)} but logp has {tuple(logp.shape)}")
    n = logp.numel()
    if n < 2:
        raise ValueError(f"logp must hold at least 2 samples to measure a spread, got {n}")
    if isinstance(true_kl, bool) or not isinstance(true_kl, (int, float)):
        raise TypeError(f"true_kl must be a float, got {type(true_kl).__name__}")
    if not (true_kl > 0 and true_kl < float("inf")):
        raise ValueError(f"true_kl must be a finite number > 0, got {true_kl!r}")
    if isinstance(kinds, str) or len(kinds) == 0:
        raise ValueError(f"kinds must be a non-empty tuple of names from {KL_KINDS}, got {kinds!r}")
    for kind in kinds:
        one_of("kinds entry", kind, KL_KINDS)
    lp, rp = logp.detach().reshape(-1).double(), ref_logp.detach().reshape(-1).double()  # [n]
    out: dict[str, dict[str, float]] = {}
    for kind in kinds:
        k = kl_estimate(lp, rp, kind)  # [n]
        mean, std = k.mean().item(), k.std().item()
        out[kind] = {
            "mean": mean,
            "bias": mean - true_kl,
            "std": std,
            "stderr": std / n**0.5,
            "rel_bias": (mean - true_kl) / true_kl,
            "rel_std": std / true_kl,
        }
    return out


def expected_penalty_grad(logits: torch.Tensor, ref_logp: torch.Tensor, form: str = "k3") -> torch.Tensor:
    """The average gradient a KL penalty sends to the logits, over every token pi could sample.

    In training, a penalty is evaluated on sampled tokens and backpropagated with the
    samples held fixed. This function takes the exact expectation of that gradient
    over x ~ pi = softmax(logits), by weighting each vocabulary entry with its
    (detached) probability, instead of sampling. ``form`` says how the penalty
    enters, per sampled token x with log r = log pi_ref(x) - log pi(x):

    * ``"k1"``, ``"k2"``, ``"k3"``: the estimator added to the loss
      (GRPO adds ``"k3"``);
    * ``"k3_ratio"``: k3 multiplied by the importance ratio pi / pi_old, evaluated
      on-policy (pi_old = pi, detached), as TRL does when ``use_bias_correction_kl``
      is on;
    * ``"k1_reward"``: the penalty folded into the reward (PPO-RLHF): the term
      ``-A * log pi(x)`` with the detached advantage ``A = -k1(x)`` (beta = 1, no
      baseline).

    Args:
        logits: ``[..., V]`` the policy's logits (the variables differentiated).
        ref_logp: ``[..., V]`` the reference's log-probabilities (held fixed).
        form: one of ``PENALTY_FORMS``.

    Returns:
        ``[..., V]``: d E_x[penalty term] / d logits, for beta = 1.
    """
    one_of("form", form, PENALTY_FORMS)
    _check_vocab_pair("logits", logits, ref_logp)
    _check_normalised("ref_logp", ref_logp, -1)
    z = logits.detach().clone().requires_grad_(True)  # [..., V]
    logp = torch.log_softmax(z, dim=-1)  # [..., V], every token x of the vocabulary
    weight = logp.detach().exp()  # [..., V], how often x is sampled (no gradient)
    ref = ref_logp.detach()
    if form in KL_KINDS:
        term = kl_estimate(logp, ref, form)  # [..., V]
    elif form == "k3_ratio":
        ratio = torch.exp(logp - logp.detach())  # [..., V], value 1, gradient d log pi
        term = importance_weighted_kl(kl_estimate(logp, ref, "k3"), ratio)  # the package's use_bias_correction_kl
    else:  # "k1_reward"
        advantage = -kl_estimate(logp, ref, "k1").detach()  # [..., V], reward -k1, no gradient
        term = -advantage * logp
    (grad,) = torch.autograd.grad((weight * term).sum(), z)
    return grad


def kl_regularized_optimum(ref_logp: torch.Tensor, rewards: torch.Tensor, beta: float) -> torch.Tensor:
    """Log-probabilities of the policy that maximises E_pi[r] - beta * KL(pi || pi_ref).

    For one prompt with a finite set of answers, the maximiser is known in closed form,
    pi*(y) proportional to pi_ref(y) * exp(r(y) / beta): every unit of extra reward
    multiplies an answer's odds against the reference by exp(1 / beta).

    Args:
        ref_logp: ``[..., K]`` log pi_ref over K answers (normalised).
        rewards: ``[..., K]`` the reward of each answer.
        beta: the KL coefficient, > 0.

    Returns:
        ``[..., K]`` log pi*.
    """
    require_tensor("ref_logp", ref_logp, floating=True)
    rewards = require_tensor("rewards", rewards, floating=True)
    if ref_logp.shape != rewards.shape:
        raise ValueError(f"rewards has shape {tuple(rewards.shape)} but ref_logp has {tuple(ref_logp.shape)}")
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not (0 < beta < float("inf")):
        raise ValueError(f"beta must be a finite number > 0, got {beta!r}")
    _check_normalised("ref_logp", ref_logp, -1)
    return torch.log_softmax(ref_logp + rewards / beta, dim=-1)

"""Chapter 1's toy problem: policy gradients on a contextual multi-armed bandit.

The bandit is GRPO with everything but the idea removed. There are P "prompts"
(contexts). For each prompt the policy picks one of K "answers" (arms) from a
softmax over a row of logits, and the answer earns a 0/1 reward that is 1 with a
fixed success probability. A GRPO-style batch draws ``prompts_per_step`` prompts
and G answers to each, so rewards come as ``[B, G]`` groups, exactly like the
completions of a language model.

Because the policy is just a ``[P, K]`` table of logits, the true gradient of the
expected reward is known in closed form. That lets the chapter (and the tests)
check each policy-gradient estimator against the truth:

* ``"none"``: REINFORCE, advantage = reward.
* ``"batch_mean"``: reward minus the mean reward of the whole batch.
* ``"value"``: reward minus the prompt's true expected reward, which is what a
  perfect critic (PPO's learned value function) would predict.
* ``"group_mean"``: reward minus the mean of its group (Dr. GRPO's advantage).
* ``"group_zscore"``: GRPO's advantage, the group z-score
  (``grpo_tutorial.group_advantages``).

Every function is pure: randomness enters only through an explicit
``torch.Generator``, and the training loop takes its settings from
:class:`BanditConfig`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpo_tutorial._checks import check_int, check_number, one_of, require_tensor
from grpo_tutorial.advantages import group_advantages
from grpo_tutorial.loss import sequence_logprob_loss

BASELINES = ("none", "batch_mean", "value", "group_mean", "group_zscore")


# ---------------------------------------------------------------- checks


def _check_logits(logits) -> torch.Tensor:
    """logits is one policy [P, K] or a stack of R policies [R, P, K]."""
    require_tensor("logits", logits, floating=True)
    if logits.dim() not in (2, 3):
        raise ValueError(f"logits must have shape [P, K] or [R, P, K], got shape {tuple(logits.shape)}")
    return logits


def _check_bandit(logits: torch.Tensor, success_probs: torch.Tensor) -> None:
    """logits is [P, K] or [R, P, K]; success_probs is [P, K] with entries in [0, 1]."""
    _check_logits(logits)
    require_tensor("success_probs", success_probs, dim=2, floating=True)
    if logits.shape[-2:] != success_probs.shape:
        raise ValueError(
            f"logits has shape {tuple(logits.shape)} but success_probs has {tuple(success_probs.shape)}; "
            "expected one logit per (prompt, arm)"
        )
    if not ((success_probs >= 0) & (success_probs <= 1)).all():
        raise ValueError("success_probs must lie in [0, 1] (they are Bernoulli reward probabilities)")


# ---------------------------------------------------------------- the environment


def make_bandit(num_prompts: int = 8, num_arms: int = 10, *, seed: int = 0) -> torch.Tensor:
    """Success probabilities ``[P, K]`` of a bandit with easy and hard prompts.

    Prompt p gets a difficulty offset that runs evenly from easy (first prompt)
    to hard (last prompt); each arm adds its own Gaussian noise, and a sigmoid
    turns the sum into a probability. Under a uniform policy the easy prompts
    succeed often and the hard ones rarely, which is the spread of difficulty a
    GRPO batch of real prompts has.
    """
    check_int(None, "num_prompts", num_prompts, 1)
    check_int(None, "num_arms", num_arms, 2)
    check_int(None, "seed", seed, 0)
    gen = torch.Generator().manual_seed(seed)
    offset = torch.linspace(3.0, -4.0, num_prompts)[:, None] if num_prompts > 1 else torch.zeros(1, 1)  # [P, 1]
    noise = 1.5 * torch.randn(num_prompts, num_arms, generator=gen)  # [P, K]
    return torch.sigmoid(offset + noise)  # [P, K]


def policy_probs(logits: torch.Tensor) -> torch.Tensor:
    """The softmax policy: row p is the distribution over arms for prompt p.

    ``[P, K]`` in, ``[P, K]`` out; a stack of R policies ``[R, P, K]`` works too.
    """
    return torch.softmax(_check_logits(logits), dim=-1)  # [(R,) P, K]


def prompt_success_rates(logits: torch.Tensor, success_probs: torch.Tensor) -> torch.Tensor:
    """J_p = sum_k pi(k | p) mu_pk, the expected reward of each prompt. ``[P]`` (or ``[R, P]``)."""
    _check_bandit(logits, success_probs)
    return (policy_probs(logits) * success_probs).sum(dim=-1)  # [(R,) P]


def expected_reward(logits: torch.Tensor, success_probs: torch.Tensor) -> torch.Tensor:
    """J = mean_p J_p, the objective: a differentiable scalar (or ``[R]`` for R policies)."""
    return prompt_success_rates(logits, success_probs).mean(dim=-1)  # [] or [R]


def exact_gradient(logits: torch.Tensor, success_probs: torch.Tensor) -> torch.Tensor:
    """The true gradient dJ/dlogits in closed form. ``[P, K]`` (or ``[R, P, K]``).

    For a softmax, d pi_k / d z_j = pi_k (1[k = j] - pi_j), so
    dJ/dz_pk = (1/P) pi_pk (mu_pk - J_p): an arm is pushed up exactly when it is
    better than the policy's current average for that prompt.
    """
    _check_bandit(logits, success_probs)
    pi = policy_probs(logits)  # [(R,) P, K]
    j_p = (pi * success_probs).sum(dim=-1, keepdim=True)  # [(R,) P, 1]
    return pi * (success_probs - j_p) / success_probs.shape[0]  # [(R,) P, K]


# ---------------------------------------------------------------- sampling


def sample_batches(
    logits: torch.Tensor,
    success_probs: torch.Tensor,
    *,
    num_batches: int,
    prompts_per_step: int,
    group_size: int,
    generator: torch.Generator,
    reward_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw M independent GRPO-style batches at once.

    ``logits`` is one policy ``[P, K]`` that every batch samples from, or one
    policy per batch ``[M, P, K]`` (M training runs side by side). Each batch
    takes ``prompts_per_step`` distinct prompts uniformly at random (B of the P,
    without replacement), samples G arms per prompt from the policy, and draws a
    0/1 reward for each, plus ``reward_offset`` (a constant added to every
    reward, to show what it does to each estimator).

    Returns:
        ``(prompts [M, B], actions [M, B, G], rewards [M, B, G])``.
    """
    _check_bandit(logits, success_probs)
    M = check_int(None, "num_batches", num_batches, 1)
    B = check_int(None, "prompts_per_step", prompts_per_step, 1)
    G = check_int(None, "group_size", group_size, 1)
    offset = check_number(None, "reward_offset", reward_offset, lambda v: True, "a finite number")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    P = success_probs.shape[0]
    if B > P:
        raise ValueError(f"prompts_per_step={B} exceeds the number of prompts P={P}")
    if logits.dim() == 3 and logits.shape[0] != M:
        raise ValueError(f"logits holds {logits.shape[0]} policies but num_batches={M}; expected one per batch")
    with torch.no_grad():
        # A random subset of B prompts per batch: argsort of uniform noise is a random permutation.
        prompts = torch.rand(M, P, generator=generator).argsort(dim=1)[:, :B]  # [M, B]
        pi = policy_probs(logits.detach()).expand(M, P, -1)  # [M, P, K]
        probs = pi[torch.arange(M)[:, None], prompts]  # [M, B, K]
        actions = torch.multinomial(
            probs.reshape(M * B, -1), G, replacement=True, generator=generator
        ).reshape(M, B, G)  # [M, B, G]
        mu = success_probs[prompts[..., None], actions]  # [M, B, G]
        rewards = torch.bernoulli(mu, generator=generator) + offset  # [M, B, G]
    return prompts, actions, rewards


# ---------------------------------------------------------------- estimators


def bandit_advantages(
    rewards: torch.Tensor, baseline: str, values: torch.Tensor | None = None
) -> torch.Tensor:
    """Turn rewards ``[M, B, G]`` (M batches of B groups of G) into advantages ``[M, B, G]``.

    * ``"none"``: the reward itself (REINFORCE without a baseline).
    * ``"batch_mean"``: reward minus the mean over its whole batch (all B*G samples).
    * ``"value"``: reward minus ``values`` ``[M, B]``, one number per prompt
      that does not depend on the samples (a critic's prediction).
    * ``"group_mean"``: reward minus its group's mean
      (``group_advantages(..., scale="none")``, Dr. GRPO).
    * ``"group_zscore"``: GRPO's z-score (``group_advantages(...)`` defaults).

    The sample means include the sample itself, which scales the expected
    gradient by (1 - 1/N), N the number of samples averaged; see
    :func:`expected_gradient`.
    """
    one_of("baseline", baseline, BASELINES)
    require_tensor("rewards", rewards, dim=3, floating=True)
    M, B, G = rewards.shape
    if baseline == "value":
        if values is None:
            raise ValueError('baseline="value" needs values [M, B], one predicted reward per prompt')
        require_tensor("values", values, dim=2, floating=True)
        if values.shape != (M, B):
            raise ValueError(f"values must have shape [M, B] = {(M, B)}, got {tuple(values.shape)}")
        return rewards - values[..., None]  # [M, B, G]
    if values is not None:
        raise ValueError(f'values is only used with baseline="value", got baseline={baseline!r}')
    if baseline == "none":
        return rewards.clone()  # [M, B, G]
    if baseline == "batch_mean":
        return rewards - rewards.mean(dim=(1, 2), keepdim=True)  # [M, B, G]
    scale = "none" if baseline == "group_mean" else "group"
    return group_advantages(rewards.reshape(M * B, G), scale=scale).reshape(M, B, G)  # [M, B, G]


def _advantages(
    logits: torch.Tensor,
    success_probs: torch.Tensor,
    prompts: torch.Tensor,
    rewards: torch.Tensor,
    baseline: str,
    reward_offset: float,
) -> torch.Tensor:
    """bandit_advantages, with the perfect critic's values filled in for ``"value"``."""
    values = None
    if baseline == "value":
        with torch.no_grad():
            rates = prompt_success_rates(logits.detach(), success_probs)  # [(M,) P]
            rates = rates.expand(prompts.shape[0], -1)  # [M, P]
            values = rates.gather(1, prompts) + reward_offset  # [M, B]
    return bandit_advantages(rewards, baseline, values)


def policy_gradient_loss(
    logits: torch.Tensor,
    prompts: torch.Tensor,
    actions: torch.Tensor,
    advantages: torch.Tensor,
) -> torch.Tensor:
    """-mean(A * log pi(a | p)) over every sample of every batch, via ``sequence_logprob_loss``.

    ``logits`` is ``[P, K]`` (one policy for all batches) or ``[M, P, K]`` (one
    copy per batch, so that a single backward pass gives each batch's own
    gradient in ``logits.grad[m]``). The loss is scaled by M so that
    ``d loss / d logits[m]`` is batch m's loss gradient, not 1/M of it; with
    ``[P, K]`` logits and M > 1 the gradient is therefore the sum of the M
    batches' gradients.
    An action is a one-token completion, so its sequence log-prob is just
    ``log_softmax(logits)[p, a]``.
    """
    require_tensor("prompts", prompts, dim=2, floating=False)
    require_tensor("actions", actions, dim=3, floating=False)
    require_tensor("advantages", advantages, dim=3, floating=True)
    require_tensor("logits", logits, floating=True)
    if actions.shape != advantages.shape or actions.shape[:2] != prompts.shape:
        raise ValueError(
            f"expected prompts [M, B], actions and advantages [M, B, G]; got prompts {tuple(prompts.shape)}, "
            f"actions {tuple(actions.shape)}, advantages {tuple(advantages.shape)}"
        )
    M = prompts.shape[0]
    if logits.dim() == 2:
        logits = logits.expand(M, *logits.shape)  # [M, P, K], a view: gradients add up
    elif logits.dim() != 3 or logits.shape[0] != M:
        raise ValueError(f"logits must be [P, K] or [M={M}, P, K], got shape {tuple(logits.shape)}")
    logp = torch.log_softmax(logits, dim=-1)  # [M, P, K]
    batch_index = torch.arange(M)[:, None, None]  # [M, 1, 1]
    seq_logp = logp[batch_index, prompts[..., None], actions]  # [M, B, G]
    return M * sequence_logprob_loss(seq_logp.reshape(-1), advantages.reshape(-1))


def gradient_samples(
    logits: torch.Tensor,
    success_probs: torch.Tensor,
    *,
    baseline: str,
    num_batches: int,
    prompts_per_step: int,
    group_size: int,
    seed: int = 0,
    reward_offset: float = 0.0,
) -> torch.Tensor:
    """M independent one-batch estimates of the ascent direction at fixed ``logits``. ``[M, P, K]``.

    Each is minus the gradient of :func:`policy_gradient_loss` on one fresh batch,
    i.e. what one training step would move along. All M are computed with a
    single backward pass over M copies of the logits.
    """
    one_of("baseline", baseline, BASELINES)
    require_tensor("logits", logits, dim=2, floating=True)
    check_int(None, "seed", seed, 0)
    gen = torch.Generator().manual_seed(seed)
    prompts, actions, rewards = sample_batches(
        logits,
        success_probs,
        num_batches=num_batches,
        prompts_per_step=prompts_per_step,
        group_size=group_size,
        generator=gen,
        reward_offset=reward_offset,
    )
    advantages = _advantages(logits, success_probs, prompts, rewards, baseline, reward_offset)  # [M, B, G]
    copies = logits.detach().expand(num_batches, *logits.shape).clone().requires_grad_(True)  # [M, P, K]
    loss = policy_gradient_loss(copies, prompts, actions, advantages)
    (grad,) = torch.autograd.grad(loss, copies)  # [M, P, K]
    return -grad  # ascent direction


def zscore_gradient_weight(
    success_rate: float, group_size: int, *, std: str = "sample", eps: float = 1e-4
) -> float:
    """How much GRPO's z-score scales the true gradient of a prompt with 0/1 rewards.

    For one prompt with success rate J (under the current policy), the expected
    z-score estimator equals ``w(J) * dJ_p/dlogits`` exactly: the direction within
    the prompt is right, but the length depends on J. Conditioned on its own
    reward, a sample's advantage depends only on how many of the other G - 1
    samples succeeded, which is Binomial(G - 1, J); so
    w(J) = E[A | own reward 1] - E[A | own reward 0], computed here by summing
    over that binomial with the advantages taken from ``group_advantages``.
    For comparison, the group-mean baseline has w = 1 - 1/G for every J.
    """
    J = check_number(None, "success_rate", success_rate, lambda v: 0 <= v <= 1, "a number in [0, 1]")
    G = check_int(None, "group_size", group_size, 2)
    m = torch.arange(G, dtype=torch.float64)  # [G]: how many of the others succeeded
    others = (torch.arange(G - 1)[None, :] < m[:, None]).double()  # [G, G-1], row m has m ones
    right = torch.cat([torch.ones(G, 1, dtype=torch.float64), others], dim=1)  # [G, G]
    wrong = torch.cat([torch.zeros(G, 1, dtype=torch.float64), others], dim=1)  # [G, G]
    gap = (
        group_advantages(right, std=std, eps=eps)[:, 0] - group_advantages(wrong, std=std, eps=eps)[:, 0]
    )  # [G]
    pmf = torch.tensor(
        [math.comb(G - 1, k) * J**k * (1 - J) ** (G - 1 - k) for k in range(G)], dtype=torch.float64
    )  # [G]
    return float((pmf * gap).sum())


def expected_gradient(
    logits: torch.Tensor,
    success_probs: torch.Tensor,
    *,
    baseline: str,
    prompts_per_step: int,
    group_size: int,
) -> torch.Tensor:
    """The exact expectation of :func:`gradient_samples` for 0/1 rewards. ``[P, K]``.

    * ``"none"`` and ``"value"``: the true gradient (REINFORCE is unbiased, and
      a baseline that does not depend on the sample itself changes nothing).
    * ``"batch_mean"``: (1 - 1/N) times it, N = B*G, because the mean includes
      the sample's own reward; any other sample's reward is independent of it
      and drops out.
    * ``"group_mean"``: (1 - 1/G) times it, for the same reason.
    * ``"group_zscore"``: prompt p's row times :func:`zscore_gradient_weight`
      of that prompt's success rate. Not proportional to the true gradient:
      prompts are reweighted by how easy they currently are.

    None of this depends on ``reward_offset``: every baseline subtracts it away,
    and without a baseline E[c * grad log pi] = 0.
    """
    one_of("baseline", baseline, BASELINES)
    require_tensor("logits", logits, dim=2, floating=True)
    B = check_int(None, "prompts_per_step", prompts_per_step, 1)
    G = check_int(None, "group_size", group_size, 1)
    true = exact_gradient(logits, success_probs)  # [P, K]
    if B > logits.shape[0]:
        raise ValueError(f"prompts_per_step={B} exceeds the number of prompts P={logits.shape[0]}")
    if baseline in ("none", "value"):
        return true
    if baseline == "batch_mean":
        return (1 - 1 / (B * G)) * true
    if G < 2:
        raise ValueError(f"group_size must be >= 2 for a group baseline, got {G}")
    if baseline == "group_mean":
        return (1 - 1 / G) * true
    rates = prompt_success_rates(logits, success_probs)  # [P]
    weights = torch.tensor([zscore_gradient_weight(float(j), G) for j in rates], dtype=true.dtype)  # [P]
    return weights[:, None] * true  # [P, K]


def gradient_stats(samples: torch.Tensor, true_gradient: torch.Tensor) -> dict[str, float]:
    """Summaries of M gradient estimates ``[M, P, K]`` against the true gradient ``[P, K]``.

    * ``mean_norm``: |mean of the estimates|.
    * ``variance``: E|g - mean|^2, the total variance summed over all parameters.
    * ``relative_variance``: variance / mean_norm^2, which does not change if an
      estimator is multiplied by a constant (fair across advantage scales).
    * ``cos_mean``: cosine between the mean estimate and the true gradient.
    * ``cos_single``: the average cosine between ONE batch's estimate and the
      true gradient, i.e. how well a single step points uphill.
    """
    require_tensor("samples", samples, dim=3, floating=True)
    require_tensor("true_gradient", true_gradient, dim=2, floating=True)
    if samples.shape[1:] != true_gradient.shape:
        raise ValueError(
            f"samples has shape {tuple(samples.shape)}; expected [M, {', '.join(map(str, true_gradient.shape))}]"
        )
    if samples.shape[0] < 2:
        raise ValueError(f"need at least 2 samples to measure a variance, got {samples.shape[0]}")
    flat = samples.reshape(samples.shape[0], -1).double()  # [M, P*K]
    true = true_gradient.reshape(-1).double()  # [P*K]
    mean = flat.mean(dim=0)  # [P*K]
    variance = flat.var(dim=0).sum()  # unbiased (M - 1) per coordinate
    cos_single = torch.nn.functional.cosine_similarity(flat, true[None, :], dim=1)  # [M]
    return {
        "mean_norm": float(mean.norm()),
        "variance": float(variance),
        "relative_variance": float(variance / mean.norm() ** 2),
        "cos_mean": float(torch.nn.functional.cosine_similarity(mean, true, dim=0)),
        "cos_single": float(cos_single.mean()),
    }


# ---------------------------------------------------------------- training


@dataclass(frozen=True)
class BanditConfig:
    """Settings of one bandit training run (plain SGD on the logits).

    Attributes:
        baseline: one of ``BASELINES``.
        group_size: G, samples per prompt.
        prompts_per_step: B, prompts per batch (at most the number of prompts).
        learning_rate: SGD step size on the logits.
        steps: number of updates.
        seed: seeds the sampling; the same seed gives the same runs.
        reward_offset: constant added to every reward.
        runs: how many independent runs to train side by side (they share
            one random stream, so each run differs from the others).
    """

    baseline: str = "group_zscore"
    group_size: int = 8
    prompts_per_step: int = 4
    learning_rate: float = 2.0
    steps: int = 200
    seed: int = 0
    reward_offset: float = 0.0
    runs: int = 1

    def __post_init__(self) -> None:
        one_of("baseline", self.baseline, BASELINES)
        check_int(None, "group_size", self.group_size, 1)
        check_int(None, "prompts_per_step", self.prompts_per_step, 1)
        check_int(None, "steps", self.steps, 1)
        check_int(None, "runs", self.runs, 1)
        check_int(None, "seed", self.seed, 0)
        check_number(None, "reward_offset", self.reward_offset, lambda v: True, "a finite number")
        check_number(None, "learning_rate", self.learning_rate, lambda v: v > 0, "a number > 0")
        if self.baseline in ("group_mean", "group_zscore") and self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for baseline={self.baseline!r}, got {self.group_size}")


def train_bandit(
    success_probs: torch.Tensor, config: BanditConfig, init_logits: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Train ``config.runs`` softmax policies with SGD, each on its own fresh batch per step.

    Every run starts from ``init_logits`` ``[P, K]`` (default: all zeros, the
    uniform policy). The runs are independent; training them as one ``[R, P, K]``
    tensor only saves time.

    Returns:
        ``{"expected_reward": [R, steps + 1], "logits": [R, P, K]}``: the exact
        expected reward J of each run before every step and after the last, and
        the final logits.
    """
    if not isinstance(config, BanditConfig):
        raise TypeError(f"config must be a BanditConfig, got {type(config).__name__}")
    start = torch.zeros_like(success_probs) if init_logits is None else init_logits.detach()
    require_tensor("init_logits", start, dim=2, floating=True)
    _check_bandit(start, success_probs)
    R = config.runs
    logits = start.expand(R, *start.shape).clone()  # [R, P, K]
    gen = torch.Generator().manual_seed(config.seed)
    curve = [expected_reward(logits, success_probs)]  # [R] per entry
    for _ in range(config.steps):
        prompts, actions, rewards = sample_batches(
            logits,
            success_probs,
            num_batches=R,
            prompts_per_step=config.prompts_per_step,
            group_size=config.group_size,
            generator=gen,
            reward_offset=config.reward_offset,
        )  # [R, B], [R, B, G], [R, B, G]
        advantages = _advantages(
            logits, success_probs, prompts, rewards, config.baseline, config.reward_offset
        )  # [R, B, G]
        params = logits.requires_grad_(True)  # [R, P, K]
        loss = policy_gradient_loss(params, prompts, actions, advantages)  # sum of the R runs' losses
        (grad,) = torch.autograd.grad(loss, params)  # [R, P, K], run r's own gradient in row r
        logits = (params - config.learning_rate * grad).detach()  # plain SGD, descending the loss
        curve.append(expected_reward(logits, success_probs))
    return {"expected_reward": torch.stack(curve, dim=1), "logits": logits}

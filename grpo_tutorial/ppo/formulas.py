"""PPO's formulas, the ones GRPO drops with its critic (chapter 17), and PPO's settings.

GRPO gives every token of a completion the same advantage, its reward against
its group's. PPO as RLHF used it (InstructGPT; TRL's old ``PPOTrainer``) learns
a value model V instead, the expected reward from each prefix of a completion,
and gives each token its own advantage with GAE (Schulman et al., 2016):

    delta_t = r_t + gamma * V_{t+1} - V_t            (V after the last token = 0: the episode ends)
    A_t     = sum_{l >= 0} (gamma * lambda)^l * delta_{t+l}
    R_t     = A_t + V_t                               (the value model's target, the "returns")

Here the reward is terminal: the completion's score on its last real token, 0
elsewhere (:func:`token_rewards`); with ``kl_in_reward`` each token's reward
also carries ``-beta * KL_t`` to the reference, as InstructGPT and TRL's old
trainer did (then the loss has no KL term), instead of the KL term GRPO keeps in
its loss. With gamma = lambda = 1, A_t = (the sum of the rewards from t on) - V_t:
the Monte Carlo return minus the value.

* :func:`gae`: the advantages and returns, ``[N, T]``, over the masked tokens.
* :func:`whiten`: the advantages normalised over the batch's masked tokens
  (TRL's old ``masked_whiten``: mean and Bessel-corrected variance over the real
  tokens; the mean is *removed*, ``shift_mean=True``, as its PPO trainer did).
* :func:`value_loss`: 0.5 * (V - R)^2, a masked mean; with ``cliprange_value``
  the larger of that and the error of the value clipped to within
  ``cliprange_value`` of the value at sampling time. The clip is OpenAI
  baselines' ``ppo2`` and TRL's old ``cliprange_value``, not the PPO paper's:
  Schulman et al. (2017), eq. 9, use the plain squared error L^VF = (V - V^targ)^2.
* :func:`explained_variance`: 1 - Var(R - V) / Var(R) over the masked tokens,
  how much of the returns' spread the value model accounts for (1 perfect, 0 no
  better than a constant, negative worse).

:class:`PPOSettings` holds PPO's own settings; :func:`check_critic_config`
refuses the :class:`~grpo_tutorial.config.GRPOConfig` settings that assume there
is no critic (:data:`NO_CRITIC_SETTINGS` names each, with the reason). The value
model is :mod:`grpo_tutorial.ppo.critic`'s, the step :mod:`grpo_tutorial.ppo.step`'s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from .._checks import check_choice, check_flag, check_int, check_number, config_error, require_tensor, same_shape

__all__ = [
    "NO_CRITIC_SETTINGS",
    "allowed_with_a_critic",
    "PPOSettings",
    "VALUE_MODELS",
    "check_critic_config",
    "explained_variance",
    "gae",
    "token_rewards",
    "value_loss",
    "whiten",
]

#: Where the value model lives: ``"separate"``, a model of its own (a copy of the policy and a head);
#: ``"head"``, a linear head on the policy's own last hidden state (:mod:`grpo_tutorial.ppo.critic`).
VALUE_MODELS = ("separate", "head")


@dataclass(frozen=True)
class PPOSettings:
    """PPO's own settings, beside the run's :class:`~grpo_tutorial.config.GRPOConfig` (checked when built).

    Attributes:
        gamma: the discount of GAE, in [0, 1]. 1 (default): a terminal reward
            reaches every token undiminished, as in RLHF's PPO.
        lam: GAE's lambda, in [0, 1]: 0 gives the one-step TD error
            r_t + gamma V_{t+1} - V_t (all the value model's), 1 the Monte Carlo
            return minus V_t; 0.95 (default) is TRL's old default.
        value_lr: the value model's AdamW learning rate (its own optimizer);
            0 leaves the value model as it is.
        cliprange_value: None (default, the PPO paper's unclipped value loss) or
            a number > 0: the value clipped to within this of its value at
            sampling time, the larger error taken (baselines' ``ppo2``, TRL's old
            trainer, which used 0.2).
        kl_in_reward: True: the KL to the reference (``beta`` times the
            config's ``kl_kind`` estimate, per token, from the sampling policy's
            log-probs) is subtracted from each token's reward, as InstructGPT and
            TRL's old PPO trainer did (which used k1, the log-ratio), and the loss
            has no KL term. False (default): the KL stays in the loss, as GRPO
            keeps it. Needs ``beta > 0``.
        value_warmup_steps: the first this many steps train the value model
            only, the policy left as it is (verl's ``critic_warmup``); 0 (default)
            trains both from the first step.
        whiten: normalise the advantages over the batch's real tokens
            (:func:`whiten`; default True, as TRL's old trainer did).
        value_model: ``"separate"`` (default) or ``"head"``, see :data:`VALUE_MODELS`.
    """

    gamma: float = 1.0
    lam: float = 0.95
    value_lr: float = 1e-3
    cliprange_value: float | None = None
    kl_in_reward: bool = False
    value_warmup_steps: int = 0
    whiten: bool = True
    value_model: str = "separate"

    def __post_init__(self) -> None:
        o = type(self).__name__
        for name in ("gamma", "lam"):
            check_number(o, name, getattr(self, name), lambda v: 0 <= v <= 1, "a number in [0, 1]")
        check_number(o, "value_lr", self.value_lr, lambda v: v >= 0, "a number >= 0 (0: the value model stays)")
        check_number(o, "cliprange_value", self.cliprange_value, lambda v: v > 0,
                     "None (no value clipping) or a number > 0, e.g. 0.2", optional=True)
        check_flag(o, "kl_in_reward", self.kl_in_reward)
        check_int(o, "value_warmup_steps", self.value_warmup_steps, 0)
        check_flag(o, "whiten", self.whiten)
        check_choice(o, "value_model", self.value_model, VALUE_MODELS)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: The GRPOConfig settings that assume no critic, each with its default (the only value PPO takes) and the reason.
NO_CRITIC_SETTINGS: dict[str, tuple[Any, str]] = {
    "advantage_baseline": ("group", "the value model is the baseline; a group's or the batch's mean would replace it"),
    "scale_rewards": ("group", "the advantages are GAE's, whitened over the batch (PPOSettings.whiten); no group "
                               "or batch standard deviation divides them"),
    "multi_objective_aggregation": ("sum_then_normalize", "GDPO z-scores each reward function within its group; "
                                                          "the value model learns the one weighted reward"),
    "dynamic_sampling": (False, "a group whose rewards are all equal still has advantages (reward - V) under a "
                                "critic, so dropping it throws a signal away"),
    "importance_sampling_level": ("token", "GSPO's one ratio per completion is built for one advantage per "
                                           "completion, not one per token"),
    "loss_type": (None, "VESPO's weight reads the sign of one advantage per completion"),
    "off_policy_mask_threshold": (None, "the off-policy mask drops completions by the sign of their one advantage"),
    "use_peft": (False, "the value model is not built for LoRA adapters (a copy would copy them, a head would "
                        "read the adapted trunk); not supported"),
}


#: The loss types a value model cannot take (the others can): VESPO reads one advantage per completion, and LUSPO
#: is GSPO's sequence ratio.
REFUSED_LOSS_TYPES = ("vespo", "luspo")


def allowed_with_a_critic(name: str) -> str:
    """What a value model allows for the setting ``name`` of :data:`NO_CRITIC_SETTINGS`, in words: its one value
    (``"'group' only"``), or for ``loss_type``, every loss type but those it refuses."""
    if name not in NO_CRITIC_SETTINGS:
        raise ValueError(f"name must be one of {list(NO_CRITIC_SETTINGS)}, got {name!r}")
    if name == "loss_type":
        return "any but " + " and ".join(repr(t) for t in REFUSED_LOSS_TYPES)
    return f"{NO_CRITIC_SETTINGS[name][0]!r} only"


def check_critic_config(config: Any, settings: PPOSettings) -> None:
    """Refuse, one clear ``ValueError`` each, the config's settings that conflict with a value model.

    Refused (:data:`NO_CRITIC_SETTINGS` holds each reason, which the message gives):

    * ``advantage_baseline`` other than ``"group"`` (RLOO's, the batch's): the
      value model is the baseline;
    * ``scale_rewards`` other than ``"group"``: GAE's advantages are whitened
      over the batch instead, and no group's or batch's std divides them
      (``"group"``, the default, is not applied either);
    * ``multi_objective_aggregation="normalize_then_sum"`` (GDPO's group z-scores);
    * ``dynamic_sampling``: under a critic an all-equal group still has a signal;
    * ``importance_sampling_level="sequence"`` (GSPO), and so ``loss_type="luspo"``;
    * ``loss_type="vespo"`` and ``off_policy_mask_threshold``: each reads the
      sign of one advantage per completion (:func:`~grpo_tutorial.loss.grpo_loss`
      refuses them with ``[N, T]`` advantages too);
    * ``use_peft``: the value model is not built for adapters;
    * ``PPOSettings.kl_in_reward`` with ``beta = 0``.

    Taken: ``num_iterations > 1`` (PPO's epochs over the batch; the value model
    makes as many updates), every other loss type (their normalisers count
    tokens or sequences, and work with one advantage per token), the entropy
    options, truncation masking, the samplers and their correction.
    """
    if not isinstance(settings, PPOSettings):
        raise TypeError(f"settings must be a PPOSettings, got {type(settings).__name__}")
    for name, (default, reason) in NO_CRITIC_SETTINGS.items():
        value = getattr(config, name)
        if name == "loss_type":
            if value in REFUSED_LOSS_TYPES:
                raise config_error("GRPOConfig", name, value, f"{allowed_with_a_critic(name)} with a value model (PPO)",
                                   f": {reason}; LUSPO needs GSPO's sequence ratio")
        elif value != default:
            raise config_error("GRPOConfig", name, value, f"{default!r} with a value model (PPO)", f": {reason}")
    if settings.kl_in_reward and not config.beta > 0:
        raise config_error("PPOSettings", "kl_in_reward", True, "False with beta = 0",
                           ": the KL folded into the reward is beta * KL; set GRPOConfig.beta > 0")


# ---------------------------------------------------------------------------
# The formulas
# ---------------------------------------------------------------------------


def _check_mask(mask: torch.Tensor) -> torch.Tensor:
    """A completion mask: ``[N, T]``, each row its real tokens first (1s, then 0s), at least one token a row."""
    require_tensor("mask", mask, dim=2)
    m = mask.float()
    if bool((m[:, 1:] > m[:, :-1]).any()):
        raise ValueError("mask must be each row's real tokens first, then padding (1s then 0s), as a completion's")
    if bool((m[:, 0] == 0).any()):
        raise ValueError("mask has a row with no real token; every completion has at least one")
    return m


def token_rewards(scores: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None,
                  beta: float = 0.0) -> torch.Tensor:
    """Each token's reward ``[N, T]``: ``scores`` (``[N]``) on each completion's last real token, minus ``beta * kl``.

    ``kl`` (``[N, T]``, the per-token KL to the reference) is folded in only when
    given: InstructGPT's and TRL's old trainer's reward, ``r_t = -beta * KL_t``
    plus the score at the end. Padding gets 0.
    """
    m = _check_mask(mask)
    require_tensor("scores", scores, dim=1, floating=True)
    if scores.shape[0] != m.shape[0]:
        raise ValueError(f"scores has {scores.shape[0]} entries but mask has {m.shape[0]} rows")
    last = m.sum(dim=1).long() - 1  # [N] the index of each completion's last real token
    rewards = torch.zeros_like(m, dtype=scores.dtype)  # [N, T]
    rewards[torch.arange(m.shape[0], device=m.device), last] = scores
    if kl is not None:
        require_tensor("kl", kl, dim=2, floating=True)
        same_shape(kl=kl, mask=mask)
        rewards = rewards - beta * kl.detach().to(rewards.dtype) * m
    return rewards * m


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over completion tokens: ``(advantages, returns)``, each ``[N, T]``.

    ``rewards``, ``values`` and ``mask`` are ``[N, T]``; ``values[:, t]`` is V of
    the prefix before token t. The value after a completion's last real token is
    0 (the episode ends there); padding gets advantage and return 0. All T
    positions at once: A = delta @ D with D[k, t] = (gamma * lambda)^(k - t) for
    k >= t (a loop from the end, as TRL's old trainer wrote it, gives the same).
    """
    m = _check_mask(mask)
    for name, tensor in (("rewards", rewards), ("values", values)):
        require_tensor(name, tensor, dim=2, floating=True)
    same_shape(rewards=rewards, values=values, mask=mask)
    for name, value in (("gamma", gamma), ("lam", lam)):
        check_number(None, name, value, lambda v: 0 <= v <= 1, "a number in [0, 1]")
    values = values.detach() * m  # [N, T]
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)  # [N, T]: V_{t+1}, 0 at the end
    deltas = (rewards.detach() + gamma * next_values - values) * m  # [N, T]
    T = m.shape[1]
    steps = torch.arange(T, device=m.device)
    gap = steps[:, None] - steps[None, :]  # [T, T]: k - t
    discount = torch.where(gap >= 0, torch.tensor(gamma * lam, dtype=torch.float64, device=m.device)
                           ** gap.clamp(min=0), 0.0).to(deltas.dtype)  # [T, T]
    advantages = (deltas @ discount) * m  # [N, T]
    return advantages, (advantages + values) * m


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum()


def whiten(values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """``values`` normalised over the masked entries: (x - mean) / sqrt(var + eps), 0 on padding.

    The mean and the variance (with Bessel's correction, n - 1) are over the
    entries where ``mask`` is 1, as TRL's old ``masked_whiten``; ``shift_mean=False``
    adds the mean back (only the scale changes). Needs two entries at least.
    """
    require_tensor("values", values, dim=2, floating=True)
    require_tensor("mask", mask, dim=2)
    same_shape(values=values, mask=mask)
    m = mask.to(values.dtype)
    n = m.sum()
    if n < 2:
        raise ValueError(f"whiten needs at least 2 masked entries, got {int(n)}")
    real = values.masked_select(m.bool())  # [K] the masked entries
    mean, var = real.mean(), real.var()  # torch's var: Bessel's n - 1
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * m


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               cliprange_value: float | None = None, num_tokens: float | torch.Tensor | None = None,
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """The value model's loss 0.5 * (V - R)^2, averaged over the masked tokens, and ``{"value_clipfrac": ...}``.

    ``values`` (with gradient), ``old_values`` (at sampling time) and ``returns``
    are ``[N, T]``. With ``cliprange_value`` c, each token's error is the larger
    of (V - R)^2 and (V_clip - R)^2, V_clip = old + clamp(V - old, -c, c)
    (baselines' ``ppo2``; the PPO paper's loss is unclipped). ``num_tokens``: the
    denominator, for a micro-batch of a larger update (default: this mask's tokens).
    """
    for name, tensor in (("values", values), ("old_values", old_values), ("returns", returns)):
        require_tensor(name, tensor, dim=2, floating=True)
    require_tensor("mask", mask, dim=2)
    same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    check_number(None, "cliprange_value", cliprange_value, lambda v: v > 0, "None or a number > 0", optional=True)
    m = mask.to(values.dtype)
    returns = returns.detach()
    errors = (values - returns) ** 2  # [N, T]
    clipfrac = 0.0
    if cliprange_value is not None:
        old = old_values.detach()
        clipped = old + (values - old).clamp(-cliprange_value, cliprange_value)  # [N, T]
        clipped_errors = (clipped - returns) ** 2  # [N, T]
        clipfrac = float(_masked_mean((clipped_errors > errors).to(m.dtype), m))
        errors = torch.maximum(errors, clipped_errors)
    denominator = m.sum() if num_tokens is None else num_tokens
    return 0.5 * (errors * m).sum() / denominator, {"value_clipfrac": clipfrac}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the masked tokens (NaN when the returns do not vary)."""
    require_tensor("values", values, dim=2, floating=True)
    require_tensor("returns", returns, dim=2, floating=True)
    same_shape(values=values, returns=returns, mask=mask)
    m = mask.to(returns.dtype)

    def variance(x: torch.Tensor) -> torch.Tensor:
        return _masked_mean((x - _masked_mean(x, m)) ** 2, m)

    spread = variance(returns)
    if float(spread) <= 0.0:
        return float("nan")
    return float(1.0 - variance(returns - values) / spread)

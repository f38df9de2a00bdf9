"""PPO's critic and what chapter 17 sets against it (issue 46): the pieces GRPO drops, built to be compared.

- :mod:`~grpo_tutorial.ppo.formulas`: GAE, the per-token rewards, whitening, the value
  loss, explained variance; :class:`PPOSettings`; :func:`check_critic_config`, the
  settings that assume no critic, refused;
- :mod:`~grpo_tutorial.ppo.critic`: the value model (a trunk's last hidden state and a
  linear head; a separate copy of the policy, or a head on its trunk);
- :mod:`~grpo_tutorial.ppo.step`: :class:`PPOStep`, GRPO's step with stage 3 (the
  critic's advantages, :class:`CriticAdvantages`) and stage 5 (the value model's
  updates first) overridden;
- :mod:`~grpo_tutorial.ppo.vine`: Monte Carlo values without a critic (VinePPO's
  idea), :class:`MonteCarloStep`.

Each is a subclass of :class:`~grpo_tutorial.step.GRPOStep` that overrides stages only
(:mod:`grpo_tutorial.stage_results`); the trainer takes one as ``step=``. The formulas'
names are importable from here (``from grpo_tutorial.ppo import gae``), and so are the
steps and their settings.
"""

from __future__ import annotations

from .critic import ValueModel, build_value_model, count_parameters
from .formulas import (
    NO_CRITIC_SETTINGS, VALUE_MODELS, PPOSettings, allowed_with_a_critic, check_critic_config, explained_variance, gae,
    token_rewards, value_loss, whiten,
)
from .step import CriticAdvantages, PPOStep
from .vine import MonteCarloSettings, MonteCarloStep

__all__ = [
    "NO_CRITIC_SETTINGS", "VALUE_MODELS", "CriticAdvantages", "MonteCarloSettings", "MonteCarloStep", "PPOSettings",
    "PPOStep", "ValueModel", "allowed_with_a_critic", "build_value_model", "check_critic_config", "count_parameters",
    "explained_variance", "gae", "token_rewards", "value_loss", "whiten",
]

"""The value model of PPO (chapter 17): V(prefix) for every completion token, from a trunk's last hidden state.

A :class:`ValueModel` is a trunk (a causal LM that returns its hidden states,
``output_hidden_states=True``) and a head, one ``Linear(hidden, 1)``. The value of
completion token t is the head applied to the last hidden state at the position
*before* t: the expected reward from the prefix the policy has written so far,
before it writes token t (as TRL's old PPO trainer read its values).

Two places for it (:data:`~grpo_tutorial.ppo.VALUE_MODELS`), built by :func:`build_value_model`:

* ``"separate"``: a model of its own, a copy of the policy's weights with a new
  head, trained by its own optimizer. It is what DeepSeekMath's "another model of
  comparable size as the policy model" counts: the policy's parameters again,
  plus their AdamW moments. The policy and the critic do not interfere.
* ``"head"``: a head on the policy's own trunk, trained alone (the trunk's
  features are read without gradient, so the value loss never moves the
  policy): ``hidden + 1`` parameters, no second model. The price: the critic can
  only read what the policy's features already hold, and they move under it as
  the policy trains. (Sharing the trunk *with* the value loss's gradient, as
  baselines' shared networks did, is not offered here: the policy's and the
  critic's losses would pull on the same weights.)

:func:`count_parameters` counts what each costs: on chapter 13's tiny model
(791,168 parameters) ``"separate"`` trains 791,297 more (with their AdamW moments,
about twice the training memory of the policy alone), ``"head"`` 129. The chapter
uses ``"separate"``: the comparison GRPO was made for is against a critic of the
policy's size, and only a critic with its own weights can be wrong (or right)
without moving the policy.
"""

from __future__ import annotations

import copy
import inspect
from contextlib import nullcontext
from typing import Any

import torch

from .._checks import check_choice, require_tensor
from ..models import disable_dropout

__all__ = ["ValueModel", "build_value_model", "count_parameters", "exposes_hidden_states"]


def exposes_hidden_states(model: Any) -> bool:
    """Whether ``model``'s forward takes ``output_hidden_states`` (by name or ``**kwargs``) and has a hidden size."""
    forward = getattr(model, "forward", None)
    if forward is None:
        return False
    parameters = inspect.signature(forward).parameters.values()
    takes = any(p.name == "output_hidden_states" or p.kind is p.VAR_KEYWORD for p in parameters)
    return takes and _hidden_size(model) is not None


def _hidden_size(model: Any) -> int | None:
    size = getattr(getattr(model, "config", None), "hidden_size", None)
    return size if isinstance(size, int) and size > 0 else None


def _refuse(model: Any) -> ValueError:
    return ValueError(
        f"a value head needs a model that exposes its hidden states (forward(..., output_hidden_states=True) "
        f"returning .hidden_states, and config.hidden_size); {type(model).__name__} does not"
    )


class ValueModel(torch.nn.Module):
    """V(prefix) for each completion token: a trunk's last hidden state, then a linear head.

    Args:
        trunk: a causal LM that returns ``hidden_states`` (a transformers model).
        train_trunk: True: the trunk is this model's own and trains with the head
            (``"separate"``); False: the trunk is shared with the policy and read
            without gradient, only the head trains (``"head"``; the trunk is then
            not a submodule: the value model's parameters are the head's).

    The head starts at zero (weights and bias), so every value is 0 before the
    first update: the critic knows nothing yet.
    """

    def __init__(self, trunk: torch.nn.Module, *, train_trunk: bool) -> None:
        super().__init__()
        if not exposes_hidden_states(trunk):
            raise _refuse(trunk)
        self.train_trunk = train_trunk
        if train_trunk:
            self.trunk = trunk
        else:
            self._shared = (trunk,)  # a tuple: not registered, so not in parameters() or state_dict()
        param = next(trunk.parameters())
        self.head = torch.nn.Linear(_hidden_size(trunk), 1, device=param.device, dtype=param.dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    @property
    def base(self) -> torch.nn.Module:
        """The trunk the features come from (this model's own, or the policy's)."""
        return self.trunk if self.train_trunk else self._shared[0]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_length: int) -> torch.Tensor:
        """``[N, Tc]`` values of the last ``completion_length`` tokens of ``input_ids`` (``[N, Tp+Tc]``, left-padded)."""
        require_tensor("input_ids", input_ids, dim=2, floating=False)
        if not 0 < completion_length < input_ids.shape[1]:
            raise ValueError(f"completion_length must be in [1, {input_ids.shape[1] - 1}], got {completion_length}")
        trunk = self.base
        position_ids = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # [N, T], as generate's
        extra = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(trunk.forward).parameters else {}
        grad = self.train_trunk and torch.is_grad_enabled()
        with nullcontext() if grad else torch.no_grad():
            out = trunk(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                        output_hidden_states=True, use_cache=False, **extra)
        hidden = getattr(out, "hidden_states", None)
        if not hidden:
            raise _refuse(trunk)
        states = hidden[-1][:, -completion_length - 1 : -1]  # [N, Tc, H]: the state before each completion token
        return self.head(states.to(self.head.weight.dtype)).squeeze(-1)  # [N, Tc]

    def values(self, rollout: Any, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The values ``[N, Tc]`` (or of ``rows``) of a :class:`~grpo_tutorial.rollout.Rollout`'s completions."""
        ids, mask = rollout.input_ids, rollout.attention_mask  # [N, Tp+Tc] x2
        if rows is not None:
            ids, mask = ids[rows], mask[rows]
        return self(ids, mask, rollout.completion_ids.shape[1])

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What the value model's optimizer trains: the trunk and the head, or the head alone."""
        return [p for p in self.parameters() if p.requires_grad]


def build_value_model(policy: torch.nn.Module, kind: str = "separate", *, trunk: torch.nn.Module | None = None,
                      ) -> ValueModel:
    """The value model of ``kind`` for ``policy``: ``"separate"`` (a copy of the policy, or ``trunk``) or ``"head"``.

    ``trunk``: with ``"separate"``, another model to start the value model from
    (a smaller tiny Qwen2, say) instead of a copy of the policy. A model whose
    hidden states cannot be had is refused with one ``ValueError``.
    """
    check_choice(None, "kind", kind, ("separate", "head"))
    if kind == "head":
        if trunk is not None:
            raise ValueError("kind='head' puts the head on the policy's trunk; trunk= is only for kind='separate'")
        return ValueModel(policy, train_trunk=False)
    base = copy.deepcopy(policy) if trunk is None else trunk
    if not exposes_hidden_states(base):
        raise _refuse(base)
    disable_dropout(base)
    for p in base.parameters():
        p.requires_grad_(True)
    return ValueModel(base, train_trunk=True)


def count_parameters(value_model: ValueModel, policy: torch.nn.Module) -> dict[str, int]:
    """The parameters of ``policy`` and those ``value_model``'s optimizer trains (the weights a critic adds).

    AdamW keeps two moments per trained weight, so the training memory a critic
    adds is about three times ``value_model``'s count (weights, two moments) plus
    its gradients: with ``"separate"`` about as much again as the policy's own.
    """
    policy_count = sum(p.numel() for p in policy.parameters())
    trained = sum(p.numel() for p in value_model.trainable_parameters())
    return {"policy": policy_count, "value_model": trained}

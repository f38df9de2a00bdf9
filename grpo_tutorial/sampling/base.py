"""What every sampler is (:class:`Sampler`), the policy itself as one (:class:`PolicySampler`), and a user's function.

Stage 1 of the step calls ``sampler(prompts, generator_seed)`` and nothing else
about sampling; after every optimizer update the step calls ``sampler.sync()``,
after a checkpoint is loaded the trainer calls ``sampler.reset()``, and an
evaluation generates with ``sampler.evaluation_model``. Those four, and the tools
the step hands it (``toolbox``), are the whole protocol; every sampler the package
builds has them, so nobody asks a sampler what it can do.

:class:`PolicySampler` is the book's default and the base of the package's other
samplers: :meth:`PolicySampler.generate` is the one place a model's rollout is
made with the run's settings, through :func:`~grpo_tutorial.rollout.generate_rollouts`,
or with tools through :func:`~grpo_tutorial.tools.generate_tool_rollouts`, which
pauses at each call and continues from the token ids.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import torch

from ..rollout import Rollout, generate_rollouts, sampling_kwargs
from ..tools import generate_tool_rollouts

__all__ = ["FunctionSampler", "PolicySampler", "Sampler", "as_sampler"]

#: The members of the protocol (besides the call), in the order the docs give them.
MEMBERS = ("toolbox", "is_learner", "evaluation_model", "sync", "reset")


@runtime_checkable
class Sampler(Protocol):
    """What writes a step's completions (stage 1): ``sampler(prompts, generator_seed) -> Rollout``.

    - ``__call__(prompts, generator_seed)``: G completions for each of the B
      prompts, all B*G in one batched ``generate`` call (with tools: one more per
      round of calls), seeded by ``generator_seed``;
    - ``toolbox``: the step's tools (a :class:`~grpo_tutorial.tools.ToolBox`) or
      None; the step sets it, and a sampler with tools pauses at each call and
      continues from the token ids;
    - ``is_learner``: True when its rollouts are the policy's own, up to float
      rounding (no ``sampler_logprobs``, nothing to correct); False for a sampler
      that is not the learner (chapter 15);
    - ``evaluation_model``: the model an evaluation of the run generates with (the
      policy, or a merged copy of it that already exists);
    - ``sync()``: after every optimizer update (a copy follows the policy);
    - ``reset()``: after a checkpoint is loaded (a copy restarts from the loaded policy).
    """

    toolbox: Any
    is_learner: bool

    @property
    def evaluation_model(self) -> torch.nn.Module: ...

    def __call__(self, prompts: list, generator_seed: int) -> Rollout: ...

    def sync(self) -> None: ...

    def reset(self) -> None: ...


class PolicySampler:
    """The book's default sampler: the policy itself, with the run's sampling settings (and the step's tools).

    Exactly on-policy: the rollout carries no ``sampler_logprobs``, and the
    step's first ratio is exactly 1. Nothing to do after an update or a load.
    Subclasses sample from another model (:attr:`model`) through :meth:`generate`.
    """

    is_learner = True

    def __init__(self, policy: torch.nn.Module, tokenizer: Any, config: Any) -> None:
        self.policy, self.tokenizer, self.config = policy, tokenizer, config
        self.model: torch.nn.Module = policy  # what __call__ generates from
        self.toolbox: Any = None  # the step's tools (grpo_tutorial.tools.ToolBox), if it has any

    @property
    def evaluation_model(self) -> torch.nn.Module:
        """The model an evaluation generates with: the one this sampler generates from."""
        return self.model

    def __call__(self, prompts: list, generator_seed: int) -> Rollout:
        return self.generate(self.model, prompts, generator_seed)

    def generate(self, model: torch.nn.Module, prompts: list, generator_seed: int, *, answered: dict | None = None,
                 **settings: Any) -> Rollout:
        """One rollout of ``model`` with the run's sampling settings (``settings`` overrides some of them:
        :func:`~grpo_tutorial.rollout.sampling_kwargs`). With tools, the tool loop, which pauses at each call and
        continues from the token ids (``answered``: calls already answered, not run again)."""
        kwargs = sampling_kwargs(self.config, generator_seed=generator_seed, **settings)
        if self.toolbox is not None:
            return generate_tool_rollouts(model, self.tokenizer, prompts, self.toolbox, answered=answered, **kwargs)
        return generate_rollouts(model, self.tokenizer, prompts, **kwargs)

    def sync(self) -> None:
        """After an optimizer update: nothing (the policy is its own newest version)."""

    def reset(self) -> None:
        """After a checkpoint is loaded: nothing (the policy holds the loaded weights)."""


class FunctionSampler:
    """A ``sampler=`` function of the user's, ``(prompts, generator_seed) -> Rollout``, as a :class:`Sampler`.

    It writes whole completions its own way, so it takes no tools (the step refuses
    tools with it); it may or may not be the learner, so its rollouts are read as
    they come (``sampler_logprobs``, if it fills them, are corrected for);
    an evaluation generates with the policy; nothing runs after an update or a load.
    """

    toolbox = None
    is_learner = False

    def __init__(self, fn: Callable[[list, int], Rollout], policy: torch.nn.Module) -> None:
        self.fn, self.policy = fn, policy

    @property
    def evaluation_model(self) -> torch.nn.Module:
        return self.policy

    def __call__(self, prompts: list, generator_seed: int) -> Rollout:
        return self.fn(prompts, generator_seed)

    def sync(self) -> None:
        """Nothing: the function follows the policy, if it does, its own way."""

    def reset(self) -> None:
        """Nothing, as :meth:`sync`."""


def as_sampler(given: Any, policy: torch.nn.Module) -> Sampler:
    """``given`` as a :class:`Sampler`: itself when it has the whole protocol, a :class:`FunctionSampler` around a
    plain function. An object with part of the protocol is refused (its ``sync`` would silently never run), and so
    is anything that cannot be called."""
    if isinstance(given, Sampler):
        return given
    if not callable(given):
        raise TypeError(f"sampler must be None or a function, got {type(given).__name__}")
    some = [name for name in MEMBERS if hasattr(given, name)]
    if some:
        missing = [name for name in MEMBERS if name not in some]
        raise TypeError(
            f"the sampler {type(given).__name__} has {some} but not {missing}: give it the whole protocol "
            "(grpo_tutorial.sampling.Sampler; subclass PolicySampler for the defaults), or pass a plain function"
        )
    return FunctionSampler(given, policy)

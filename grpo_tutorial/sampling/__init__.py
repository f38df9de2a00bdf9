"""Stage 1's home: what writes a step's completions, and which one a run gets.

Every sampler is a :class:`~grpo_tutorial.sampling.base.Sampler`: called with the
prompts and a seed, it returns a :class:`~grpo_tutorial.rollout.Rollout`; the step
syncs it after every update, the trainer resets it after a load, an evaluation
generates with its ``evaluation_model``, and with tools it pauses at each call and
continues from the token ids. The implementations:

- :mod:`~grpo_tutorial.sampling.base`: the protocol; :class:`PolicySampler`, the
  policy itself (the book's default, and the base of the others: its ``generate``
  is the one place a rollout is made with the run's settings, with or without
  tools); :class:`FunctionSampler`, a ``sampler=`` function of the user's;
- :mod:`~grpo_tutorial.sampling.fast`: :class:`FastSampler`, the policy sampled
  fast (adapters merged into a copy, a static KV cache), the default on a GPU;
- :mod:`~grpo_tutorial.sampling.copies`: :class:`SamplerCopy`, samplers that are
  not the learner (``GRPOConfig.sampler``), whose log-probs
  :mod:`grpo_tutorial.mismatch` corrects for.

:func:`build_sampler` is the one factory: it turns the trainer's ``sampler=`` and
``GRPOConfig.sampler`` into the step's sampler.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import FunctionSampler, PolicySampler, Sampler, as_sampler
from .copies import SamplerCopy, top_p_logprobs
from .fast import FastSampler, build_fast_sampler

__all__ = [
    "FastSampler", "FunctionSampler", "PolicySampler", "Sampler", "SamplerCopy", "as_sampler", "build_sampler",
    "top_p_logprobs",
]


def build_sampler(given: Any, policy: torch.nn.Module, tokenizer: Any, config: Any) -> Sampler:
    """The step's sampler: ``given`` (a ``sampler=`` function or :class:`Sampler`), or ``config.sampler``'s.

    For the default ``"policy"``: a :class:`FastSampler` where merging adapters or
    the static cache is on (on a CUDA GPU, by default), else a :class:`PolicySampler`
    (the policy as it is). A given sampler and a ``config.sampler`` other than
    ``"policy"`` are refused together, and so is the correction with neither (the
    policy reports no log-probs of its own).
    """
    if given is not None and config.sampler != "policy":
        raise ValueError(
            f"sampler= was given and GRPOConfig.sampler={config.sampler!r} too; choose the sampler one way "
            "(GRPOConfig.sampler='policy' with sampler=, or no sampler= with a sampler copy)"
        )
    if given is not None:
        return as_sampler(given, policy)
    if config.sampler == "policy":
        if config.vllm_importance_sampling_correction:
            raise ValueError(
                "GRPOConfig.vllm_importance_sampling_correction=True needs a sampler that is not the learner: set "
                "GRPOConfig.sampler ('bfloat16', 'stale', 'top_p' or 'float16'), or pass sampler= a function whose "
                "rollouts carry sampler_logprobs"
            )
        return build_fast_sampler(policy, tokenizer, config) or PolicySampler(policy, tokenizer, config)
    return SamplerCopy(policy, tokenizer, config, config.sampler)

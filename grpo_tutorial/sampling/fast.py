"""Fast sampling (issue 43): rollouts from merged adapters with a static KV cache, and the float16 copy's guard.

On a GPU a GRPO step is mostly stage 1: for chapter 9's LoRA preset, generating
64 completions of 512 tokens took 89% of the step (the GPU record at 335aac1, eager LoRA on an
H100: 72 ms a decoding step; the record at 5bd90c7, merged and static on an H200: 69%, 20 ms). Decoding
adds one token per row per forward pass, and a forward pass of a 0.5B model on a
few dozen rows is launch-bound: the GPU waits for Python and for hundreds of
small kernels, one after another, far more than for the arithmetic or the
weights' bytes. Three things make it faster without changing the method:

- **merged adapters** (:func:`merged_copy`, :func:`sync_copy`). An unmerged LoRA
  layer computes ``W x + s B (A x)``: three products where a plain layer has one.
  A plain copy of the policy whose weights are ``W + s B A`` samples the same
  distribution (up to float rounding) with a third of the launches. It is a copy,
  re-merged after every optimizer update, never the trained model merged in place:
  PEFT's ``unmerge_adapter`` subtracts the delta again, which moves the frozen base
  by rounding (about 1 ulp in 5% of a 896 x 896 float32 matrix after one cycle),
  and a LoRA checkpoint's base fingerprint (:func:`~grpo_tutorial.lora.base_fingerprint`)
  hashes those bytes;
- **a static KV cache** (:func:`~grpo_tutorial.speedups.static_cache_kwargs`): every
  decoding step has the same shapes, so transformers compiles it on a CUDA GPU and
  replays it as a CUDA graph. The prompts are left-padded to a fixed width (a
  multiple of :data:`~grpo_tutorial.speedups.PROMPT_BUCKET` that never shrinks
  within a sampler) so the compiled graph is reused from step to step; the first
  call at a new shape pays the compile, which the history row reports;
- **a float16 copy** (``GRPOConfig.sampler="float16"``, built on
  :class:`~grpo_tutorial.sampling.copies.SamplerCopy`): half the bytes to read, with the
  learner kept in float32. It is a sampler that is not the learner (chapter 15),
  so its rollouts carry its own log-probs and the history its mismatch. Qwen2 in
  float16 is known to overflow, which random weights cannot show:
  :class:`NonFiniteGuard` watches every step's logits, and a rollout whose logits
  or log-probs are not finite is made again by the float32 policy (counted in
  ``sampler/fallbacks``, warned once).

:class:`FastSampler` is the step's sampler for the policy itself when merging or
the static cache is on (``GRPOConfig.merge_adapters_for_sampling``,
``GRPOConfig.static_cache``); evaluation uses the same settings
(:func:`sampling_model`, :func:`use_static_cache`). Both settings default to None:
on where the policy is on a CUDA GPU, off on the CPU, so no CPU run's numbers move.
On the book's 2-core CPU (``python -m benchmarks.sampler_cpu``, one thread, load
about 2) the static cache, which nothing compiles there, made a decoding step 1.4
to 10 times slower, and a float16 copy 3 to 5 times slower; merged adapters made
LoRA's sampling 1.3 to 1.6 times faster (the tiny model at chapter 14's shapes,
SmolLM2 at chapter 9's), but merging changes the samples by float rounding, so
chapter 14's committed runs would no longer repeat bit for bit: a CPU run opts in
with ``merge_adapters_for_sampling=True``.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from ..rollout import Rollout, generate_rollouts, sampling_kwargs
from ..speedups import bucket_width
from ..warn import WarnOnce
from .base import PolicySampler

__all__ = [
    "COMPILE_SECONDS",
    "DECODE_MS",
    "FALLBACKS",
    "FastSampler",
    "NonFiniteGuard",
    "build_fast_sampler",
    "has_adapters",
    "merged_copy",
    "on_cuda",
    "sampling_model",
    "sync_copy",
    "use_merged_sampling",
    "use_static_cache",
]

#: History fields of a fast sampler's step: milliseconds per decoding step of its ``generate`` calls ...
DECODE_MS = "sampler/decode_ms"
#: ... the seconds of the calls that met a new compiled shape (the compile and that call's own decoding) ...
COMPILE_SECONDS = "sampler/compile_seconds"
#: ... and the float16 copy's rollouts made again in float32 for non-finite logits or log-probs.
FALLBACKS = "sampler/fallbacks"


# ---------------------------------------------------------------------------
# When: the settings, resolved for a model
# ---------------------------------------------------------------------------


def on_cuda(model: Any) -> bool:
    """Whether ``model``'s weights are on a CUDA GPU."""
    try:
        return next(model.parameters()).device.type == "cuda"
    except (StopIteration, AttributeError):
        return False


def has_adapters(model: Any) -> bool:
    """Whether ``model`` is a PEFT model that can merge its adapters (``merge_and_unload``)."""
    return getattr(model, "peft_config", None) is not None and callable(getattr(model, "merge_and_unload", None))


def _resolve(setting: bool | None, model: Any) -> bool:
    return on_cuda(model) if setting is None else setting


def use_merged_sampling(config: Any, model: Any) -> bool:
    """``config.merge_adapters_for_sampling`` for ``model``: a PEFT model, and True or (None) on a CUDA GPU."""
    return has_adapters(model) and _resolve(config.merge_adapters_for_sampling, model)


def use_static_cache(config: Any, model: Any) -> bool:
    """``config.static_cache`` for ``model``: True, or (None) on a CUDA GPU."""
    return _resolve(config.static_cache, model)


# ---------------------------------------------------------------------------
# The merged copy
# ---------------------------------------------------------------------------


def _lora_layers(model: Any) -> list[tuple[str, Any]]:
    """``(name in the merged model, layer)`` for each of a PEFT model's LoRA layers, checked to be plain LoRA."""
    adapter, prefix = model.active_adapter, "base_model.model."
    layers = []
    for name, layer in model.named_modules():
        if not (hasattr(layer, "get_delta_weight") and hasattr(layer, "base_layer")) or adapter not in getattr(
                layer, "lora_A", {}):
            continue
        if adapter in getattr(layer, "lora_variant", {}) or getattr(layer, "lora_bias", {}).get(adapter, False):
            raise ValueError(
                f"{name}: the merged sampler copy supports plain LoRA adapters only (no DoRA or other variant, no "
                "lora_bias); set GRPOConfig.merge_adapters_for_sampling=False to sample from the adapters unmerged"
            )
        layers.append((name.removeprefix(prefix), layer))
    return layers


@torch.no_grad()
def merged_copy(policy: torch.nn.Module, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A plain copy of ``policy`` to sample from: its adapters merged into the weights, in ``dtype``; frozen, eval mode.

    A PEFT model is deep-copied and the copy merged (``merge_and_unload``), so
    ``policy`` keeps its adapters and its base's bytes; any other model is
    deep-copied. ``dtype`` None keeps the policy's precision (the cast comes after
    the merge, so each weight is rounded once). :func:`sync_copy` brings the copy
    up to date after an update.
    """
    model = copy.deepcopy(policy)
    if has_adapters(model):
        _lora_layers(model)  # refuse what merging would not reproduce
        model = model.merge_and_unload()
    model.requires_grad_(False)
    model.eval()
    if dtype is not None:
        model.to(dtype)
    return model


@torch.no_grad()
def sync_copy(target: torch.nn.Module, policy: torch.nn.Module) -> None:
    """``target`` (a :func:`merged_copy`) takes ``policy``'s current weights.

    For a PEFT model only the adapted layers can have changed (the base and
    everything else are frozen): each becomes ``W + delta``, the same sum PEFT's
    merge computes (bit for bit in the policy's precision), then cast to the
    copy's. Any other model's whole state dict is copied (``load_state_dict`` casts).
    """
    if not has_adapters(policy):
        target.load_state_dict(policy.state_dict())
        return
    modules = dict(target.named_modules())
    adapter = policy.active_adapter
    for name, layer in _lora_layers(policy):
        weight = layer.get_base_layer().weight
        modules[name].weight.copy_(weight + layer.get_delta_weight(adapter))


def sampling_model(model: torch.nn.Module, config: Any) -> torch.nn.Module:
    """What an evaluation generates with: a :func:`merged_copy` of ``model`` when merging is on for it, else ``model``."""
    return merged_copy(model) if use_merged_sampling(config, model) else model


# ---------------------------------------------------------------------------
# The float16 copy's guard
# ---------------------------------------------------------------------------


class NonFiniteGuard:
    """A ``generate`` logits processor that notices non-finite logits and keeps sampling from failing on them.

    A NaN or +inf logit (a 16-bit overflow), or a row whose logits are all
    -inf, would make the sampler raise (on a GPU, a device-side assert that ends
    the process). The guard sets such entries to 0, so the call finishes, and
    remembers that it did (:meth:`tripped`); its caller throws that rollout away.
    The flag stays on the device until read, so the guard adds no synchronisation
    to a decoding step.
    """

    def __init__(self) -> None:
        self.flag: torch.Tensor | None = None  # [] bool, on the logits' device

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:  # scores [N, V]
        bad = torch.isnan(scores) | torch.isposinf(scores)  # [N, V]
        dead = torch.isneginf(scores).all(dim=-1, keepdim=True)  # [N, 1]: no token left to sample
        bad = bad | dead
        hit = bad.any()
        self.flag = hit if self.flag is None else self.flag | hit
        return scores.masked_fill(bad, 0.0)

    def tripped(self) -> bool:
        """Whether any step of the call had a non-finite logit."""
        return bool(self.flag) if self.flag is not None else False


# ---------------------------------------------------------------------------
# The sampler
# ---------------------------------------------------------------------------


def _synchronize() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


class FastSampler(PolicySampler):
    """The step's sampler ``(prompts, seed) -> Rollout`` for the policy itself, sampled fast (see the module docs).

    It generates from :attr:`model`: a :func:`merged_copy` of the policy (with
    ``merge``, or with a ``dtype`` of its own: the float16 copy), else the policy
    itself; with ``static`` through a static KV cache, the prompts padded to
    :attr:`width`. The step calls :meth:`sync` after every optimizer update (the
    copy is re-merged) and the trainer :meth:`reset` after loading a checkpoint.
    Each rollout carries ``sampler_stats``: :data:`DECODE_MS` and, with the
    static cache, :data:`COMPILE_SECONDS`. Its ``sampler_logprobs`` stay None: a
    merged copy in the policy's precision is the policy, up to float rounding
    (as oneDNN's products are, :mod:`grpo_tutorial.speedups`), so the step stays
    on-policy. On a CUDA GPU, a static-cache call that fails (a compiler that
    cannot build the step) is made again with the dynamic cache, which is then
    used from there on, with a warning.

    With tools (:attr:`toolbox`, set by the step), a rollout pauses at each call and
    continues from token ids (:func:`~grpo_tutorial.tools.generate_tool_rollouts`),
    from the same model (the merged copy), with the dynamic cache: the rows of each
    round grow by the tool's answer and a stopping criterion reads them on the host
    at every token, so a compiled static-cache step would be built again for every
    width (the history's :data:`COMPILE_SECONDS` is then absent).
    """

    def __init__(self, policy: torch.nn.Module, tokenizer: Any, config: Any, *, merge: bool, static: bool,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(policy, tokenizer, config)
        self.static = static
        self.model = merged_copy(policy, dtype) if merge or dtype is not None else policy
        self.width = 0  # the prompt width the compiled step was made for; it only grows
        self.shapes: set[tuple] = set()  # (rows, width, budget, dtype) of the compiled steps met so far
        self.warn = WarnOnce()  # GRPOWarning, once per kind and sampler

    @property
    def evaluation_model(self) -> torch.nn.Module:
        """The model an evaluation of the trainer generates with: the merged copy (no second one is made)."""
        return self.model

    def __call__(self, prompts: list, generator_seed: int) -> Rollout:
        return self.rollout(self.model, prompts, generator_seed)

    def rollout(self, model: torch.nn.Module, prompts: list, generator_seed: int, *, guard: Any = None,
                answered: dict | None = None) -> Rollout:
        """One ``generate`` call of ``model`` with the config's sampling settings, timed; ``guard``: a logits processor.
        With tools, one call per round (``answered``: calls already answered, not run again)."""
        cfg = self.config
        settings = dict(onednn=cfg.onednn_generation if model.dtype == torch.float32 else None,
                        logits_processor=() if guard is None else (guard,))
        if self.toolbox is not None:
            _synchronize()
            start = time.perf_counter()
            rollout = self.generate(model, prompts, generator_seed, answered=answered, **settings)
            _synchronize()
            seconds = time.perf_counter() - start
            rollout.sampler_stats = {DECODE_MS: 1000 * seconds / max(1, rollout.completion_ids.shape[1])}
            return rollout
        kwargs = sampling_kwargs(cfg, generator_seed=generator_seed, **settings)
        _synchronize()
        start = time.perf_counter()
        try:
            rollout = generate_rollouts(model, self.tokenizer, prompts, static_cache=self.static,
                                        prompt_width=self.width, **kwargs)
        except torch.OutOfMemoryError:
            raise
        except Exception as error:  # noqa: BLE001: only a compiled static-cache step on a GPU is retried
            if not (self.static and on_cuda(model)):
                raise
            self.static = False
            self.warn("static_cache", f"generate with a static KV cache failed ({type(error).__name__}: "
                      f"{str(error)[:300]}); this sampler uses the dynamic cache from now on")
            rollout = generate_rollouts(model, self.tokenizer, prompts, **kwargs)
        _synchronize()
        seconds = time.perf_counter() - start
        stats = {DECODE_MS: 1000 * seconds / max(1, rollout.completion_ids.shape[1])}
        if self.static:
            self.width = bucket_width(rollout.prompt_ids.shape[1], self.width)
            shape = (len(rollout), self.width, cfg.max_new_tokens, model.dtype)
            stats[COMPILE_SECONDS] = 0.0 if shape in self.shapes else seconds
            self.shapes.add(shape)
        rollout.sampler_stats = stats
        return rollout

    def sync(self) -> None:
        """After an optimizer update: the copy takes the policy's new weights (nothing to do without a copy)."""
        if self.model is not self.policy:
            sync_copy(self.model, self.policy)

    def reset(self) -> None:
        """After a checkpoint is loaded: the copy takes the loaded weights."""
        self.sync()


def build_fast_sampler(policy: torch.nn.Module, tokenizer: Any, config: Any) -> FastSampler | None:
    """The step's sampler for ``config.sampler="policy"``: a :class:`FastSampler` when merging or the static cache
    is on for ``policy``; None otherwise (then the policy samples as it is, a
    :class:`~grpo_tutorial.sampling.base.PolicySampler`)."""
    merge, static = use_merged_sampling(config, policy), use_static_cache(config, policy)
    if not (merge or static):
        return None
    return FastSampler(policy, tokenizer, config, merge=merge, static=static)

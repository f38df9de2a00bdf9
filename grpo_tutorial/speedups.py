"""Speed-ups: three ways the package makes a step cheaper without changing what it computes.

The stages (:mod:`~grpo_tutorial.rollout`, :mod:`~grpo_tutorial.logprobs`) are
written for reading; what makes them fast on a real model lives here, so that a
learner can read the method first and this page later. Each speed-up gives the
plain path's numbers up to float rounding (the blocked scorer gives them bit for
bit), and the stages call them with today's defaults:

1. **oneDNN linear layers during generation** (:func:`use_onednn`,
   :func:`onednn_linears`). On a CPU, a float32 ``nn.Linear`` calls the BLAS
   PyTorch was built with (MKL in the x86 wheels). PyTorch also carries oneDNN,
   and its compiler uses it for linear layers whose weights do not change: the
   weight is reordered once into a blocked layout, and every call multiplies
   against that layout. On the book's machine (an AMD EPYC, one thread) oneDNN did
   SmolLM2's decoding-step matmuls with 32 rows 2.3 times faster than MKL, and the
   2048 x 2048 product at 236 GFLOP/s against 105
   (``python -m benchmarks.gemm_backends``); batched decoding of SmolLM2 ran about
   1.6 times faster. During ``generate`` the weights do not change, so
   :func:`onednn_linears` reorders each weight once per call and lets every linear
   layer multiply with that copy. The products agree with the BLAS ones to float
   rounding (a relative 1e-6), so the sampled tokens follow the same distribution;
   a token whose two best candidates are that close may come out differently. The
   scorer and the loss keep the model's own layers, so the log-probabilities the
   trainer uses are not touched. Costs: the reordered copy of the weights lives as
   long as the ``generate`` call (for SmolLM2, 0.5 GB) and takes a fraction of a
   second to build (0.16 s). The operators are PyTorch internals
   (``torch.ops.mkldnn``, what the compiler emits), so :func:`onednn_available`
   checks that they exist and compute the right thing before anything uses them;
   without them, generation uses the model's own layers.
   :func:`~grpo_tutorial.rollout.generate_rollouts` uses it by default
   (``onednn=None``: yes for a float32 model on the CPU).

2. **Scoring logits in blocks** (:func:`score_tokens`). ``log_softmax(logits /
   T).gather(tokens)`` and the entropy beside it would keep several float32
   tensors of the logits' size alive for the backward pass (for Qwen2.5, 1.16 GiB
   each per micro-batch of 8). The scorer works on blocks of at most
   :data:`CHUNK_ELEMENTS` logits with one logsumexp for both and writes its own
   backward, so the only full-size tensors are the logits and their gradient. Its
   values and log-prob gradient are bit-identical to the plain formula's.
   :func:`~grpo_tutorial.logprobs.token_logprobs` and
   :func:`~grpo_tutorial.logprobs.completion_logprobs` always score this way.

3. **The shared-prompt KV cache** (:func:`shared_prompt_cache` for generation,
   :func:`shared_prompt_logits` for scoring). A GRPO batch holds each prompt G
   times, token for token. Generation encodes the B prompts once and repeats their
   KV cache G times (with long prompts this roughly halves a rollout's cost);
   scoring runs each distinct prompt through the model once and lets every row
   with that prompt read its cache, which skips (G-1)/G of the prompt work, forward
   and backward. Both step aside where they would not be the same computation
   (:func:`generation_can_share_prompts`, :func:`can_share_prompts`). A PEFT
   model (LoRA) counts as the transformers model it wraps (:func:`wrapped_model`).
   :func:`~grpo_tutorial.rollout.generate_rollouts` shares the cache whenever it
   can; the trainer scores with ``share_prompts=GRPOConfig.share_prompt_cache``
   (True by default).

4. **A static KV cache for generation** (:func:`static_cache_kwargs`,
   :func:`bucket_width`). ``generate`` normally grows its KV cache by one
   position per token, so every decoding step has new shapes. With
   ``cache_implementation="static"`` the cache is allocated once at its full
   length (prompt + budget), every step has the same shapes, and transformers
   compiles the decoding step on a CUDA GPU (``torch.compile``, with CUDA graphs:
   the step's hundreds of small kernel launches are replayed as one graph). A
   compiled graph serves only the shapes it was made for, so the prompts are
   left-padded to a width that is a multiple of :data:`PROMPT_BUCKET`: the graph
   is reused from step to step. On the CPU transformers does not compile, and
   the static cache is only another way to store the same numbers.
   :func:`~grpo_tutorial.rollout.generate_rollouts` takes it as ``static_cache``;
   :mod:`grpo_tutorial.sampling.fast` decides when to use it.

This module imports no stage: the stages import it.
"""

from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from typing import Any, Iterator

import torch

__all__ = [
    "CHUNK_ELEMENTS",
    "PROMPT_BUCKET",
    "bucket_width",
    "cache_argument",
    "can_share_prompts",
    "generation_can_share_prompts",
    "onednn_available",
    "onednn_linears",
    "returned_cache",
    "score_tokens",
    "shared_prompt_cache",
    "shared_prompt_logits",
    "static_cache_kwargs",
    "use_onednn",
    "wrapped_model",
]


# ---------------------------------------------------------------------------
# 1. Generation's linear layers on oneDNN
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def onednn_available() -> bool:
    """Whether this PyTorch build has oneDNN's packed linear and it agrees with ``F.linear``."""
    try:
        weight = torch.arange(12.0).reshape(3, 4) / 7  # [out=3, in=4]
        bias = torch.tensor([0.5, -1.0, 2.0])
        x = torch.arange(8.0).reshape(2, 4) / 5  # [rows=2, in=4]
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 2)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    except (AttributeError, RuntimeError, TypeError):
        return False
    return bool(torch.allclose(out, torch.nn.functional.linear(x, weight, bias), atol=1e-5))


def _linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def use_onednn(model: Any, setting: bool | None) -> bool:
    """Resolve generation's ``onednn`` setting for ``model``.

    ``None`` (the default) means: yes when the model's plain ``nn.Linear`` layers
    (exactly that class; other layer types are left alone) are all float32 on the
    CPU, this PyTorch has the operators, oneDNN is enabled
    (``torch.backends.mkldnn.enabled``) and CPU autocast is off (the operator is
    not covered by autocast). ``True`` asks for it and raises if it cannot be
    used; ``False`` never uses it.
    """
    if setting is not None and not isinstance(setting, bool):
        raise TypeError(f"onednn must be None, True or False, got {setting!r}")
    if setting is False:
        return False
    why = None
    if not torch.backends.mkldnn.enabled:
        why = "oneDNN is disabled (torch.backends.mkldnn.enabled is False)"
    elif torch.is_autocast_enabled("cpu"):
        why = "CPU autocast is on, and the oneDNN operator is not covered by autocast"
    elif not isinstance(model, torch.nn.Module):
        why = "the model is not a torch.nn.Module"
    else:
        layers = _linears(model)
        if not layers:
            why = "the model has no torch.nn.Linear layers"
        elif any(m.weight.device.type != "cpu" or m.weight.dtype != torch.float32 for m in layers):
            why = "oneDNN generation is for float32 models on the CPU"
        elif not onednn_available():
            why = "this PyTorch build has no oneDNN packed linear (torch.ops.mkldnn)"
    if why is None:
        return True
    if setting is True:
        raise ValueError(f"onednn=True cannot be used: {why}")
    return False


def _packed_forward(x: torch.Tensor, *, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@contextmanager
def onednn_linears(model: torch.nn.Module, rows: int) -> Iterator[int]:
    """Inside the block, every ``nn.Linear`` of ``model`` multiplies with a oneDNN copy of its weight.

    ``rows`` is the number of rows a call is expected to multiply (the batch of a
    decoding step); oneDNN picks its blocking for it, and any other row count
    still gives the right product. Gradients are off inside (the operator has no
    backward), and each layer's own ``forward`` is back when the block exits,
    also after an exception. A layer that already has a ``forward`` of its own
    (a hook library's wrapper, a user's patch, or this block entered twice) is
    left as it is. Yields the number of layers switched.
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    switched: list[torch.nn.Linear] = []
    try:
        with torch.no_grad():
            for layer in _linears(model):
                if "forward" in vars(layer):  # someone else's forward: do not bypass or remove it
                    continue
                packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach().contiguous(), rows)
                bias = None if layer.bias is None else layer.bias.detach()
                layer.forward = functools.partial(_packed_forward, packed=packed, bias=bias)
                switched.append(layer)
            yield len(switched)
    finally:
        for layer in switched:
            vars(layer).pop("forward", None)  # the class's forward again


# ---------------------------------------------------------------------------
# 2. Scoring logits in blocks
# ---------------------------------------------------------------------------

#: Largest block of logits (in elements) that the scorer works on at once: 2**22
#: float32 values are 16 MiB. A micro-batch of Qwen2.5's logits ([8, 257, 151936],
#: 1.16 GiB in float32) is scored in 76 such blocks; a tiny model's in one.
CHUNK_ELEMENTS = 2**22


def _blocks(n: int, t: int, v: int, budget: int) -> list[tuple[slice, slice]]:
    """(rows, positions) slices of an [n, t, v] tensor, each at most ``budget`` elements
    (whole rows together while they fit, else pieces of one row)."""
    if t * v <= budget:
        step = max(1, budget // max(1, t * v))
        return [(slice(i, min(i + step, n)), slice(0, t)) for i in range(0, n, step)]
    step = max(1, budget // v)
    return [(slice(i, i + 1), slice(j, min(j + step, t))) for i in range(n) for j in range(0, t, step)]


class _ScoreTokens(torch.autograd.Function):
    """log pi(token) and the entropy from one shared logsumexp, block by block.

    Forward, for each block ``z`` of ``logits / temperature`` (float32):
    ``lse = logsumexp(z)``, ``logp = z[token] - lse`` and, if asked,
    ``H = lse - sum(softmax(z) * z)``. It saves only the logits (which exist
    anyway), the token ids and ``lse`` (and ``sum_j p_j z_j``): no full-size float32 copy,
    softmax or log-softmax outlives a block. Backward recomputes
    ``p = softmax(z)`` per block, in place in the gradient tensor, which has the
    logits' size and is the only full-size tensor it allocates:

    - d logp / dz_j = [j = token] - p_j,
    - d H / dz_j = -p_j (log p_j + H) = -p_j (z_j - sum_k p_k z_k),

    both divided by the temperature. Only ``logits[:, :t]`` are scored (``t`` =
    the tokens' length); later positions get a zero gradient, so the caller need
    not slice the model's output (a slice's backward would allocate another
    full-size tensor).
    """

    @staticmethod
    def forward(ctx, logits, tokens, temperature, want_entropy, budget):  # logits [N, L, V], tokens [N, t]
        N, t = tokens.shape
        V = logits.shape[-1]
        index = tokens.long().unsqueeze(-1)  # [N, t, 1]
        acc = torch.promote_types(logits.dtype, torch.float32)  # float32 (float64 stays float64)
        logp = torch.empty((N, t), dtype=acc, device=logits.device)  # [N, t]
        lse = torch.empty_like(logp)  # [N, t]
        entropy = torch.empty_like(logp) if want_entropy else None  # [N, t]
        mean_z = torch.empty_like(logp) if want_entropy else None  # [N, t]: sum_j p_j z_j, for the backward
        for rows, pos in _blocks(N, t, V, budget):
            z = logits[rows, pos].to(acc)  # [n, s, V], a copy only for half-precision logits
            if temperature != 1.0:
                z = z / temperature
            block_lse = torch.logsumexp(z, dim=-1)  # [n, s]
            logp[rows, pos] = torch.gather(z, -1, index[rows, pos]).squeeze(-1) - block_lse
            lse[rows, pos] = block_lse
            if want_entropy:
                p = torch.sub(z, block_lse.unsqueeze(-1)).exp_()  # [n, s, V] softmax
                mean_z[rows, pos] = p.mul_(z).sum(dim=-1)
                entropy[rows, pos] = block_lse - mean_z[rows, pos]
        ctx.temperature, ctx.budget = temperature, budget
        ctx.save_for_backward(logits, index, lse, *([mean_z] if want_entropy else []))
        if not want_entropy:
            return logp
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, *grad_entropy):  # grad_logp [N, t], grad_entropy ([N, t],)
        logits, index, lse, *rest = ctx.saved_tensors
        mean_z = rest[0] if rest else None
        g_h = grad_entropy[0] if grad_entropy else None
        T = ctx.temperature
        N, t = lse.shape
        V = logits.shape[-1]
        grad = torch.zeros_like(logits)  # [N, L, V]: the one full-size tensor (autograd needs it anyway)
        g_lp = torch.zeros_like(lse) if grad_logp is None else grad_logp  # [N, t]
        in_place = logits.dtype == lse.dtype  # half logits: compute in float32, round once at the end
        for rows, pos in _blocks(N, t, V, ctx.budget):
            z = logits[rows, pos]  # [n, s, V]
            if not in_place:
                z = z.to(lse.dtype)
            if T != 1.0:
                z = z / T
            block_lse = lse[rows, pos].unsqueeze(-1)  # [n, s, 1]
            target = grad[rows, pos] if in_place else torch.empty_like(z)  # [n, s, V]
            p = torch.sub(z, block_lse, out=target).exp_()  # softmax(z), [n, s, V]
            g = g_lp[rows, pos]  # [n, s]
            if g_h is not None and mean_z is not None:
                # -p_j (g_lp + g_h (z_j - sum_k p_k z_k)) for every j (log p_j + H = z_j - sum_k p_k z_k),
                # then + g_lp at the token
                weight = torch.sub(z, mean_z[rows, pos].unsqueeze(-1))  # [n, s, V]
                weight.mul_(g_h[rows, pos].unsqueeze(-1)).add_(g.unsqueeze(-1))
                p.mul_(weight.neg_())
            else:
                p.mul_((-g).unsqueeze(-1))  # d logp: -p_j ...
            p.scatter_add_(-1, index[rows, pos], g.unsqueeze(-1))  # ... + [j = token]
            if T != 1.0:
                p.div_(T)
            if not in_place:
                grad[rows, pos] = p
        return grad, None, None, None, None


def score_tokens(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    *,
    temperature: float = 1.0,
    entropy: bool = False,
    entropy_grad: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``tokens`` (and the entropy) under ``logits / temperature``, in float32, by blocks.

    The memory-lean form of ``log_softmax(logits / T).gather(tokens)`` and of
    :func:`~grpo_tutorial.logprobs.token_entropy`: one logsumexp per position serves both, and no
    full-size float32 temporary is ever built (see :class:`_ScoreTokens`).
    ``logits`` may cover more positions than ``tokens`` (``[N, L, V]`` with
    ``L >= t``): the first ``t`` are scored. Returns ``[N, t]`` float32 log-probs,
    or ``(logp, entropy)``; the entropy carries a gradient only with
    ``entropy_grad``.
    """
    if tokens.shape[0] != logits.shape[0] or tokens.shape[1] > logits.shape[1]:
        raise ValueError(
            f"tokens has shape {tuple(tokens.shape)} but logits has shape {tuple(logits.shape)}; "
            "expected tokens [N, t] and logits [N, L, V] with L >= t"
        )
    if not entropy:
        return _ScoreTokens.apply(logits, tokens, float(temperature), False, CHUNK_ELEMENTS)
    logp, ent = _ScoreTokens.apply(logits, tokens, float(temperature), True, CHUNK_ELEMENTS)
    return logp, (ent if entropy_grad else ent.detach())


# ---------------------------------------------------------------------------
# 3. The shared-prompt KV cache: generation and scoring
# ---------------------------------------------------------------------------


def wrapped_model(model: Any) -> Any:
    """The transformers model inside a PEFT wrapper, its adapter layers included; any other model as it is.

    A ``peft.PeftModel`` is no ``PreTrainedModel``, but for LoRA it passes every
    call and keyword to the model it wraps, whose linear layers carry the
    adapters, so the checks below look at that model.
    """
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if type(model).__module__.startswith("peft.") and callable(get_base_model) else model


def cache_argument(model) -> str:
    """The keyword under which ``model`` takes a KV cache: ``cache`` or ``past_key_values``.

    transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name still
    works there, with a deprecation warning at every call); earlier versions,
    Colab's among them, know only the old name. The model's own ``forward``
    signature says which one it takes, and ``generate`` takes the same.
    """
    try:
        parameters = inspect.signature(wrapped_model(model).forward).parameters
    except (TypeError, ValueError):  # not introspectable: the name every version accepts
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def returned_cache(output):
    """The KV cache a forward pass returned (None if it returned none), under either name."""
    fields = getattr(output, "__dataclass_fields__", {})
    return getattr(output, "cache" if "cache" in fields else "past_key_values", None)


def generation_can_share_prompts(model: Any) -> bool:
    """Whether ``generate`` may start from :func:`shared_prompt_cache`: a transformers causal LM that uses
    the default (dynamic) KV cache.

    Anything else (a stand-in model in a test, a static-cache configuration)
    generates without the shared prompt cache, which gives the same samples.
    """
    from transformers import PreTrainedModel

    model = wrapped_model(model)
    if not isinstance(model, PreTrainedModel) or getattr(model.config, "is_encoder_decoder", False):
        return False
    if getattr(model.config, "use_cache", True) is False:
        return False
    return getattr(model.generation_config, "cache_implementation", None) in (None, "dynamic")


def shared_prompt_cache(model: Any, ids: torch.Tensor, mask: torch.Tensor, group_size: int) -> Any:
    """The KV cache of the B prompts (all but their last token), repeated G times, group by group.

    A group's G completions share one prompt, so ``generate`` need not encode it G
    times: we run the prompts once, repeat the cache along the batch, and let
    ``generate`` start from the prompts' last token. Positions come from the
    attention mask, as ``generate`` (and the scorer) compute them, so the
    completions are sampled from the same distribution as without the shared
    cache; with long prompts this roughly halves the cost of a rollout.
    """
    position_ids = (mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # [B, Tp]
    out = model(
        input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=position_ids[:, :-1],
        use_cache=True, logits_to_keep=1,
    )
    cache = returned_cache(out)
    cache.batch_repeat_interleave(group_size)  # [B, ...] -> [B*G, ...], group by group
    return cache


def can_share_prompts(model) -> bool:
    """Whether :func:`shared_prompt_logits` gives the plain pass's numbers for ``model`` now.

    It needs a transformers causal LM (whose forward takes and returns a KV
    cache), no gradient checkpointing while training (transformers turns the
    cache off then), and no active dropout while training (one shared prompt
    pass would give a group's G rows one dropout mask, not G).
    """
    from transformers import PreTrainedModel

    model = wrapped_model(model)
    if not isinstance(model, PreTrainedModel) or getattr(model.config, "is_encoder_decoder", False):
        return False
    if not model.training:
        return True
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) is True:  # what transformers' flag reads
            return False
        if isinstance(module, torch.nn.Dropout) and module.p > 0:
            return False
        rate = getattr(module, "attention_dropout", None)
        if isinstance(rate, float) and rate > 0:
            return False
    return True


def shared_prompt_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_length: int):
    """The completion logits of the scoring pass, each distinct prompt encoded once.

    What :func:`~grpo_tutorial.logprobs.completion_logprobs` scores with ``share_prompts=True``.

    In a GRPO batch the G completions of a prompt share it token for token, so
    the plain pass encodes every prompt G times. Here the U distinct prompts
    [U, Tp] go through the model once; their KV cache is copied to the N rows
    (an indexing op, so gradients from all N rows flow back into the one prompt
    pass), and the completions [N, Tc-1] run on top of it. The last
    completion token is never fed in: nothing after it is scored.

    Returns ``[first, rest]``: the logits at the prompts' last position
    ``[N, 1, V]`` (they score completion token 0) and at completion positions
    ``0..Tc-2`` ``[N, Tc-1, V]`` (they score tokens 1..Tc-1); or None when
    sharing does not apply (see :func:`can_share_prompts`) or no prompt repeats.
    """
    Tp = input_ids.shape[1] - completion_length
    prompt_ids, prompt_mask = input_ids[:, :Tp], attention_mask[:, :Tp]  # [N, Tp] x2
    key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)  # [N, 2*Tp]
    distinct, row_prompt = torch.unique(key, dim=0, return_inverse=True)  # [U, 2*Tp], [N]
    if distinct.shape[0] == input_ids.shape[0] or not can_share_prompts(model):
        return None
    u_ids, u_mask = distinct[:, :Tp], distinct[:, Tp:].to(attention_mask.dtype)  # [U, Tp] x2
    out = model(
        input_ids=u_ids,
        attention_mask=u_mask,
        position_ids=(u_mask.long().cumsum(dim=-1) - 1).clamp(min=0),  # [U, Tp]
        use_cache=True,
        logits_to_keep=1,
    )
    first = out.logits[row_prompt]  # [N, 1, V]
    if completion_length == 1:
        return [first]
    cache = returned_cache(out)
    if cache is None:  # the model declined to return a cache: score in full
        return None
    cache.batch_select_indices(row_prompt)  # [U, ...] -> [N, ...]
    position_ids = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # [N, Tp+Tc]
    rest = model(
        input_ids=input_ids[:, Tp:-1],  # [N, Tc-1]
        attention_mask=attention_mask[:, :-1],  # [N, Tp+Tc-1]: the cached prompt, then these tokens
        position_ids=position_ids[:, Tp:-1],  # [N, Tc-1]
        use_cache=True,
        **{cache_argument(model): cache},
    ).logits  # [N, Tc-1, V]
    return [first, rest]


# ---------------------------------------------------------------------------
# 4. A static KV cache for generation
# ---------------------------------------------------------------------------

#: The prompts of a static-cache ``generate`` call are left-padded to a multiple of this many tokens, so that
#: prompts of similar lengths share one compiled decoding step (a GSM8K prompt with Qwen's template: 100-250).
PROMPT_BUCKET = 64


def bucket_width(length: int, at_least: int = 0, bucket: int = PROMPT_BUCKET) -> int:
    """The padded prompt width for a static cache: ``max(length, at_least)`` rounded up to a multiple of ``bucket``.

    >>> bucket_width(150), bucket_width(64), bucket_width(10, at_least=130)
    (192, 64, 192)
    """
    if length < 1 or at_least < 0 or bucket < 1:
        raise ValueError(f"bucket_width needs length >= 1, at_least >= 0 and bucket >= 1; got {length}, {at_least}, "
                         f"{bucket}")
    return -(-max(length, at_least) // bucket) * bucket


def static_cache_kwargs() -> dict[str, Any]:
    """``generate``'s arguments for a static KV cache (transformers compiles its decoding step on a CUDA GPU)."""
    return {"cache_implementation": "static"}

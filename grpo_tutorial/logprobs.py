"""Stage 4 of a GRPO step: per-token log-probabilities and the completion mask.

The policy's probability of a completion factorises over tokens,
log pi(o | q) = sum_t log pi(o_t | q, o_<t), and GRPO works with the per-token
terms: ratios, clipping and the KL penalty are all applied token by token.
"""

from __future__ import annotations

import inspect

import torch

from ._checks import require_tensor

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
    :func:`token_entropy`: one logsumexp per position serves both, and no
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


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Log-probability of each given token under the logits.

    ``log_softmax(logits).gather(tokens)`` gives the same numbers but keeps a full
    ``[N, T, V]`` log-softmax alive for the backward pass. Here we gather the one
    logit we need and subtract the log-normaliser: logit[token] - logsumexp(logits),
    block by block (:func:`score_tokens`), so autograd keeps only the logits
    themselves, the token ids and one normaliser per position.

    Args:
        logits: ``[N, T, V]`` unnormalised scores.
        tokens: ``[N, T]`` token ids in ``[0, V)``.

    Returns:
        ``[N, T]`` log-probs, in float32 (half-precision logits are scored in
        float32 one block at a time).
    """
    require_tensor("logits", logits, dim=3, floating=True)
    require_tensor("tokens", tokens, dim=2, floating=False)
    if tuple(tokens.shape) != tuple(logits.shape[:2]):
        raise ValueError(
            f"tokens has shape {tuple(tokens.shape)} but logits has shape {tuple(logits.shape)}; "
            "expected tokens [N, T] matching logits [N, T, V]"
        )
    vocab = logits.shape[-1]
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab):
        raise ValueError(f"token ids must lie in [0, {vocab}), got min {int(tokens.min())}, max {int(tokens.max())}")
    return score_tokens(logits, tokens)


def completion_mask(completion_ids: torch.Tensor, eos_token_id) -> torch.Tensor:
    """1.0 for every completion token up to and including the first EOS, 0.0 after it.

    A completion with no EOS (truncated at the token budget) is all ones. Whatever
    ``generate`` wrote after the EOS (padding) is masked out.

    Args:
        completion_ids: ``[N, T]`` generated token ids.
        eos_token_id: an int, or a list of ints (any of them ends a completion).

    Returns:
        ``[N, T]`` float mask.
    """
    require_tensor("completion_ids", completion_ids, dim=2, floating=False)
    if eos_token_id is None:
        raise ValueError("eos_token_id is None: the tokenizer needs an EOS token to mask completions")
    eos_ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not eos_ids or not all(isinstance(e, int) for e in eos_ids):
        raise TypeError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))  # [N, T]
    T = completion_ids.shape[1]
    first_eos = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), T)  # [N]
    positions = torch.arange(T, device=completion_ids.device)  # [T]
    return (positions[None, :] <= first_eos[:, None]).float()  # [N, T]


def completion_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_length: int,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    entropy_grad: bool = False,
    share_prompts: bool = False,
):
    """Per-token log-probs of the last ``completion_length`` tokens of each row.

    ``input_ids`` is the (left-padded) prompt followed by the completion. The
    logits at position t predict token t+1, so we keep the logits of the last
    ``completion_length + 1`` positions and drop the final one.

    Position ids come from the attention mask, as ``generate`` computes them: with
    left padding, the first real token of every row sits at position 0. Rotary
    embeddings (Qwen2, Llama) only see relative positions, so for them a shift is
    harmless; a model with absolute position embeddings (GPT-2) would score a
    padded row differently from how it sampled it, and the first ratio would not
    be 1. Matching ``generate`` keeps the function correct for both.

    Logits are divided by ``temperature``, the distribution the tokens were sampled
    from, so that old and new log-probs describe the same sampler.

    ``share_prompts=True`` runs each distinct prompt through the model once and
    lets every row with that prompt read its KV cache (see
    :func:`shared_prompt_logits`): a GRPO batch holds each prompt G times, so
    this skips (G-1)/G of the prompt work, forward and backward. The numbers are
    the same up to float rounding. Where the cache cannot be shared (gradient
    checkpointing, active dropout, a model that is not a transformers causal LM,
    or no prompt repeats) the plain pass runs.

    Returns:
        ``[N, Tc]`` log-probs, or ``(logp, entropy)`` with the per-token entropy
        ``[N, Tc]`` when ``return_entropy``: without gradient, unless
        ``entropy_grad`` (an entropy bonus in the loss needs its gradient).
    """
    require_tensor("input_ids", input_ids, dim=2, floating=False)
    require_tensor("attention_mask", attention_mask, dim=2)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids has {tuple(input_ids.shape)}"
        )
    if not (isinstance(completion_length, int) and 0 < completion_length < input_ids.shape[1]):
        raise ValueError(
            f"completion_length must be an int in [1, {input_ids.shape[1] - 1}], got {completion_length!r}"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score tokens, got {temperature}")
    tokens = input_ids[:, -completion_length:]  # [N, Tc]
    pieces = shared_prompt_logits(model, input_ids, attention_mask, completion_length) if share_prompts else None
    if pieces is None:
        position_ids = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # [N, T]
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            logits_to_keep=completion_length + 1,
            use_cache=False,
        )
        pieces = [out.logits]  # [N, Tc+1, V]: the last position scores nothing (score_tokens skips it)
    # each piece covers some completion positions: [N, t, V] (t+1 for the full pass), the t's add up to Tc
    scored, start = [], 0
    for logits in pieces:
        end = min(start + logits.shape[1], tokens.shape[1])
        scored.append(_score(logits, tokens[:, start:end], temperature, return_entropy, entropy_grad))
        start = end
    logp = torch.cat([s[0] for s in scored], dim=1)  # [N, Tc]
    if not return_entropy:
        return logp
    return logp, torch.cat([s[1] for s in scored], dim=1)  # [N, Tc] x2


def _score(logits: torch.Tensor, tokens: torch.Tensor, temperature: float, return_entropy: bool, entropy_grad: bool):
    """Log-probs (and entropies) of ``tokens`` [N, t] under ``logits`` [N, >=t, V] at ``temperature``."""
    if not return_entropy:
        return score_tokens(logits, tokens, temperature=temperature), None
    return score_tokens(logits, tokens, temperature=temperature, entropy=True, entropy_grad=entropy_grad)  # [N, t] x2


def can_share_prompts(model) -> bool:
    """Whether :func:`shared_prompt_logits` gives the plain pass's numbers for ``model`` now.

    It needs a transformers causal LM (whose forward takes and returns a KV
    cache), no gradient checkpointing while training (transformers turns the
    cache off then), and no active dropout while training (one shared prompt
    pass would give a group's G rows one dropout mask, not G).
    """
    from transformers import PreTrainedModel

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
    """The completion logits of :func:`completion_logprobs`, each distinct prompt encoded once.

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


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at every position: ``[N, T, V] -> [N, T]``.

    The definition, -sum_j p_j log p_j with p = softmax(logits), written for
    reading; the trainer gets the same numbers from :func:`score_tokens`, which
    shares the logsumexp with the log-probs and works block by block.
    """
    logits = logits.float()
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)  # [N, T, 1]
    probs = torch.exp(logits - log_z)  # [N, T, V]
    return (log_z.squeeze(-1) - (probs * logits).sum(dim=-1))  # [N, T]


def rollout_logprobs(
    model,
    rollout,
    rows: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    entropy_grad: bool = False,
    share_prompts: bool = False,
):
    """:func:`completion_logprobs` of a :class:`~grpo_tutorial.rollout.Rollout`'s completions.

    ``rows`` (``[M]`` indices, default all N) picks the completions: a
    micro-batch of the gradient pass. Same return value as
    :func:`completion_logprobs`, ``[M, Tc]`` (and the entropy).
    """
    input_ids, attention_mask = rollout.input_ids, rollout.attention_mask  # [N, Tp+Tc] x2
    if rows is not None:
        input_ids, attention_mask = input_ids[rows], attention_mask[rows]  # [M, Tp+Tc] x2
    return completion_logprobs(
        model, input_ids, attention_mask, rollout.completion_ids.shape[1], temperature=temperature,
        return_entropy=return_entropy, entropy_grad=entropy_grad, share_prompts=share_prompts,
    )


@torch.no_grad()
def score_rollout(
    model,
    rollout,
    *,
    temperature: float = 1.0,
    chunk: int | None = None,
    return_entropy: bool = False,
    share_prompts: bool = False,
):
    """Stages 4 and 5: log-probs (and entropy) of all N completions, in eval mode, without gradient.

    The old policy's log-probs and the reference's are scored this way: ``chunk``
    completions at a time (the micro-batch size; None = all at once), with
    dropout off (the model's train/eval mode is restored afterwards).

    Returns ``[N, Tc]`` log-probs, or ``(logp, entropy)`` when ``return_entropy``.
    """
    n = len(rollout)
    chunk = n if chunk is None else chunk
    was_training = model.training
    model.eval()
    try:
        parts = [
            rollout_logprobs(
                model, rollout, torch.arange(i, min(i + chunk, n)), temperature=temperature,
                return_entropy=return_entropy, share_prompts=share_prompts,
            )
            for i in range(0, n, chunk)
        ]
    finally:
        model.train(was_training)
    if return_entropy:
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])  # [N, Tc] x2
    return torch.cat(parts)  # [N, Tc]


def cache_argument(model) -> str:
    """The keyword under which ``model`` takes a KV cache: ``cache`` or ``past_key_values``.

    transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name still
    works there, with a deprecation warning at every call); earlier versions,
    Colab's among them, know only the old name. The model's own ``forward``
    signature says which one it takes, and ``generate`` takes the same.
    """
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # not introspectable: the name every version accepts
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def returned_cache(output):
    """The KV cache a forward pass returned (None if it returned none), under either name."""
    fields = getattr(output, "__dataclass_fields__", {})
    return getattr(output, "cache" if "cache" in fields else "past_key_values", None)


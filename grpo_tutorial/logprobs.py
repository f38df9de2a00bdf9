"""Stage 4 of a GRPO step: per-token log-probabilities of the sampled completions.

The policy's probability of a completion factorises over tokens,
log pi(o | q) = sum_t log pi(o_t | q, o_<t), and GRPO works with the per-token
terms: ratios, clipping and the KL penalty are all applied token by token.

This module is the method: which tokens are scored, under which distribution,
and how a rollout's rows reach the model. Two speed-ups do the heavy lifting on a
real model, and live in :mod:`grpo_tutorial.speedups` so that this page reads as
the method: the log-softmax is taken block by block
(:func:`~grpo_tutorial.speedups.score_tokens`, the same bits as the plain
formula), and ``share_prompts=True`` encodes each distinct prompt once
(:func:`~grpo_tutorial.speedups.shared_prompt_logits`, the same numbers up to
float rounding). The completion mask is built where completions are cut, in
stage 1 (:func:`~grpo_tutorial.rollout.completion_mask`), and is importable here
too.
"""

from __future__ import annotations

import torch

from ._checks import require_tensor
from .rollout import completion_mask
from .speedups import score_tokens, shared_prompt_logits

__all__ = [
    "completion_logprobs",
    "completion_mask",
    "rollout_logprobs",
    "score_rollout",
    "token_entropy",
    "token_logprobs",
]


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Log-probability of each given token under the logits.

    ``log_softmax(logits).gather(tokens)`` gives the same numbers but keeps a full
    ``[N, T, V]`` log-softmax alive for the backward pass. Here we gather the one
    logit we need and subtract the log-normaliser: logit[token] - logsumexp(logits),
    block by block (:func:`~grpo_tutorial.speedups.score_tokens`), so autograd
    keeps only the logits themselves, the token ids and one normaliser per
    position.

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


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at every position: ``[N, T, V] -> [N, T]``.

    The definition, -sum_j p_j log p_j with p = softmax(logits), written for
    reading; the trainer gets the same numbers from
    :func:`~grpo_tutorial.speedups.score_tokens`, which shares the logsumexp
    with the log-probs and works block by block.
    """
    logits = logits.float()
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)  # [N, T, 1]
    probs = torch.exp(logits - log_z)  # [N, T, V]
    return (log_z.squeeze(-1) - (probs * logits).sum(dim=-1))  # [N, T]


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
    :func:`~grpo_tutorial.speedups.shared_prompt_logits`): a GRPO batch holds
    each prompt G times, so this skips (G-1)/G of the prompt work, forward and
    backward. The numbers are
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
    """Stage 4 (score): log-probs (and entropy) of all N completions, in eval mode, without gradient.

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

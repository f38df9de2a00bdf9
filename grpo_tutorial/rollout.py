"""Stage 1 of a GRPO step (sample): rollouts. B prompts x G completions from ONE batched ``generate`` call.

GRPO needs a *group* of G completions for every prompt, so that each completion
can be compared with its siblings. The expensive part of a step is producing
them, and the cheap way to do it is a single batched call:

1. render each prompt (a chat template for instruct models, the raw text for the
   tiny model) and tokenize it;
2. left-pad the B prompts to a common length, so every row ends where the
   completion starts;
3. repeat each prompt G times, group by group (all G copies of prompt 0 first);
4. call ``model.generate`` once on all B*G rows, with the KV cache on;
5. cut the output into prompt and completion, and mask everything after the
   first EOS.

Nothing here loops over completions one at a time.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import torch

from ._checks import check_flag, check_int, require_tensor
from .chat import is_chat_messages
from .speedups import (
    bucket_width, cache_argument, generation_can_share_prompts, onednn_linears, shared_prompt_cache,
    static_cache_kwargs, use_onednn,
)

__all__ = [
    "Rollout", "completion_mask", "concat_groups", "encode_prompts", "generate_rollouts", "generate_from_ids",
    "merge_sampler_stats", "pad_token_id", "render_prompts", "sampling_kwargs", "uses_chat_template",
]


@dataclass
class Rollout:
    """Everything one batched generation produced, row by row.

    There are N = B*G rows, ordered group by group: rows ``0..G-1`` are the G
    completions of prompt 0, the next G rows belong to prompt 1, and so on.

    Attributes:
        prompt_ids: [N, Tp] prompt token ids, left-padded.
        prompt_mask: [N, Tp] 1 for real prompt tokens, 0 for left padding.
        completion_ids: [N, Tc] generated token ids (pad after EOS).
        completion_mask: [N, Tc] float, 1.0 up to and including the first EOS.
        completions: N decoded completion texts (special tokens removed).
        truncated: [N] bool, True where no EOS appeared within max_new_tokens.
        prompt_index: [N] long, which of the B prompts each row belongs to.
        prompts: N prompts as given (before any chat template), one per row.
        group_size: G.
        sampler_logprobs: [N, Tc] float, or None: the sampler's own log-probs of
            the tokens it sampled, when the sampler is not the policy being
            trained (a sampler copy of :mod:`grpo_tutorial.sampling.copies`; 0 on
            padding, NaN where the sampler could not give one). None (the
            default sampler): the policy sampled, and stage 4 scores it.
        sampler_stats: what a fast sampler (:mod:`grpo_tutorial.sampling.fast`)
            measured while it wrote this rollout, for the history row
            (``sampler/decode_ms``, ``sampler/compile_seconds``,
            ``sampler/fallbacks``); None for the plain ``generate`` call.
        tool_mask: [N, Tc] float, 0 on the tokens a tool wrote, 1 elsewhere (padding
            included, as TRL pads it); None without tools (:mod:`grpo_tutorial.tools`).
        tool_calls, tool_failures: [N] long, the tool calls each row made and how
            many of them failed; None without tools.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    completions: list[str]
    truncated: torch.Tensor
    prompt_index: torch.Tensor
    prompts: list[Any]
    group_size: int
    sampler_logprobs: torch.Tensor | None = None
    sampler_stats: dict[str, float] | None = None
    tool_mask: torch.Tensor | None = None
    tool_calls: torch.Tensor | None = None
    tool_failures: torch.Tensor | None = None

    @property
    def loss_mask(self) -> torch.Tensor:
        """[N, Tc] the tokens the policy wrote: ``completion_mask * tool_mask`` (TRL's), the completion mask
        without tools. The loss, its KL term and its normalisers count these; the tool's tokens are only read."""
        return self.completion_mask if self.tool_mask is None else self.completion_mask * self.tool_mask

    @property
    def input_ids(self) -> torch.Tensor:
        """[N, Tp+Tc] prompt and completion side by side (what the policy scores)."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """[N, Tp+Tc] 1 for every token the policy should attend to."""
        completion_attention = self.completion_mask.to(self.prompt_mask.dtype)  # [N, Tc]
        return torch.cat([self.prompt_mask, completion_attention], dim=1)

    @property
    def completion_lengths(self) -> torch.Tensor:
        """[N] number of completion tokens (including the EOS, if any)."""
        return self.completion_mask.sum(dim=1)

    def completion_id_lists(self) -> list[list[int]]:
        """Each completion's token ids up to and including its first EOS (all of them if truncated).

        The ``completion_ids`` that reward functions receive, in TRL's format: one
        plain list per row, padding removed, so ``len(ids)`` is the completion's length.
        """
        ids = self.completion_ids.cpu().tolist()  # [N][Tc]
        lengths = self.completion_lengths.long().cpu().tolist()  # [N]
        return [row[:length] for row, length in zip(ids, lengths)]

    @property
    def num_prompts(self) -> int:
        """B, the number of distinct prompts."""
        return len(self.prompts) // self.group_size

    def __len__(self) -> int:
        return len(self.completions)


def uses_chat_template(tokenizer: Any, use_chat_template: bool | None) -> bool:
    """Whether prompts go through the tokenizer's chat template (``use_chat_template``: None = when it has one)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if use_chat_template is None:
        return has_template
    if not isinstance(use_chat_template, bool):
        raise TypeError(
            f"use_chat_template must be True, False or None (auto), got {use_chat_template!r}"
        )
    if use_chat_template and not has_template:
        raise ValueError(
            "use_chat_template=True, but the tokenizer has no chat_template; "
            "pass use_chat_template=False (or None) for a base or tiny model"
        )
    return use_chat_template


def render_prompts(
    tokenizer: Any,
    prompts: Sequence[str | list[dict]],
    *,
    system_prompt: str | None = None,
    use_chat_template: bool | None = None,
    tools: Sequence[Any] | None = None,
) -> list[str]:
    """Turn raw prompts into the exact text the model sees.

    With a chat template (instruct models) a string prompt becomes a user
    message, after an optional system message, followed by the assistant header;
    a prompt given as a list of messages is used as it is (with the system
    message put first if it has none). Without a template (the tiny model) the
    prompt text is used as it is.
    """
    if uses_chat_template(tokenizer, use_chat_template):
        rendered = []
        for prompt in prompts:
            messages = list(prompt) if is_chat_messages(prompt) else [{"role": "user", "content": prompt}]
            if system_prompt is not None and messages[0].get("role") != "system":
                messages.insert(0, {"role": "system", "content": system_prompt})
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                 **({} if tools is None else {"tools": list(tools)}))
            rendered.append(text)
        return rendered
    chats = [i for i, p in enumerate(prompts) if is_chat_messages(p)]
    if chats:
        raise ValueError(
            f"prompts[{chats[0]}] is a list of chat messages, but the tokenizer has no chat_template "
            "(or use_chat_template=False); give plain-text prompts for this model"
        )
    if tools is not None:
        raise ValueError("tools= are described to the model by its chat template; this tokenizer has none (or "
                         "use_chat_template=False): a model without one calls its tool inline (tools.InlineCalls)")
    if system_prompt is not None:
        raise ValueError(
            f"system_prompt={system_prompt!r} needs a chat template, but prompts are used "
            "as plain text here (the tokenizer has no chat_template or use_chat_template=False); "
            "drop the system prompt or put the instruction into the prompt itself"
        )
    return list(prompts)


def _left_pad(rows: list[list[int]], pad_id: int, width: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to one length (the longest, or ``width`` if more). Returns ids [B, Tp] and mask [B, Tp]."""
    width = max(width, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [B, Tp]
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, Tp]
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids, mask


def _model_device(model: torch.nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


@contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed torch inside the block and leave the caller's RNG state untouched."""
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def encode_prompts(
    tokenizer: Any,
    prompts: Sequence[str | list[dict]],
    *,
    system_prompt: str | None = None,
    use_chat_template: bool | None = None,
    tools: Sequence[Any] | None = None,
) -> list[list[int]]:
    """The token ids of each prompt, exactly as :func:`generate_rollouts` feeds them to the model.

    The text is :func:`render_prompts`'s. The tokenizer adds its special tokens
    (a BOS, for example) only when there is no chat template: a template writes
    its own. A benchmark that counts prompt tokens calls this, so it counts what
    the trainer encodes.
    """
    texts = render_prompts(tokenizer, prompts, system_prompt=system_prompt, use_chat_template=use_chat_template,
                           tools=tools)
    add_special = not uses_chat_template(tokenizer, use_chat_template)  # templates add their own
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=add_special)["input_ids"]]


def _check_args(
    prompts: Any, group_size: Any, max_new_tokens: Any, temperature: Any, top_p: Any, do_sample: Any
) -> None:
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of strings, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("prompts is empty; expected at least one prompt")
    for i, p in enumerate(prompts):
        if not (isinstance(p, str) or is_chat_messages(p)):
            raise TypeError(
                f"prompts[{i}] must be a str or a list of chat messages "
                f"[{{'role': ..., 'content': ...}}], got {type(p).__name__}: {p!r:.80}"
            )
    check_int(None, "group_size", group_size, 1)
    check_int(None, "max_new_tokens", max_new_tokens, 1)
    check_flag(None, "do_sample", do_sample)
    if do_sample:
        if not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(f"temperature must be a number > 0 when sampling, got {temperature!r}")
        if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def pad_token_id(tokenizer: Any) -> int:
    """The id prompts are left-padded and completions right-padded with: the tokenizer's pad token, else its EOS."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return tokenizer.eos_token_id if pad is None else pad


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every token id that ends a completion: the tokenizer's EOS and the model's.

    Instruct checkpoints often list several (Qwen2.5-Instruct stops at both
    ``<|im_end|>`` and ``<|endoftext|>``). Stopping, masking and the truncation
    flag must all use the same list, or text after the second kind of EOS would
    be rewarded and trained on.
    """
    ids: list[int] = []
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (tokenizer.eos_token_id, config_eos):
        if value is None:
            continue
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if int(token) not in ids:
                ids.append(int(token))
    return ids


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


def _generation_kwargs(
    model: Any, tokenizer: Any, *, max_new_tokens: int, temperature: float, top_p: float, do_sample: bool
) -> dict[str, Any]:
    """Arguments for ``generate`` that sample from exactly softmax(logits / T).

    A checkpoint's own generation config may ask for top-k, a repetition penalty
    and so on. Those would make the sampling distribution differ from the one
    the log-probs are computed under, so each is switched off explicitly (a value
    left as None would be filled in from the checkpoint's config).
    """
    kwargs: dict[str, Any] = dict(
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        eos_token_id=stop_token_ids(model, tokenizer),
        pad_token_id=pad_token_id(tokenizer),
        use_cache=True,
        num_beams=1,
        num_return_sequences=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
    )
    if do_sample:
        kwargs.update(temperature=float(temperature), top_p=float(top_p), top_k=0, typical_p=1.0)
        if getattr(getattr(model, "generation_config", None), "min_p", None) is not None:
            kwargs["min_p"] = 0.0
    return kwargs


def sampling_kwargs(config: Any, **overrides: Any) -> dict[str, Any]:
    """A run's sampling settings as :func:`generate_rollouts`' keyword arguments: how every run samples.

    ``config`` is a :class:`~grpo_tutorial.config.GRPOConfig` (its group size,
    token budget, temperature, ``top_p``, system prompt, chat template and
    ``onednn_generation``), sampled (``do_sample=True``). Every caller that
    samples as a run does goes through here, so a new sampling setting reaches all
    of them; a caller that must differ says so in ``overrides`` (an evaluation:
    ``group_size=1, do_sample=False``; a seed: ``generator_seed=...``), which
    must be :func:`generate_rollouts`' own keywords.
    """
    unknown = sorted(set(overrides) - _ROLLOUT_KEYWORDS)
    if unknown:
        raise TypeError(f"sampling_kwargs() got {unknown}, which generate_rollouts() does not take")
    kwargs: dict[str, Any] = dict(
        group_size=config.group_size, max_new_tokens=config.max_new_tokens, temperature=config.temperature,
        top_p=config.top_p, do_sample=True, system_prompt=config.system_prompt,
        use_chat_template=config.use_chat_template, onednn=config.onednn_generation,
    )
    return {**kwargs, **overrides}


def generate_rollouts(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str | list[dict]],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    do_sample: bool = True,
    system_prompt: str | None = None,
    use_chat_template: bool | None = None,
    generator_seed: int | None = None,
    onednn: bool | None = None,
    static_cache: bool = False,
    prompt_width: int = 0,
    logits_processor: Sequence[Any] = (),
    stopping_criteria: Sequence[Any] = (),
    tools: Sequence[Any] | None = None,
) -> Rollout:
    """Sample ``group_size`` completions for each prompt in ONE ``generate`` call.

    Args:
        model: a causal LM with ``generate`` (a transformers model).
        tokenizer: its tokenizer; needs an ``eos_token_id``.
        prompts: B prompts: strings, or lists of chat messages (chat models).
        group_size: G completions per prompt.
        max_new_tokens: the completion budget; a completion without EOS within it
            is marked ``truncated``.
        temperature, top_p: sampling parameters (top-k and repetition penalties
            are always off, so the samples follow softmax(logits / T)).
        do_sample: False for greedy decoding (evaluation uses it with G = 1).
        system_prompt: optional system message (chat template only).
        use_chat_template: None = use it when the tokenizer has one.
        generator_seed: if given, sampling is seeded with it and the global torch
            RNG state is left as it was.
        onednn: multiply the linear layers with oneDNN during generation
            (:mod:`grpo_tutorial.speedups`; batched decoding of SmolLM2 ran
            about 1.6 times faster on the book's CPU). None = yes for a float32
            model on the CPU when PyTorch has the operators
            (:func:`~grpo_tutorial.speedups.use_onednn`); False = the model's own
            layers.
        static_cache: generate with a static KV cache
            (:func:`~grpo_tutorial.speedups.static_cache_kwargs`; transformers
            compiles the decoding step on a CUDA GPU). The prompts are then
            left-padded to at least ``prompt_width`` tokens, rounded up to a
            multiple of :data:`~grpo_tutorial.speedups.PROMPT_BUCKET`, so that
            calls with similar prompts reuse one compiled step; the extra
            padding is cut off again, so the rollout is the one the plain call
            would return (its samples equal up to float rounding). Each prompt is
            then encoded G times (the shared-prompt cache is a dynamic one).
        prompt_width: see ``static_cache`` (ignored without it).
        logits_processor: extra ``transformers`` logits processors for
            ``generate`` (the float16 sampler's non-finite guard,
            :class:`~grpo_tutorial.sampling.fast.NonFiniteGuard`).
        stopping_criteria: extra ``transformers`` stopping criteria, per row
            (:mod:`grpo_tutorial.tools` stops a row at a tool call; the rest of the
            row is padding, which the caller cuts off).
        tools: functions the chat template describes in each prompt, as TRL renders
            its prompts (:mod:`grpo_tutorial.tools`' chat route); None: none.

    Returns:
        A :class:`Rollout` with N = B*G rows, ordered group by group.

    The model is put in eval mode for generation and then returned to the mode
    it was in.
    """
    _check_args(prompts, group_size, max_new_tokens, temperature, top_p, do_sample)
    check_flag(None, "static_cache", static_cache)
    check_int(None, "prompt_width", prompt_width, 0)
    if getattr(tokenizer, "eos_token_id", None) is None:
        raise ValueError("tokenizer.eos_token_id is None; generation needs an EOS token to stop at")
    device = _model_device(model)

    # 1. render and tokenize each of the B prompts
    token_rows = encode_prompts(tokenizer, prompts, system_prompt=system_prompt, use_chat_template=use_chat_template,
                                tools=tools)
    _check_prompt_tokens(model, tokenizer, prompts, token_rows, max_new_tokens)

    # 2. left-pad, so every prompt ends where its completion starts
    pad_id = pad_token_id(tokenizer)
    natural = max(len(r) for r in token_rows)  # the plain call's width
    width = _static_width(model, natural, prompt_width, max_new_tokens) if static_cache else natural
    ids, mask = _left_pad(token_rows, pad_id, width)  # [B, Tp], [B, Tp]

    # 3. repeat each prompt G times, group by group
    prompt_ids = ids.repeat_interleave(group_size, dim=0).to(device)  # [N, Tp]
    prompt_mask = mask.repeat_interleave(group_size, dim=0).to(device)  # [N, Tp]
    prompt_index = torch.arange(len(prompts), device=device).repeat_interleave(group_size)  # [N]

    # 4. one batched generate call, KV cache on, eval mode, no gradients
    kwargs = _generation_kwargs(
        model, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature,
        top_p=top_p, do_sample=do_sample,
    )
    if static_cache:
        kwargs.update(static_cache_kwargs())
    if logits_processor:
        from transformers import LogitsProcessorList

        kwargs["logits_processor"] = LogitsProcessorList(logits_processor)
    if stopping_criteria:
        from transformers import StoppingCriteriaList

        kwargs["stopping_criteria"] = StoppingCriteriaList(stopping_criteria)
    seed = generator_seed if do_sample else None  # greedy decoding draws nothing: no RNG to seed
    sequences = _generate(  # [N, Tp+Tc]
        model, prompt_ids, prompt_mask, kwargs, prompts=(ids, mask), group_size=group_size, seed=seed, onednn=onednn,
    )

    # 5. split off the completion and mask everything after the first EOS
    completion_ids = sequences[:, prompt_ids.shape[1] :]  # [N, Tc]
    extra = width - natural  # a static cache's bucket padding: all rows' padding, cut off again
    prompt_ids, prompt_mask = prompt_ids[:, extra:], prompt_mask[:, extra:]  # [N, Tp]
    comp_mask, truncated, completions = _cut_completions(model, tokenizer, completion_ids)

    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=comp_mask,
        completions=completions,
        truncated=truncated,
        prompt_index=prompt_index,
        prompts=[p for p in prompts for _ in range(group_size)],
        group_size=group_size,
    )


def generate_from_ids(
    model: Any,
    tokenizer: Any,
    rows: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    do_sample: bool = True,
    generator_seed: int | None = None,
    onednn: bool | None = None,
    logits_processor: Sequence[Any] = (),
    stopping_criteria: Sequence[Any] = (),
) -> torch.Tensor:
    """One batched ``generate`` call that continues ``rows`` (token ids, left-padded here, never re-tokenized).

    What :mod:`grpo_tutorial.tools` calls after a tool has answered: each row is a prompt,
    its completion so far and the tool's tokens. Sampling as :func:`generate_rollouts`
    samples. Returns the new tokens, ``[n, T_new]`` on the CPU (a row that stopped early
    is padded; the caller cuts each row at its stop).
    """
    from transformers import LogitsProcessorList, StoppingCriteriaList

    ids, mask = _left_pad(rows, pad_token_id(tokenizer))  # [n, T], [n, T]
    device = _model_device(model)
    ids, mask = ids.to(device), mask.to(device)
    kwargs = _generation_kwargs(model, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature,
                                top_p=top_p, do_sample=do_sample)
    if stopping_criteria:
        kwargs["stopping_criteria"] = StoppingCriteriaList(stopping_criteria)
    if logits_processor:
        kwargs["logits_processor"] = LogitsProcessorList(logits_processor)
    out = _generate(model, ids, mask, kwargs, prompts=(ids, mask), group_size=1,
                    seed=generator_seed if do_sample else None, onednn=onednn)  # [n, T + T_new]
    return out[:, ids.shape[1]:].cpu()


#: generate_rollouts' keyword arguments (what :func:`sampling_kwargs` may override).
_ROLLOUT_KEYWORDS = frozenset(
    name for name, p in inspect.signature(generate_rollouts).parameters.items() if p.kind is p.KEYWORD_ONLY
)


def _check_prompt_tokens(
    model: Any, tokenizer: Any, prompts: Sequence[Any], token_rows: list[list[int]], max_new_tokens: int
) -> None:
    """Refuse a prompt that tokenizes to nothing or to unknown tokens, and a budget past the model's context."""
    unk_id = getattr(tokenizer, "unk_token_id", None)
    for i, row in enumerate(token_rows):
        if len(row) == 0:
            raise ValueError(f"prompts[{i}]={prompts[i]!r} tokenizes to zero tokens")
        if unk_id is not None and unk_id in row:
            raise ValueError(
                f"prompts[{i}]={prompts[i]!r} contains characters the tokenizer does not know "
                f"(they became {tokenizer.unk_token!r}); the tiny model's vocabulary is digits, "
                "'+-*=()' and space, so use plain prompts such as '12+34='"
            )
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    longest = max(len(r) for r in token_rows)
    if isinstance(limit, int) and longest + max_new_tokens > limit:
        raise ValueError(
            f"the longest prompt has {longest} tokens; with max_new_tokens={max_new_tokens} that "
            f"exceeds the model's context of {limit} tokens; shorten the prompts or the budget"
        )


def _static_width(model: Any, natural: int, at_least: int, max_new_tokens: int) -> int:
    """A static cache's prompt width: :func:`~grpo_tutorial.speedups.bucket_width`, within the model's context."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    width = bucket_width(natural, at_least)
    return max(natural, min(width, limit - max_new_tokens)) if isinstance(limit, int) else width


def _generate(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    kwargs: dict[str, Any],
    *,
    prompts: tuple[torch.Tensor, torch.Tensor],
    group_size: int,
    seed: int | None,
    onednn: bool | None,
) -> torch.Tensor:
    """The one batched ``generate`` call: eval mode, no gradients, seeded; returns ``[N, Tp+Tc]`` sequences.

    ``prompts`` are the B left-padded prompts (ids and mask, ``[B, Tp]`` each) before
    the G-fold repeat. Two speed-ups of :mod:`grpo_tutorial.speedups` apply when they
    can: the linear layers multiply with oneDNN (``onednn``), and each prompt is
    encoded once, its KV cache copied for the G completions. The model goes back to
    the train/eval mode it was in.
    """
    device = prompt_ids.device
    ids, mask = prompts  # [B, Tp] x2
    fast = onednn_linears(model, rows=len(prompt_ids)) if use_onednn(model, onednn) else nullcontext()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), fast, _seeded(seed, device):
            static = "cache_implementation" in kwargs  # a static cache: no dynamic shared-prompt cache beside it
            if group_size > 1 and ids.shape[1] > 1 and not static and generation_can_share_prompts(model):
                # each prompt is encoded once; its KV cache is copied for the G completions
                kwargs[cache_argument(model)] = shared_prompt_cache(model, ids.to(device), mask.to(device), group_size)
            output = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kwargs)
    finally:
        model.train(was_training)
    return output.sequences if hasattr(output, "sequences") else output  # [N, Tp+Tc]


def _cut_completions(
    model: Any, tokenizer: Any, completion_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """The mask (``[N, Tc]``, 1.0 up to the first stop token), the truncation flags (``[N]``) and the decoded texts."""
    stops = stop_token_ids(model, tokenizer)
    comp_mask = completion_mask(completion_ids, stops)  # [N, Tc]
    has_eos = torch.isin(completion_ids, torch.tensor(stops, device=completion_ids.device)).any(dim=1)  # [N]
    truncated = ~has_eos  # [N]
    lengths = comp_mask.sum(dim=1).long().tolist()
    kept = [row[:n] for row, n in zip(completion_ids.tolist(), lengths)]
    completions = tokenizer.batch_decode(kept, skip_special_tokens=True)
    return comp_mask, truncated, list(completions)


def concat_groups(parts: Sequence[tuple[Rollout, Sequence[int]]], pad_id: int) -> Rollout:
    """One rollout made of chosen groups of several rollouts, in the order given.

    ``parts`` is a list of ``(rollout, group indices)``; DAPO's dynamic sampling
    keeps the groups with a learning signal from several sampling rounds. Each
    round has its own padded widths, so prompts are left-padded and completions
    right-padded (mask 0) to the widest. Padding is masked out everywhere, and
    positions come from the attention mask, so a completion scores the same.
    """
    G = parts[0][0].group_size
    rows = [(r, torch.cat([torch.arange(g * G, (g + 1) * G) for g in groups])) for r, groups in parts if len(groups)]
    if not rows:
        raise ValueError("concat_groups needs at least one group")
    tp = max(r.prompt_ids.shape[1] for r, _ in rows)
    tc = max(r.completion_ids.shape[1] for r, _ in rows)

    def pad(t: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
        extra = width - t.shape[1]
        return torch.nn.functional.pad(t, (extra, 0) if left else (0, extra), value=value)

    def cat(get) -> torch.Tensor:
        return torch.cat([get(r)[i.to(get(r).device)] for r, i in rows])

    n_groups = sum(len(i) // G for _, i in rows)
    return Rollout(
        prompt_ids=cat(lambda r: pad(r.prompt_ids, tp, pad_id, True)),  # [N, Tp]
        prompt_mask=cat(lambda r: pad(r.prompt_mask, tp, 0, True)),  # [N, Tp]
        completion_ids=cat(lambda r: pad(r.completion_ids, tc, pad_id, False)),  # [N, Tc]
        completion_mask=cat(lambda r: pad(r.completion_mask, tc, 0, False)),  # [N, Tc]
        completions=[r.completions[j] for r, i in rows for j in i.tolist()],
        truncated=cat(lambda r: r.truncated),  # [N]
        prompt_index=torch.arange(n_groups, device=rows[0][0].prompt_ids.device).repeat_interleave(G),  # [N]
        prompts=[r.prompts[j] for r, i in rows for j in i.tolist()],
        group_size=G,
        sampler_logprobs=None if any(r.sampler_logprobs is None for r, _ in rows) else cat(
            lambda r: pad(r.sampler_logprobs, tc, 0.0, False)),  # [N, Tc]
        **({} if any(r.tool_mask is None for r, _ in rows) else dict(
            tool_mask=cat(lambda r: pad(r.tool_mask, tc, 1.0, False)),  # [N, Tc]
            tool_calls=cat(lambda r: r.tool_calls), tool_failures=cat(lambda r: r.tool_failures))),  # [N] x2
    )


def merge_sampler_stats(stats: Sequence[dict[str, float] | None]) -> dict[str, float] | None:
    """Several sampling rounds' ``sampler_stats`` as one: ``*_ms`` fields averaged, the others (seconds, counts) summed."""
    given = [s for s in stats if s]
    if not given:
        return None
    keys = dict.fromkeys(k for s in given for k in s)
    return {k: (sum(s[k] for s in given if k in s) / sum(k in s for s in given)) if k.endswith("_ms")
            else sum(s.get(k, 0.0) for s in given) for k in keys}

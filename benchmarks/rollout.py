"""Part a: rollout throughput, one batched ``generate`` call against one call per completion.

Both sides call the package's own ``generate_rollouts`` with the same sampling
settings. The batched side asks for all B*G completions at once (what the trainer
does); the naive side asks for one completion at a time (``group_size=1``, one
prompt), the loop many first GRPO implementations write. Every completion is forced
to exactly ``new_tokens`` tokens (the stop tokens can never be sampled), so both
sides generate the same amount and tokens per second compare like with like.

The stop tokens are suppressed by a logits processor that writes -inf into their
logits in place. transformers' own ``min_new_tokens`` does the same with
``torch.where``, which allocates a fresh [N, V] tensor at every decoding step: on
SmolLM2's 49,152-token vocabulary that is about 20 ms per step for the batched
side's 32 rows (a tenth of its step at one thread) and almost nothing for the
loop's single row, so the harness would tax the side it measures. The sampled
distribution is the same either way: softmax over every token but the stop tokens.

A per-completion loop over all B*G completions would take most of the benchmark's
time budget on SmolLM2, so the naive side times ``naive_completions`` of them; its
tokens per second do not depend on how many completions it generates, because each
call is independent of the others.
"""

from __future__ import annotations

import functools
import math
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from grpo_tutorial.config import GRPOConfig
from grpo_tutorial.rollout import generate_rollouts, sampling_kwargs, stop_token_ids
from grpo_tutorial.speedups import use_onednn
from grpo_tutorial.tasks import make_arithmetic_dataset

from .common import summarize, timed


class NoStopTokens:
    """A logits processor: the stop tokens get logit -inf (in place), so they are never sampled."""

    def __init__(self, stop_ids: list[int]) -> None:
        if not stop_ids:
            raise ValueError("stop_ids is empty: there is no stop token to suppress")
        self.stop_ids = torch.tensor(stop_ids)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores[:, self.stop_ids.to(scores.device)] = -math.inf  # scores: [N, V], generate's own copy
        return scores


@contextmanager
def fixed_length(model: Any, tokenizer: Any) -> Iterator[None]:
    """Every completion runs to the token budget: ``model.generate`` suppresses the stop tokens."""
    from transformers import LogitsProcessorList

    processors = LogitsProcessorList([NoStopTokens(stop_token_ids(model, tokenizer))])
    model.generate = functools.partial(type(model).generate, model, logits_processor=processors)
    try:
        yield
    finally:
        del model.generate  # the class's method again


def generated_tokens(rollout: Any) -> int:
    """Completion tokens a rollout generated (up to and including any EOS)."""
    return int(rollout.completion_mask.sum())


def batched_once(model: Any, tokenizer: Any, prompts: list[str], config: GRPOConfig, seed: int) -> tuple[float, int]:
    """Seconds and tokens for all len(prompts) * group_size completions in one call, sampled as ``config``'s run."""
    seconds, rollout = timed(
        lambda: generate_rollouts(model, tokenizer, prompts, **sampling_kwargs(config, generator_seed=seed))
    )
    return seconds, generated_tokens(rollout)


def naive_once(model: Any, tokenizer: Any, prompts: list[str], completions: int, config: GRPOConfig,
               seed: int) -> tuple[float, int]:
    """Seconds and tokens for ``completions`` completions, one ``generate`` call each (``config``'s settings)."""
    total_seconds, total_tokens = 0.0, 0
    for i in range(completions):
        prompt = prompts[i % len(prompts)]
        seconds, rollout = timed(
            lambda: generate_rollouts(
                model, tokenizer, [prompt], **sampling_kwargs(config, group_size=1, generator_seed=seed + i)
            )
        )
        total_seconds += seconds
        total_tokens += generated_tokens(rollout)
    return total_seconds, total_tokens


def run(
    model: Any,
    tokenizer: Any,
    *,
    model_name: str,
    prompts_per_step: int = 4,
    group_size: int = 8,
    new_tokens: int = 32,
    naive_completions: int = 8,
    repeats: int = 3,
) -> dict[str, Any]:
    """Measure both ways ``repeats`` times each, alternating, after one warm-up call."""
    for name, value in (("prompts_per_step", prompts_per_step), ("group_size", group_size),
                        ("new_tokens", new_tokens), ("naive_completions", naive_completions), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    style = "plain" if model_name == "tiny" else "question"
    prompts = [row["prompt"] for row in make_arithmetic_dataset(prompts_per_step, seed=0, digits=2, style=style)]
    batched_rates, naive_rates, batched_seconds, naive_seconds = [], [], [], []
    config = GRPOConfig(group_size=group_size, max_new_tokens=new_tokens)  # both sides sample as this run would
    with fixed_length(model, tokenizer):
        naive_once(model, tokenizer, prompts, 1, config, seed=99)  # warm-up: first-call overheads
        for r in range(repeats):
            seconds, tokens = batched_once(model, tokenizer, prompts, config, seed=r)
            expected = len(prompts) * group_size * new_tokens
            if tokens != expected:
                raise RuntimeError(f"batched rollout generated {tokens} tokens, expected {expected}")
            batched_seconds.append(seconds)
            batched_rates.append(tokens / seconds)
            seconds, tokens = naive_once(model, tokenizer, prompts, naive_completions, config, seed=1000 * r)
            naive_seconds.append(seconds)
            naive_rates.append(tokens / seconds)
    batched = summarize(batched_rates)
    naive = summarize(naive_rates)
    return {
        "model": model_name,
        "prompts_per_step": prompts_per_step,
        "group_size": group_size,
        "new_tokens": new_tokens,
        "completions_batched": prompts_per_step * group_size,
        "completions_naive": naive_completions,
        "onednn": use_onednn(model, None),  # both sides: generate_rollouts' default
        "batched_tokens_per_s": batched,
        "naive_tokens_per_s": naive,
        "batched_seconds": summarize(batched_seconds),
        "naive_seconds": summarize(naive_seconds),
        # speedup of each repeat, and the ratio of the medians
        "speedup": {**summarize([b / n for b, n in zip(batched_rates, naive_rates)]),
                    "of_medians": batched["median"] / naive["median"]},
        "target": 8.0,
    }

"""Chapter 9's GPU run as one function: a chat model trained with GRPO on GSM8K.

The notebook's GPU branch, a user's script and the test
``tests/test_gsm8k_run.py`` all call the same code:

- :func:`gsm8k_data` loads GSM8K (``load_gsm8k``, online only) and falls back to
  generated word-free arithmetic when the hub cannot be reached;
- :func:`read_gsm8k_jsonl` reads a local copy in GSM8K's own format (one
  ``{"question", "answer": "... #### N"}`` object a line), for offline use;
- :func:`gsm8k_run` takes a loaded model and tokenizer and a preset (by default
  ``"qwen2.5-0.5b-colab-t4"``), turns on gradient checkpointing, evaluates
  greedily on the held-out rows, trains, and evaluates again;
- :func:`estimate_step_seconds` is a roofline estimate of one step's time from
  the FLOPs of generation and training and a GPU's peak FLOP rate and memory
  bandwidth (:data:`T4_FP32_FLOPS`, :data:`T4_BANDWIDTH`).

The chat template, the system prompt, the 256-token budget and the micro-batches
all come from the preset, so nothing here is specific to one model.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .presets import get_preset
from .recipes import paired_gain
from ..rewards import correctness_reward
from ..tasks import DatasetUnavailableError, gsm8k_rows, load_gsm8k, train_test_split_arithmetic
from ..trainer import GRPOConfig, GRPOTrainer

__all__ = [
    "GSM8K_PRESET",
    "T4_BANDWIDTH",
    "T4_FP32_FLOPS",
    "estimate_step_seconds",
    "forward_flops_per_token",
    "gsm8k_data",
    "gsm8k_run",
    "read_gsm8k_jsonl",
]

#: The preset of chapter 9's GPU run.
GSM8K_PRESET = "qwen2.5-0.5b-colab-t4"

#: NVIDIA T4, published peak: 8.1 TFLOP/s in float32 (no tensor cores in fp32).
T4_FP32_FLOPS = 8.1e12
#: NVIDIA T4, published memory bandwidth: 320 GB/s (GDDR6).
T4_BANDWIDTH = 320e9


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def read_gsm8k_jsonl(path: str | os.PathLike) -> list[dict]:
    """Rows (``prompt``, ``answer``, ``solution``) from a GSM8K-format JSONL file.

    Each line is one ``{"question": ..., "answer": "... #### N"}`` object, as in
    the GSM8K release; the answer column becomes the number after ``####``
    (:func:`~grpo_tutorial.tasks.gsm8k_rows`).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GSM8K file at {str(path)!r}; expected a JSONL file with question/answer lines")
    records = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{str(path)!r} line {number} is not JSON ({err.msg}); expected one object a line") from None
    if not records:
        raise ValueError(f"{str(path)!r} holds no GSM8K records")
    return gsm8k_rows(records)


def gsm8k_data(n_eval: int = 200, *, seed: int = 0, timeout: float = 3.0) -> tuple[list[dict], list[dict], str]:
    """GSM8K's train split and the first ``n_eval`` test problems, or a stand-in offline.

    Returns ``(train_rows, eval_rows, source)``. ``source`` says which data it is:
    ``"gsm8k"``, or, when :func:`~grpo_tutorial.tasks.load_gsm8k` raises
    :class:`~grpo_tutorial.tasks.DatasetUnavailableError`, a sentence naming the
    fallback (two-digit ``+``, ``-``, ``*`` questions, 5,000 to train on and
    ``n_eval`` held out, split by ``seed``).
    """
    if isinstance(n_eval, bool) or not isinstance(n_eval, int) or n_eval < 1:
        raise ValueError(f"n_eval must be a positive int, got {n_eval!r}")
    try:
        train_rows, eval_rows = load_gsm8k("train", timeout=timeout), load_gsm8k("test", timeout=timeout)
    except DatasetUnavailableError as err:
        train_rows, eval_rows = train_test_split_arithmetic(
            5000, n_eval, seed, op=["+", "-", "*"], digits=2, style="question"
        )
        return train_rows, eval_rows, f"generated two-digit arithmetic (GSM8K unavailable: {err})"
    return train_rows, eval_rows[:n_eval], "gsm8k"


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def gsm8k_run(
    model: Any,
    tokenizer: Any,
    preset: str | GRPOConfig = GSM8K_PRESET,
    train_rows: Sequence[dict] = (),
    eval_rows: Sequence[dict] = (),
    steps: int = 100,
    *,
    reward_fns: Callable | Sequence[Callable] = correctness_reward,
    gradient_checkpointing: bool = True,
    progress: bool = False,
    **overrides: Any,
) -> dict:
    """Chapter 9's GPU run: evaluate, train ``steps`` GRPO steps, evaluate again.

    Args:
        model, tokenizer: a loaded chat model in float32 (``load_policy(name,
            dtype="float32")``; 16-bit weights do not take updates of size lr,
            chapter 9.3) and its tokenizer. The trainer uses the tokenizer's chat
            template when it has one, with the preset's system prompt.
        preset: a preset name (:func:`~grpo_tutorial.chapters.presets.get_preset`) or a
            ready :class:`~grpo_tutorial.trainer.GRPOConfig`.
        train_rows, eval_rows: ``prompt``/``answer`` rows, e.g. from
            :func:`gsm8k_data` or :func:`read_gsm8k_jsonl`. ``eval_rows`` may be
            empty: then nothing is evaluated.
        steps: GRPO steps.
        reward_fns: the reward (default: ``correctness_reward``, 1 when the
            number ``extract_answer`` finds equals the row's answer).
        gradient_checkpointing: recompute each layer's activations in the
            backward pass instead of storing them (less memory, one more forward).
            Needs a transformers model (``gradient_checkpointing_enable``); it
            stays on after the run.
        progress: show the trainer's progress bar.
        overrides: ``GRPOConfig`` fields to change in a named preset.

    Returns:
        ``config``, ``history`` (one row per step), ``before`` and ``after``
        (:meth:`GRPOTrainer.evaluate <grpo_tutorial.trainer.GRPOTrainer.evaluate>`'s dicts:
        the same prompt, template and budget as training; or None without
        ``eval_rows``), ``gain`` and ``gain_se`` (paired; NaN without
        ``eval_rows``), ``train_seconds`` and ``trainer``.
    """
    if isinstance(preset, GRPOConfig):
        if overrides:
            raise ValueError(f"overrides {sorted(overrides)} need a preset name; change a GRPOConfig with dataclasses.replace")
        config = preset
    else:
        config = get_preset(preset, **overrides)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    train_rows, eval_rows = list(train_rows), list(eval_rows)
    if not train_rows:
        raise ValueError("train_rows is empty; pass prompt/answer rows, e.g. from gsm8k_data()")
    if gradient_checkpointing:
        # transformers 5 renamed it (the old name warns); Colab may have either
        enable = getattr(model, "activation_checkpointing_enable", None) or getattr(
            model, "gradient_checkpointing_enable", None
        )
        if enable is None:
            raise TypeError(
                f"gradient_checkpointing=True needs a transformers model with gradient_checkpointing_enable(); "
                f"got {type(model).__name__} (pass gradient_checkpointing=False)"
            )
        enable()  # active in train mode only: generation (eval mode) keeps its KV cache
    trainer = GRPOTrainer(model, tokenizer, reward_fns, config)
    before = trainer.evaluate(eval_rows) if eval_rows else None
    start = time.perf_counter()
    history = trainer.train(train_rows, steps, progress=progress)
    train_seconds = time.perf_counter() - start
    after = trainer.evaluate(eval_rows) if eval_rows else None
    gain, gain_se = paired_gain(before["correct"], after["correct"]) if eval_rows else (float("nan"), float("nan"))
    return {
        "config": config,
        "history": history,
        "before": before,
        "after": after,
        "gain": gain,
        "gain_se": gain_se,
        "train_seconds": train_seconds,
        "trainer": trainer,
    }


# ---------------------------------------------------------------------------
# How long a step takes on a GPU: a roofline estimate
# ---------------------------------------------------------------------------


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _positive_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def forward_flops_per_token(num_params: int, vocab_size: int, hidden_size: int, *, tied_embeddings: bool) -> int:
    """FLOPs of one token's forward pass: 2 per weight that takes part in a matrix product.

    Every weight does, except the input embedding, which is a table lookup. A
    model with tied embeddings uses that same matrix again as its output layer,
    so all ``num_params`` count; an untied one has a separate output matrix
    (already in ``num_params``) and the lookup table does not count. Attention's
    own products (scores and weighted values, which grow with the context) and
    the norms are left out: for Qwen2.5-0.5B at 400 tokens they add about 3%.

    >>> forward_flops_per_token(100, 10, 2, tied_embeddings=True)
    200
    >>> forward_flops_per_token(100, 10, 2, tied_embeddings=False)
    160
    """
    _positive_int("num_params", num_params)
    _positive_int("vocab_size", vocab_size)
    _positive_int("hidden_size", hidden_size)
    if not isinstance(tied_embeddings, bool):
        raise TypeError(f"tied_embeddings must be a bool, got {tied_embeddings!r}")
    matmul_params = num_params if tied_embeddings else num_params - vocab_size * hidden_size
    if matmul_params < 1:
        raise ValueError(
            f"num_params={num_params} is not more than the embedding table vocab_size*hidden_size="
            f"{vocab_size * hidden_size}; check the numbers"
        )
    return 2 * matmul_params


def estimate_step_seconds(
    *,
    num_params: int,
    vocab_size: int,
    hidden_size: int,
    tied_embeddings: bool,
    prompts: int,
    group_size: int,
    prompt_tokens: int,
    completion_tokens: int,
    num_iterations: int = 1,
    gradient_checkpointing: bool = True,
    reference_model: bool = False,
    weight_bytes: int = 4,
    peak_flops: float = T4_FP32_FLOPS,
    bandwidth: float = T4_BANDWIDTH,
) -> dict[str, float]:
    """A roofline estimate of one GRPO step's seconds on a GPU (a lower bound).

    With ``f`` = :func:`forward_flops_per_token`, ``R = prompts * group_size``
    rows, ``P`` prompt and ``C`` completion tokens per row (every row padded to
    the longest completion, so ``C`` is the budget in the worst case), and
    ``W = num_params * weight_bytes`` bytes of weights:

    - **generation**: one forward over the prompts (``f*R*P`` FLOPs), then
      ``C - 1`` decoding forwards of one token per row (``f*R`` FLOPs each).
      Each forward reads all weights once, so it takes
      ``max(FLOPs / peak_flops, W / bandwidth)``: decoding a few dozen rows is
      limited by memory, not arithmetic.
    - **training**, compute-bound: the old-policy pass (1 forward), the
      reference pass if any (1 forward), and per iteration a forward and a
      backward (3 forwards' worth) plus, with gradient checkpointing, the
      recomputed forward (1). Each costs ``f`` per token over ``R*(P+C)`` tokens.

    It assumes every unit runs at its peak, and leaves out the per-token overhead
    of a generate loop, the KV-cache reads and attention's own products; real
    steps are slower.

    Returns ``generate_flops``, ``train_flops``, ``generate_seconds``,
    ``train_seconds`` and ``seconds`` (their sum).
    """
    f = forward_flops_per_token(num_params, vocab_size, hidden_size, tied_embeddings=tied_embeddings)
    for name, value in (
        ("prompts", prompts),
        ("group_size", group_size),
        ("prompt_tokens", prompt_tokens),
        ("completion_tokens", completion_tokens),
        ("num_iterations", num_iterations),
        ("weight_bytes", weight_bytes),
    ):
        _positive_int(name, value)
    for name, value in (("gradient_checkpointing", gradient_checkpointing), ("reference_model", reference_model)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
    peak = _positive_number("peak_flops", peak_flops)
    bw = _positive_number("bandwidth", bandwidth)

    rows = prompts * group_size
    weight_read = num_params * weight_bytes / bw  # seconds to stream the weights once
    prefill_flops = f * rows * prompt_tokens
    decode_flops = f * rows  # one new token per row
    decode_steps = completion_tokens - 1
    generate_seconds = max(prefill_flops / peak, weight_read) + decode_steps * max(decode_flops / peak, weight_read)
    generate_flops = prefill_flops + decode_steps * decode_flops

    passes = 1 + int(reference_model) + num_iterations * (3 + int(gradient_checkpointing))
    train_flops = f * rows * (prompt_tokens + completion_tokens) * passes
    train_seconds = train_flops / peak
    return {
        "generate_flops": float(generate_flops),
        "train_flops": float(train_flops),
        "generate_seconds": generate_seconds,
        "train_seconds": train_seconds,
        "seconds": generate_seconds + train_seconds,
    }

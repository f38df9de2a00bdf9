"""A short supervised warm start, so GRPO has something to amplify.

GRPO only learns from groups whose rewards differ. A randomly initialised model
answers every problem wrong, every group has reward std 0, and the gradient is
exactly zero (chapter 2). DeepSeek-R1 and most recipes therefore start from a model
with partial skill. For the tiny model we get there with a few hundred steps of
supervised learning on (prompt, answer) pairs, with the loss on answer tokens only.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ._checks import check_int, check_number
from .run.progress import progress_bar

__all__ = ["SFTConfig", "encode_sft_batch", "supervised_warmup", "warm_start_until"]


@dataclass
class SFTConfig:
    """Hyperparameters of the warm start.

    The defaults are the tiny model's first calibration on a 2-core CPU: lr 1e-3
    with a 100-step warmup, batch 64, the loss on the answer tokens only. That
    warm start reached about 30% greedy accuracy in 300 to 450 steps; chapter 8's
    recipe, rather than a fixed ``steps``, stops it when a probe set's accuracy
    reaches its target.
    """

    steps: int = 400
    batch_size: int = 64
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        owner = "SFTConfig"
        check_int(owner, "steps", self.steps, 1)
        check_int(owner, "batch_size", self.batch_size, 1)
        check_int(owner, "warmup_steps", self.warmup_steps, 0)
        check_int(owner, "seed", self.seed, 0)
        check_number(owner, "learning_rate", self.learning_rate, lambda v: v > 0, "a number > 0")
        check_number(owner, "weight_decay", self.weight_decay, lambda v: v >= 0, "a number >= 0")
        check_number(
            owner, "max_grad_norm", self.max_grad_norm, lambda v: v > 0, "None or a number > 0", optional=True
        )


def encode_sft_batch(tokenizer, rows: list[dict]) -> dict[str, torch.Tensor]:
    """Tokenise prompt + answer + EOS, right-padded, with labels only on the answer.

    Returns ``input_ids``, ``attention_mask`` and ``labels`` (-100 on prompt and
    padding positions, the convention of ``transformers``' causal-LM loss).
    """
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer needs eos and pad tokens for supervised training")
    sequences, label_rows = [], []
    for i, row in enumerate(rows):
        if "prompt" not in row or "answer" not in row:
            raise ValueError(f"row {i} needs 'prompt' and 'answer' keys, got {sorted(row)}")
        prompt_ids = tokenizer(row["prompt"])["input_ids"]
        answer_ids = tokenizer(str(row["answer"]), add_special_tokens=False)["input_ids"]
        ids = prompt_ids + answer_ids + [tokenizer.eos_token_id]
        sequences.append(ids)
        label_rows.append([-100] * len(prompt_ids) + answer_ids + [tokenizer.eos_token_id])
    width = max(map(len, sequences))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences])  # [B, T]
    attention_mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])  # [B, T]
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for lab in label_rows])  # [B, T]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def supervised_warmup(
    model,
    tokenizer,
    dataset: list[dict],
    config: SFTConfig | None = None,
    *,
    stop_when=None,
    check_every: int = 50,
    progress: bool = True,
) -> list[dict]:
    """Train on answer tokens with AdamW and linear warm-up; return a loss history.

    Args:
        stop_when: optional callable ``(model) -> bool`` checked every
            ``check_every`` steps (e.g. "greedy accuracy >= 0.3"); training stops
            as soon as it returns True. This is how the tiny-model chapter stops
            at partial skill instead of solving the task by imitation.
    """
    config = config or SFTConfig()
    if not dataset:
        raise ValueError("dataset is empty")
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    warmup = max(1, config.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    rng = random.Random(config.seed)
    order: list[int] = []
    history = []
    bar = None
    if progress:
        bar = progress_bar(total=config.steps, desc="warm start", leave=False)
    start = time.perf_counter()
    model.train()
    for step in range(1, config.steps + 1):
        if len(order) < config.batch_size:
            fresh = list(range(len(dataset)))
            rng.shuffle(fresh)
            order.extend(fresh)
        batch_rows = [dataset[order.pop()] for _ in range(config.batch_size)]
        batch = {k: v.to(device) for k, v in encode_sft_batch(tokenizer, batch_rows).items()}
        loss = model(**batch).loss
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"supervised loss became {loss.item()} at step {step}; lower the learning rate")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        row = {"step": step, "loss": loss.item(), "seconds": time.perf_counter() - start}
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{row['loss']:.3f}")
        if stop_when is not None and step % check_every == 0:
            model.eval()
            done = bool(stop_when(model))
            model.train()
            row["checked"] = True
            row["stopped"] = done
            history.append(row)
            if done:
                break
            continue
        history.append(row)
    if bar is not None:
        bar.close()
    model.eval()
    return history


def warm_start_until(model, tokenizer, dataset: list[dict], config: SFTConfig, probe: Callable[[Any], float] | None,
                     target: float | None, *, check_every: int, progress: bool = True) -> dict:
    """The warm start every recipe and the command line run: supervised steps until ``probe(model) >= target``.

    Torch's RNG is seeded with ``config.seed`` first (so the run after it starts the same however long this ran);
    the probe is checked every ``check_every`` steps (none with ``probe`` or ``target`` None: all
    ``config.steps``). Returns ``steps``, ``seconds``, ``reached`` (the target hit before the last step), ``checks``
    (``(step, probe value)`` at every check) and the loss ``history``; each caller keeps its record's own keys.
    """
    checks: list[tuple[int, float]] = []
    stop_when = None
    if probe is not None and target is not None:

        def stop_when(m) -> bool:
            value = probe(m)
            checks.append(((len(checks) + 1) * check_every, value))
            return value >= target

    torch.manual_seed(config.seed)
    start = time.perf_counter()
    history = supervised_warmup(model, tokenizer, dataset, config, stop_when=stop_when, check_every=check_every,
                                progress=progress)
    return {"steps": len(history), "seconds": time.perf_counter() - start,
            "reached": bool(history and history[-1].get("stopped")), "checks": checks, "history": history}

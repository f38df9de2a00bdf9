"""Held-out evaluation: one greedy completion per prompt, scored.

:func:`evaluate_policy` is a free function, so nothing has to build a trainer
(with its optimizer and reference copy) just to evaluate a model. It draws no
random numbers and restores the model's train/eval mode, so evaluating in the
middle of training does not change the training run.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from ._checks import is_int
from .metrics import nanmean
from .rewards import compute_rewards, correctness_reward, extra_columns, judge_correct
from .rollout import generate_rollouts
from .tasks import as_rows, validate_for_model

__all__ = ["evaluate_policy"]


def evaluate_policy(
    model: torch.nn.Module,
    tokenizer: Any,
    rows: Sequence[dict],
    *,
    reward_fns: Callable | Sequence[Callable] | None = None,
    reward_weights: Sequence[float] | None = None,
    max_new_tokens: int = 4,
    batch_size: int = 64,
    system_prompt: str | None = None,
    use_chat_template: bool | None = None,
    accuracy_fn: Callable | None = None,
    num_samples: int = 3,
    onednn: bool | None = None,
) -> dict:
    """Greedy accuracy, mean reward and mean completion length on ``rows``.

    One greedy completion per prompt, ``batch_size`` prompts per ``generate``
    call. ``reward_fns`` (default: ``correctness_reward``) give the reward;
    ``accuracy_fn`` decides what counts as correct (see
    :func:`grpo_tutorial.rewards.judge_correct`). ``onednn`` is
    :func:`~grpo_tutorial.rollout.generate_rollouts`' setting of that name.

    Returns:
        ``accuracy`` (NaN if rows have no answer), ``reward_mean``,
        ``completion_len_mean``, ``frac_truncated``, ``n``; ``records``, one
        dict per row (``prompt``, ``answer``, ``completion``, ``correct``
        (None if it cannot be judged), ``reward``, ``length``, ``truncated``);
        and ``samples``: the first ``num_samples`` records' prompt, completion
        and answer.
    """
    rows = as_rows(rows)
    validate_for_model(rows, model, tokenizer, max_new_tokens)
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    fns = [correctness_reward] if reward_fns is None else ([reward_fns] if callable(reward_fns) else list(reward_fns))
    records: list[dict] = []
    judged_all = True
    for start in range(0, len(rows), batch_size):
        chunk = list(rows[start : start + batch_size])
        rollout = generate_rollouts(
            model,
            tokenizer,
            [row["prompt"] for row in chunk],
            group_size=1,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            system_prompt=system_prompt,
            use_chat_template=use_chat_template,
            onednn=onednn,
        )
        answers = [row.get("answer") for row in chunk]
        columns = extra_columns(chunk, 1)
        total, _ = compute_rewards(fns, reward_weights, rollout.prompts, rollout.completions, answers, **columns)
        judged = judge_correct(accuracy_fn, rollout.prompts, rollout.completions, answers, columns)
        judged_all = judged_all and judged is not None
        lengths = rollout.completion_lengths.cpu().tolist()
        truncated = rollout.truncated.cpu().tolist()
        for i, row in enumerate(chunk):
            records.append(
                {
                    "prompt": row["prompt"],
                    "answer": row.get("answer"),
                    "completion": rollout.completions[i],
                    "correct": None if judged is None else judged[i],
                    "reward": float(total[i]),
                    "length": int(lengths[i]),
                    "truncated": bool(truncated[i]),
                }
            )
    rewards = torch.tensor([r["reward"] for r in records])  # [n]
    return {
        "accuracy": nanmean([r["correct"] for r in records]) if judged_all else math.nan,
        "reward_mean": float(torch.nanmean(rewards)),
        "completion_len_mean": float(torch.tensor([float(r["length"]) for r in records]).mean()),
        "frac_truncated": float(torch.tensor([float(r["truncated"]) for r in records]).mean()),
        "n": len(records),
        "records": records,
        "samples": [
            {"prompt": r["prompt"], "completion": r["completion"], "answer": r["answer"]} for r in records[:num_samples]
        ],
    }

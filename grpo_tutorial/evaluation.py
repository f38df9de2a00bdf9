"""Held-out evaluation: one greedy completion per prompt, scored, as the run trains.

:func:`evaluate_policy` is the one way this package evaluates a policy. It takes
every setting that decides what the model sees and may write (the system prompt,
the chat template, the token budget, the evaluation batch size and the oneDNN
setting) from the :class:`~grpo_tutorial.config.GRPOConfig` the run trains with,
so an evaluation cannot score a prompt the model was never trained on. It
generates as the run samples, fast where the run is (:mod:`grpo_tutorial.sampling.fast`:
``merge_adapters_for_sampling`` and ``static_cache``, on by default on a CUDA GPU).
:meth:`GRPOTrainer.evaluate <grpo_tutorial.trainer.GRPOTrainer.evaluate>`, the
chapter recipes, chapter 9's GPU run, the command line, the lab and the
benchmarks all call it.

It is a free function, so nothing has to build a trainer (with its optimizer
and reference copy) just to evaluate a model. It draws no random numbers and
restores the model's train/eval mode, so evaluating in the middle of training
does not change the training run.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import torch

from ._checks import check_int
from .config import GRPOConfig
from .sampling.fast import sampling_model, use_static_cache
from .metrics import nanmean
from .rewards import compute_rewards, correctness_reward, extra_columns, judge_correct
from .rollout import encode_prompts, generate_rollouts, sampling_kwargs
from .stats import proportion_se
from .tasks import as_rows, validate_for_model

__all__ = ["evaluate_policy"]

#: Keywords of the old signature, each with the GRPOConfig field that now holds it.
_MOVED_TO_CONFIG = {
    "max_new_tokens": "max_new_tokens",
    "system_prompt": "system_prompt",
    "use_chat_template": "use_chat_template",
    "onednn": "onednn_generation",
    "reward_weights": "reward_weights",
}


def evaluate_policy(
    model: torch.nn.Module,
    tokenizer: Any,
    rows: Sequence[dict],
    config: GRPOConfig | None = None,
    *,
    reward_fns: Callable | Sequence[Callable] | None = None,
    accuracy_fn: Callable | None = None,
    batch_size: int | None = None,
    num_samples: int = 3,
    **moved: Any,
) -> dict:
    """Greedy accuracy (with its standard error), mean reward and length on ``rows``.

    Args:
        model, tokenizer: the policy and its tokenizer.
        rows: ``prompt``/``answer`` rows.
        config: the :class:`~grpo_tutorial.config.GRPOConfig` of the run (default
            ``GRPOConfig()``). Its ``system_prompt``, ``use_chat_template``,
            ``max_new_tokens``, ``eval_batch_size``, ``onednn_generation`` and
            ``reward_weights`` decide the evaluation, exactly as its sampling and
            rewards decide training; ``merge_adapters_for_sampling`` and
            ``static_cache`` how fast it generates (a PEFT model's adapters are
            then merged into a copy made for the evaluation; the trainer passes
            its sampler's copy instead).
        reward_fns: the reward (default: ``correctness_reward``).
        accuracy_fn: what counts as correct (see
            :func:`grpo_tutorial.rewards.judge_correct`; default: the number
            ``extract_answer`` finds equals the row's answer).
        batch_size: prompts per ``generate`` call, if not ``config.eval_batch_size``
            (memory only: it does not choose what the model sees).
        num_samples: how many records to copy into ``samples``.

    Returns:
        ``accuracy`` (NaN if rows have no answer) and its standard error ``se``
        (sqrt(p (1 - p) / n)), ``reward_mean``, ``completion_len_mean``,
        ``frac_truncated``, ``n``, ``seconds``; ``correct`` and ``completions``
        (one entry per row, in order: True/False, None where it cannot be
        judged, for paired before/after comparisons); ``records``, one dict per
        row (``prompt``, ``answer``, ``completion``, ``correct`` (1.0/0.0, None
        if it cannot be judged), ``reward``, ``length``, ``truncated``); and
        ``samples``: the first ``num_samples`` records' prompt, completion and
        answer.
    """
    _refuse_moved_keywords(moved)
    config = GRPOConfig() if config is None else config
    if not isinstance(config, GRPOConfig):
        raise TypeError(f"config must be a GRPOConfig (the run's settings), got {type(config).__name__}")
    batch_size = config.eval_batch_size if batch_size is None else batch_size
    check_int(None, "batch_size", batch_size, 1)
    rows = as_rows(rows)
    validate_for_model(rows, model, tokenizer, config.max_new_tokens)
    fns = [correctness_reward] if reward_fns is None else ([reward_fns] if callable(reward_fns) else list(reward_fns))
    start_time = time.perf_counter()
    static = use_static_cache(config, model)
    width = 0  # with a static cache: every batch padded to the longest prompt, so one compiled step serves all
    if static:
        width = max(len(ids) for ids in encode_prompts(tokenizer, [row["prompt"] for row in rows],
                                                          system_prompt=config.system_prompt,
                                                          use_chat_template=config.use_chat_template))
    model = sampling_model(model, config)  # merged adapters: a copy, made once for the whole evaluation
    records: list[dict] = []
    judged_all = True
    for start in range(0, len(rows), batch_size):
        chunk = list(rows[start : start + batch_size])
        chunk_records, judged = _evaluate_chunk(model, tokenizer, chunk, config, fns, accuracy_fn, (static, width))
        records.extend(chunk_records)
        judged_all = judged_all and judged
    return _summary(records, judged_all, start_time, num_samples)


def _refuse_moved_keywords(moved: dict) -> None:
    """A keyword of the old signature names the GRPOConfig field that now holds it; any other is a TypeError."""
    if moved:
        name = sorted(moved)[0]
        field = _MOVED_TO_CONFIG.get(name)
        if field is None:
            raise TypeError(f"evaluate_policy() got an unexpected keyword argument {name!r}")
        raise TypeError(
            f"evaluate_policy() takes {name}= from the run's GRPOConfig, so that evaluation sees what training "
            f"sees: pass config=GRPOConfig({field}=...) (the trainer's config, or a preset), not {name}={moved[name]!r}"
        )


def _evaluate_chunk(
    model: torch.nn.Module,
    tokenizer: Any,
    chunk: list[dict],
    config: GRPOConfig,
    fns: list[Callable],
    accuracy_fn: Callable | None,
    static: tuple[bool, int] = (False, 0),
) -> tuple[list[dict], bool]:
    """One greedy completion per row of ``chunk``, scored: its records, and whether every row could be judged.

    ``static``: (use a static KV cache, the prompt width to pad to)."""
    rollout = generate_rollouts(  # greedy: one completion each, temperature and top_p unused
        model, tokenizer, [row["prompt"] for row in chunk],
        **sampling_kwargs(config, group_size=1, do_sample=False, static_cache=static[0], prompt_width=static[1]),
    )
    answers = [row.get("answer") for row in chunk]
    columns = extra_columns(chunk, 1)
    total, _ = compute_rewards(
        fns, config.reward_weights, rollout.prompts, rollout.completions, answers,
        completion_ids=rollout.completion_id_lists(), **columns,
    )
    judged = judge_correct(accuracy_fn, rollout.prompts, rollout.completions, answers, columns)
    lengths = rollout.completion_lengths.cpu().tolist()
    truncated = rollout.truncated.cpu().tolist()
    records = [
        {
            "prompt": row["prompt"],
            "answer": row.get("answer"),
            "completion": rollout.completions[i],
            "correct": None if judged is None else judged[i],
            "reward": float(total[i]),
            "length": int(lengths[i]),
            "truncated": bool(truncated[i]),
        }
        for i, row in enumerate(chunk)
    ]
    return records, judged is not None


def _summary(records: list[dict], judged_all: bool, start_time: float, num_samples: int) -> dict:
    """:func:`evaluate_policy`'s result from the records of every row (see its docstring)."""
    rewards = torch.tensor([r["reward"] for r in records])  # [n]
    correct = [None if _unjudged(r["correct"]) else r["correct"] == 1.0 for r in records]
    accuracy = nanmean([r["correct"] for r in records]) if judged_all else math.nan
    judged_n = sum(c is not None for c in correct)
    se = proportion_se(accuracy, judged_n) if judged_n and math.isfinite(accuracy) else math.nan
    return {
        "accuracy": accuracy,
        "se": se,
        "reward_mean": float(torch.nanmean(rewards)),
        "completion_len_mean": float(torch.tensor([float(r["length"]) for r in records]).mean()),
        "frac_truncated": float(torch.tensor([float(r["truncated"]) for r in records]).mean()),
        "n": len(records),
        "correct": correct,
        "completions": [r["completion"] for r in records],
        "seconds": time.perf_counter() - start_time,
        "records": records,
        "samples": [
            {"prompt": r["prompt"], "completion": r["completion"], "answer": r["answer"]} for r in records[:num_samples]
        ],
    }


def _unjudged(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))

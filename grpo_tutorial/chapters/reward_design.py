"""Tools for designing and auditing reward functions (chapter 6).

Everything here follows the TRL reward signature of :mod:`grpo_tutorial.rewards`,
``fn(completions, *, answer, **kwargs) -> list[float | None]``, so each piece
plugs into ``GRPOTrainer`` (ours or TRL's) as it is:

* :func:`number_format_reward`: the tiny model's format reward. It pays for a
  completion that is exactly one number, the answer format a character-level
  model can write (it has no ``<`` for ``<answer>`` tags).
* :func:`applies_to`: restrict a reward function to the rows of one task; on
  the other rows it returns ``None`` ("not applicable"), TRL's convention for
  multi-task training.
* :func:`contains_monitor`: a function that scores 1.0 when a completion contains
  some text. With a weight of 0 it changes nothing in training but is logged
  like any reward, so the history shows how often the policy writes that text:
  the cheapest way to watch a suspected reward hack.
* :func:`sample_audit`: sample a policy on a set of prompts and report how
  often each check fires and which completions are most common: what the
  policy actually writes, whatever the reward says.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo_tutorial._checks import check_int
from grpo_tutorial.answers import completion_texts
from grpo_tutorial.rewards import RewardFn, compute_rewards, reward_function_means, reward_function_name
from grpo_tutorial.rollout import generate_rollouts, sampling_kwargs

__all__ = ["applies_to", "contains_monitor", "number_format_reward", "sample_audit"]

# One number and nothing else, give or take surrounding whitespace:
# an optional sign, digits, and an optional decimal part ("-12", "3.5", "0.25").
_ONE_NUMBER_RE = re.compile(r"\s*[-+]?\d+(?:\.\d+)?\s*")


def number_format_reward(completions: Sequence, **kwargs) -> list[float]:
    """1.0 for a completion that is exactly one number, else 0.0.

    ``"46"``, ``" -7 "`` and ``"3.5"`` score 1.0; ``"4+5"``, ``"46+"``, ``"+"``,
    ``"="`` and ``""`` score 0.0. Whether the number is *right* is not checked;
    combine it with ``correctness_reward`` for that, for example
    ``combined_reward({"correctness": 1.0, number_format_reward: 0.3})``, which
    pays partial credit only for a well-formed answer.

    Within a group, every well-formed attempt earns the same bonus, so the bonus
    cancels out of the group-relative advantages: among well-formed answers only
    correctness decides who is pushed up. What remains is a push away from
    malformed output.
    """
    return [1.0 if _ONE_NUMBER_RE.fullmatch(text) else 0.0 for text in completion_texts(completions)]


def contains_monitor(text: str, name: str | None = None) -> RewardFn:
    """A reward function that is 1.0 when a completion contains ``text``, else 0.0.

    Meant as a *monitor*: give it a weight of 0 and the trainer logs its mean
    (under ``reward/<name>``) at every step without it touching the total
    reward or the advantages.

    Args:
        text: the substring to look for (non-empty).
        name: the logged name; default ``"contains_" + text``.

    Example:
        >>> has_plus = contains_monitor("+", name="contains_plus")
        >>> has_plus(["12", "1+2", "+"], answer=["3", "3", "3"])
        [0.0, 1.0, 1.0]
    """
    if not isinstance(text, str) or not text:
        raise ValueError(f"text must be a non-empty str, got {text!r}")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"name must be None or a non-empty str, got {name!r}")

    def monitor(completions: Sequence, **kwargs) -> list[float]:
        return [1.0 if text in t else 0.0 for t in completion_texts(completions)]

    monitor.__name__ = name if name is not None else f"contains_{text}"
    monitor.__qualname__ = monitor.__name__
    monitor.__doc__ = f"1.0 when a completion contains {text!r}, else 0.0 (a monitor: use weight 0)."
    return monitor


def applies_to(fn: Callable, **where: object) -> RewardFn:
    """Restrict a reward function to the rows whose columns have given values.

    ``applies_to(countdown_reward, task="countdown")`` returns a reward function
    that scores the rows whose ``task`` column is ``"countdown"`` with
    ``countdown_reward`` and returns ``None`` (not applicable) for every other
    row. The wrapped function is called once, on the applicable rows only, with
    every per-row keyword argument (a list with one entry per completion) cut
    down to those rows, so it never sees another task's columns.

    Args:
        fn: a reward function with the TRL signature.
        **where: exactly one column name and the value that selects a row.

    Returns:
        A reward function named ``"<fn name>[<column>=<value>]"``.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a reward function, got {type(fn).__name__}: {fn!r:.80}")
    if len(where) != 1:
        raise ValueError(f"applies_to needs exactly one column=value condition, got {where!r}")
    ((column, value),) = where.items()
    inner_name = reward_function_name(fn)

    def restricted(completions: Sequence, **kwargs) -> list[float | None]:
        n = len(completion_texts(completions))
        if column not in kwargs:
            raise ValueError(
                f"{restricted.__name__}: the batch has no {column!r} column; "
                f"columns passed: {sorted(kwargs)}"
            )
        keys = kwargs[column]
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence) or len(keys) != n:
            raise ValueError(
                f"{restricted.__name__}: column {column!r} must hold one value per completion "
                f"({n}), got {keys!r:.80}"
            )
        rows = [i for i, key in enumerate(keys) if key == value]
        out: list[float | None] = [None] * n
        if not rows:
            return out
        sliced = {
            k: [v[i] for i in rows] if isinstance(v, (list, tuple)) and len(v) == n else v
            for k, v in kwargs.items()
        }
        values = fn([completions[i] for i in rows], **sliced)
        if len(values) != len(rows):
            raise ValueError(
                f"reward function {inner_name!r} returned {len(values)} rewards for {len(rows)} completions"
            )
        for i, v in zip(rows, values):
            out[i] = v
        return out

    restricted.__name__ = f"{inner_name}[{column}={value}]"
    restricted.__qualname__ = restricted.__name__
    restricted.__doc__ = f"{inner_name} on the rows where {column} == {value!r}; None elsewhere."
    return restricted


def sample_audit(
    model: Any,
    tokenizer: Any,
    rows: Sequence[Mapping],
    checks: Sequence[Callable],
    config: Any,
    *,
    seed: int = 0,
    top: int = 5,
) -> dict:
    """Sample ``config.group_size`` completions per prompt, as a run of ``config`` samples, and run every check on them.

    One batched ``generate`` call (``generate_rollouts`` with the run's sampling
    settings, :func:`~grpo_tutorial.rollout.sampling_kwargs`; seeded, so the
    global RNG is left alone). Each check
    is a reward function (TRL signature); its mean over all completions is
    reported, skipping ``None``.

    Args:
        rows: dataset rows with ``"prompt"`` and ``"answer"``.
        checks: reward functions or monitors, e.g. ``[correctness_reward,
            contains_monitor("+")]``; their names must differ.
        config: the run's :class:`~grpo_tutorial.config.GRPOConfig` (group size,
            token budget, temperature, ...).
        seed: sampling seed.
        top: how many of the most common completions to return.

    Returns:
        ``{"means": {check name: mean}, "common": [(completion, count), ...],
        "n": number of completions}``.
    """
    if isinstance(rows, (str, Mapping)) or not isinstance(rows, Sequence) or not rows:
        raise ValueError(f"rows must be a non-empty list of dicts with 'prompt' and 'answer', got {rows!r:.80}")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping) or "prompt" not in row or "answer" not in row:
            raise ValueError(f"rows[{i}] must be a dict with 'prompt' and 'answer' keys, got {row!r:.80}")
    if isinstance(checks, (str, Mapping)) or not isinstance(checks, Sequence) or not checks:
        raise TypeError(f"checks must be a non-empty list of reward functions, got {checks!r:.80}")
    names = [reward_function_name(fn) for fn in checks]
    if len(set(names)) != len(names):
        raise ValueError(f"checks must have distinct names, got {names}")
    check_int(None, "top", top, 0)
    rollout = generate_rollouts(model, tokenizer, [row["prompt"] for row in rows],
                                **sampling_kwargs(config, generator_seed=seed))
    answers = [row["answer"] for row in rows for _ in range(config.group_size)]
    _, per_fn = compute_rewards(list(checks), None, rollout.prompts, rollout.completions, answers)
    return {
        "means": reward_function_means(per_fn),
        "common": Counter(rollout.completions).most_common(top),
        "n": len(rollout),
    }

"""Stage 2 of a GRPO step: verifiable rewards.

A verifiable reward is a plain function that reads a completion and checks it
against a known answer; no reward model is involved. Every reward function here
follows TRL's convention, so the same functions plug into our trainer and into
``trl.GRPOTrainer``::

    fn(completions, *, answer, **kwargs) -> list[float | None]

* ``completions`` is a list of strings, or a list of chat message lists such as
  ``[{"role": "assistant", "content": "..."}]`` (TRL's conversational format).
* ``answer`` is the dataset's ``answer`` column: one reference per completion.
* Any other keyword (``prompts``, ``completion_ids``, ``trainer_state``, other
  dataset columns) is accepted and ignored.
* ``None`` for a completion means "this function does not apply here".

How several functions combine (the rule ``compute_rewards`` and
``combined_reward`` share, which is also TRL's):

    total_i = sum over functions f with r_f,i not None of  w_f * r_f,i

A ``None`` is left out of the sum (TRL turns it into NaN and uses ``nansum``). If
*every* function returns ``None`` for completion i, it cannot be scored at all;
``compute_rewards`` then sets ``total_i = NaN`` (TRL 1.16 does the same and gives
such a completion zero advantage). A function's logged mean skips its ``None``s.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence

import torch

from ._checks import check_int
from .answers import answers_match, completion_texts, completion_to_text, extract_answer, references_for

__all__ = [
    "RewardFunctionError",
    "answers_match",
    "check_unscorable",
    "combined_reward",
    "completion_to_text",
    "compute_rewards",
    "correctness_reward",
    "extract_answer",
    "format_reward",
    "partial_credit_reward",
    "reward_function_means",
    "reward_function_name",
    "soft_overlong_punishment",
]

RewardFn = Callable[..., Sequence]

# ---------------------------------------------------------------------------
# Reward functions (TRL signature)
# ---------------------------------------------------------------------------


def correctness_reward(completions: Sequence, *, answer: Sequence, **kwargs) -> list[float]:
    """1.0 when the answer extracted from a completion matches the reference, else 0.0.

    Extraction is ``extract_answer`` and comparison is ``answers_match``, so
    ``"<answer>1,234</answer>"`` earns 1.0 against ``"1234"`` and so does
    ``"... so the total is 1234."`` (the last number counts when there is no tag).
    """
    texts = completion_texts(completions)
    refs = references_for(answer, len(texts))
    return [1.0 if answers_match(extract_answer(t), r) else 0.0 for t, r in zip(texts, refs)]


_BODY = r"((?:(?!</?(?:think|answer)>).)*)"  # any text that holds no think/answer tag
_FORMAT_RE = re.compile(rf"\s*<think>{_BODY}</think>\s*<answer>{_BODY}</answer>\s*", re.DOTALL)


def format_reward(completions: Sequence, **kwargs) -> list[float]:
    """1.0 for a completion laid out exactly as ``<think>...</think><answer>...</answer>``.

    Whitespace is allowed before, between and after the two blocks; nothing else
    is. Both blocks must hold some non-blank text and no further think/answer
    tags (so a second ``<answer>`` cannot sneak in). There is no partial credit:
    a nearly-right layout scores 0.0, because partial credit is exactly what a
    policy learns to farm (chapter 6). The answer's correctness is not checked;
    combine with ``correctness_reward`` for that.
    """
    scores = []
    for text in completion_texts(completions):
        m = _FORMAT_RE.fullmatch(text)
        ok = m is not None and m.group(1).strip() != "" and m.group(2).strip() != ""
        scores.append(1.0 if ok else 0.0)
    return scores


_EQUATION_RE = re.compile(r"\+|\d\s*[-*/x\u00d7]\s*\d|=")


def partial_credit_reward(completions: Sequence, *, answer: Sequence, **kwargs) -> list[float]:
    """THE BAD EXAMPLE for chapter 6: a reward that is easy to hack.

    1.0 for a correct answer, 0.3 for a wrong answer that "shows some work"
    (contains a ``+``, an ``=``, or an operator between digits, such as ``3*4``),
    0.0 otherwise. It sounds generous; in practice a policy that cannot yet
    solve a problem learns that writing any equation is a sure 0.3, so wrong but
    equation-shaped completions crowd out the signal the correct ones carry.
    Use ``correctness_reward`` (optionally with ``format_reward``) instead.
    """
    texts = completion_texts(completions)
    refs = references_for(answer, len(texts))
    scores = []
    for text, ref in zip(texts, refs):
        if answers_match(extract_answer(text), ref):
            scores.append(1.0)
        elif _EQUATION_RE.search(text):
            scores.append(0.3)
        else:
            scores.append(0.0)
    return scores


class soft_overlong_punishment:  # noqa: N801 - used like a function that returns a reward function
    r"""DAPO's soft overlong punishment (Yu et al. 2025, Eq. 13) as a reward function.

    ``soft_overlong_punishment(max_completion_len, soft_punish_cache)`` returns a
    reward function with TRL's signature that scores a completion by its length
    alone, in tokens (EOS included), :math:`|y|`, with
    :math:`L_{\max}` = ``max_completion_len`` and :math:`L_c` = ``soft_punish_cache``:

    .. math::

        R(y) = \begin{cases} 0 & |y| \le L_{\max} - L_c \\
        \dfrac{(L_{\max} - L_c) - |y|}{L_c} & L_{\max} - L_c < |y| \le L_{\max} \\
        -1 & |y| > L_{\max} \end{cases}

    so nothing changes below the buffer, the penalty grows linearly inside it,
    and a completion that uses the whole budget (``max_completion_len`` equal to
    ``max_new_tokens``, so every truncated one) gets -1. Add it to a
    correctness reward (a list of reward functions). It never rewards a short
    completion. TRL ships the same function as
    ``trl.rewards.get_soft_overlong_punishment``; ``tests/test_rewards.py``
    compares the two.

    The lengths come from ``completion_ids``, the token ids of each completion
    up to and including its EOS, which both :class:`~grpo_tutorial.GRPOTrainer`
    and TRL's trainer pass to every reward function. It is a class rather than a
    closure so that it pickles (TRL's reason too); ``__name__`` is the logged name.

    >>> reward = soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    >>> reward(["..."], completion_ids=[[1] * 90])
    [-0.5]
    """

    __name__ = "soft_overlong_punishment_reward"

    def __init__(self, max_completion_len: int, soft_punish_cache: int) -> None:
        check_int(None, "max_completion_len", max_completion_len, 1)
        check_int(None, "soft_punish_cache", soft_punish_cache, 0)
        if soft_punish_cache > max_completion_len:
            raise ValueError(
                f"soft_punish_cache={soft_punish_cache} must not exceed max_completion_len={max_completion_len}; "
                "it is the buffer below the budget in which the penalty grows"
            )
        self.max_completion_len = int(max_completion_len)
        self.soft_punish_cache = int(soft_punish_cache)

    def __repr__(self) -> str:
        return f"soft_overlong_punishment(max_completion_len={self.max_completion_len}, soft_punish_cache={self.soft_punish_cache})"

    def penalty(self, length: int) -> float:
        """The reward of one completion of ``length`` tokens (EOS included)."""
        budget, cache = self.max_completion_len, self.soft_punish_cache
        if length <= budget - cache:
            return 0.0
        if length <= budget:
            return (budget - cache - length) / cache
        return -1.0

    def __call__(self, completions: Sequence | None = None, *, completion_ids: Sequence | None = None, **kwargs) -> list[float]:
        if completion_ids is None:
            raise TypeError(
                "soft_overlong_punishment needs completion_ids=[[token ids], ...] (each completion's tokens up "
                "to and including its EOS); GRPOTrainer, evaluate_policy and TRL's GRPOTrainer pass them"
            )
        if completions is not None and len(completions) != len(completion_ids):
            raise ValueError(
                f"got {len(completions)} completions but {len(completion_ids)} completion_ids; expected one each"
            )
        return [self.penalty(len(ids)) for ids in completion_ids]


_NAMED_REWARDS: dict[str, RewardFn] = {
    "correctness": correctness_reward,
    "correctness_reward": correctness_reward,
    "format": format_reward,
    "format_reward": format_reward,
    "partial_credit": partial_credit_reward,
    "partial_credit_reward": partial_credit_reward,
}


def reward_function_name(fn: object) -> str:
    """The name a reward function is logged under (as TRL names it)."""
    while hasattr(fn, "func") and hasattr(fn, "args") and hasattr(fn, "keywords"):  # functools.partial
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def _check_weight(weight: object, where: str) -> float:
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(float(weight)):
        raise TypeError(f"{where} must be a finite number, got {type(weight).__name__}: {weight!r}")
    return float(weight)


def _resolve_reward(fn: object, where: str) -> RewardFn:
    if isinstance(fn, str):
        if fn not in _NAMED_REWARDS:
            raise ValueError(f"{where}: unknown reward name {fn!r}; expected a callable or one of {sorted(_NAMED_REWARDS)}")
        return _NAMED_REWARDS[fn]
    if not callable(fn):
        raise TypeError(f"{where} must be a reward function or its name, got {type(fn).__name__}: {fn!r:.80}")
    return fn


def combined_reward(weights: Mapping | Sequence) -> RewardFn:
    """Build one reward function that is the weighted sum of several.

    Args:
        weights: ``{fn_or_name: weight}`` or ``[(fn_or_name, weight), ...]``.
            Names are ``"correctness"``, ``"format"`` and ``"partial_credit"``
            (with or without the ``_reward`` suffix).

    Returns:
        A function with the TRL signature whose value for completion i is
        ``sum_f w_f * r_f,i`` over the functions that did not return None for
        it; None if all of them did. Its ``__name__`` spells out the sum, e.g.
        ``"1*correctness_reward+0.2*format_reward"``, so logs stay readable.

    Example:
        >>> reward = combined_reward({"correctness": 1.0, "format": 0.2})
        >>> reward(["<think>4</think><answer>4</answer>", "5"], answer=["4", "4"])
        [1.2, 0.0]
    """
    if isinstance(weights, Mapping):
        pairs = list(weights.items())
    elif isinstance(weights, Sequence) and not isinstance(weights, str):
        pairs = list(weights)
        for i, pair in enumerate(pairs):
            if not (isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2):
                raise TypeError(f"weights[{i}] must be a (reward function, weight) pair, got {pair!r:.80}")
    else:
        raise TypeError(
            f"weights must be a dict {{fn: weight}} or a list of (fn, weight) pairs, got {type(weights).__name__}"
        )
    if not pairs:
        raise ValueError("weights is empty; expected at least one (reward function, weight) pair")
    parts = [
        (_resolve_reward(fn, f"weights[{i}] function"), _check_weight(w, f"weights[{i}] weight"))
        for i, (fn, w) in enumerate(pairs)
    ]

    def combined(completions: Sequence, **kwargs) -> list[float | None]:
        totals: list[float | None] = [None] * len(completions)
        for fn, w in parts:
            values = fn(completions, **kwargs)
            if len(values) != len(completions):
                raise ValueError(
                    f"reward function {reward_function_name(fn)!r} returned {len(values)} rewards "
                    f"for {len(completions)} completions"
                )
            for i, v in enumerate(values):
                if v is not None:
                    totals[i] = (totals[i] or 0.0) + w * float(v)
        return totals

    combined.__name__ = "+".join(f"{w:g}*{reward_function_name(fn)}" for fn, w in parts)
    combined.__qualname__ = combined.__name__
    combined.__doc__ = f"Weighted sum of reward functions: {combined.__name__}."
    return combined


# ---------------------------------------------------------------------------
# Calling reward functions safely (used by the trainer)
# ---------------------------------------------------------------------------


class RewardFunctionError(RuntimeError):
    """A reward function raised. Carries its name and the completion's index.

    Attributes:
        function: the reward function's name.
        index: the first completion on which it fails when called alone, or
            None if it only fails on the whole batch.
    """

    def __init__(self, message: str, function: str, index: int | None):
        super().__init__(message)
        self.function = function
        self.index = index


def _unique_names(fns: Sequence) -> list[str]:
    """Each function's logged name; a repeated name gets ``_2``, ``_3``, ..."""
    names: list[str] = []
    for fn in fns:
        base = reward_function_name(fn)
        name, k = base, 2
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names.append(name)
    return names


def _slice_columns(columns: Mapping, i: int, n: int) -> dict:
    """Row i of every per-completion column (lists of length n); others pass whole."""
    return {
        k: [v[i]] if isinstance(v, (list, tuple)) and len(v) == n else v for k, v in columns.items()
    }


def _find_failing_index(fn: RewardFn, prompts: list, completions: list, answers: list, columns: Mapping) -> int | None:
    """Call ``fn`` on one completion at a time; the first index that raises."""
    n = len(completions)
    for i in range(n):
        try:
            fn(
                prompts=[prompts[i]],
                completions=[completions[i]],
                answer=[answers[i]],
                **_slice_columns(columns, i, n),
            )
        except Exception:  # noqa: BLE001 - any error pins down the index
            return i
    return None


def _signature_hint(err: Exception) -> str:
    """Advice when a reward function's signature, not the data, is the problem."""
    text = str(err) if isinstance(err, TypeError) else ""
    if "unexpected keyword argument" in text:
        return (
            ". Reward functions are called as fn(prompts=..., completions=..., answer=..., **columns); "
            "give yours a **kwargs parameter so it accepts the keywords it does not use"
        )
    if "required positional argument" in text:
        return (
            ". Everything is passed by keyword (prompts=..., completions=..., answer=..., **columns); "
            "name the parameters completions, prompts and answer, and add **kwargs"
        )
    if "required keyword-only argument" in text:
        return (
            ". Keywords other than prompts, completions and answer come from the dataset's other "
            "columns; add that column to every row, or give the parameter a default"
        )
    return ""


def _as_reward_list(name: str, output: object, n: int) -> list[float]:
    """Check one function's output and turn it into floats (NaN for None)."""
    if isinstance(output, torch.Tensor):
        output = output.tolist() if output.dim() == 1 else output
    if hasattr(output, "tolist") and not isinstance(output, (list, tuple)):  # numpy arrays
        output = output.tolist()
    if isinstance(output, (str, bytes, Mapping)) or not isinstance(output, Sequence):
        raise TypeError(
            f"reward function {name!r} returned {type(output).__name__} {output!r:.80}; "
            f"expected a list of {n} floats (one per completion, None for 'not applicable')"
        )
    if len(output) != n:
        raise ValueError(
            f"reward function {name!r} returned {len(output)} rewards but got {n} completions; "
            "expected exactly one reward per completion"
        )
    values = []
    for i, v in enumerate(output):
        if v is None:
            values.append(math.nan)
            continue
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if not isinstance(v, numbers.Real):  # bool is accepted as 0/1, like int
            raise TypeError(
                f"reward function {name!r} returned a non-numeric value {v!r:.80} ({type(v).__name__}) "
                f"at index {i}; expected a float, an int or None"
            )
        x = float(v)
        if not math.isfinite(x):
            raise ValueError(
                f"reward function {name!r} returned {x} at index {i}; rewards must be finite "
                "(return None for 'not applicable')"
            )
        values.append(x)
    return values


def _checked_functions(reward_fns: Sequence[RewardFn] | RewardFn,
                       weights: Sequence[float] | None) -> tuple[Sequence[RewardFn], list[float]]:
    """:func:`compute_rewards`' functions as a list, and one checked weight each (1.0 for ``weights=None``)."""
    fns = [reward_fns] if callable(reward_fns) else reward_fns
    if isinstance(fns, (str, Mapping)) or not isinstance(fns, Sequence) or not fns:
        raise TypeError(f"reward_fns must be a reward function or a non-empty list of them, got {reward_fns!r:.80}")
    for i, fn in enumerate(fns):
        if not callable(fn):
            raise TypeError(f"reward_fns[{i}] must be callable, got {type(fn).__name__}: {fn!r:.80}")
    if weights is None:
        return fns, [1.0] * len(fns)
    if isinstance(weights, (str, Mapping)) or not isinstance(weights, Sequence):
        raise TypeError(f"weights must be a list of numbers or None, got {type(weights).__name__}")
    if len(weights) != len(fns):
        raise ValueError(f"weights has {len(weights)} entries but there are {len(fns)} reward functions")
    return fns, [_check_weight(x, f"weights[{i}]") for i, x in enumerate(weights)]


def _checked_batch(prompts: Sequence, completions: Sequence, answers: Sequence,
                   completion_ids: Sequence[Sequence[int]] | None, columns: dict) -> tuple[int, dict]:
    """:func:`compute_rewards`' batch checked: N, and the extra columns (with ``completion_ids`` when given)."""
    for arg_name, arg in (("prompts", prompts), ("completions", completions), ("answers", answers)):
        if isinstance(arg, (str, Mapping)) or not isinstance(arg, Sequence):
            raise TypeError(f"{arg_name} must be a list with one entry per completion, got {type(arg).__name__}")
    n = len(completions)
    if n == 0:
        raise ValueError("completions is empty; expected at least one completion to score")
    if len(prompts) != n or len(answers) != n:
        raise ValueError(
            f"prompts, completions and answers must have the same length, got "
            f"{len(prompts)}, {n} and {len(answers)}"
        )
    if "answer" in columns:
        raise ValueError("pass the references as answers=..., not as an extra 'answer' column")
    if completion_ids is not None:
        if isinstance(completion_ids, (str, Mapping)) or not isinstance(completion_ids, Sequence) or len(completion_ids) != n:
            raise ValueError(f"completion_ids must be a list of {n} token-id lists, one per completion")
        columns = {**columns, "completion_ids": [list(ids) for ids in completion_ids]}
    return n, columns


def compute_rewards(
    reward_fns: Sequence[RewardFn] | RewardFn,
    weights: Sequence[float] | None,
    prompts: Sequence,
    completions: Sequence,
    answers: Sequence,
    *,
    dtype: torch.dtype = torch.float32,
    completion_ids: Sequence[Sequence[int]] | None = None,
    **columns,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Stage 2: call every reward function on a batch, check what comes back, weight and sum.

    Each function is called TRL-style as
    ``fn(prompts=..., completions=..., answer=answers, **columns)``, where
    ``columns`` are further dataset columns (one value per completion). When
    ``completion_ids`` is given (each completion's token ids up to and including
    its EOS, as the trainer and ``evaluate_policy`` pass them, and as TRL does),
    every function also gets ``completion_ids=...``.

    Args:
        reward_fns: a reward function or a list of them.
        weights: one weight per function, or None for all 1.0.
        prompts, completions, answers: one entry per completion, N in all.
        dtype: dtype of the returned tensors.

    Returns:
        ``(total, per_fn)``. ``total`` is ``[N]``: the weighted sum over the
        functions that did not return None (NaN where all of them did).
        ``per_fn`` maps each function's name to its ``[N]`` raw rewards, NaN
        where it returned None; use ``reward_function_means`` (a NaN-skipping
        mean) to log them.

    Raises:
        RewardFunctionError: a function raised; the message names it and the
            first completion it fails on, and the original error is chained.
        ValueError: a function returned the wrong number of rewards, NaN or inf,
            or the inputs disagree in length.
        TypeError: a function returned a non-numeric value, or an input has
            the wrong type.
    """
    fns, w = _checked_functions(reward_fns, weights)
    n, columns = _checked_batch(prompts, completions, answers, completion_ids, columns)
    prompts, completions, answers = list(prompts), list(completions), list(answers)

    names = _unique_names(fns)
    per_fn: dict[str, torch.Tensor] = {}
    for fn, name in zip(fns, names):
        try:
            output = fn(prompts=prompts, completions=completions, answer=answers, **columns)
        except Exception as err:  # noqa: BLE001 - re-raised with context below
            index = _find_failing_index(fn, prompts, completions, answers, columns)
            where = f"on completion {index} ({completions[index]!r:.60})" if index is not None else (
                "on the whole batch (no single completion fails alone)"
            )
            raise RewardFunctionError(
                f"reward function {name!r} raised {type(err).__name__} {where}: {err}{_signature_hint(err)}",
                name,
                index,
            ) from err
        per_fn[name] = torch.tensor(_as_reward_list(name, output, n), dtype=dtype)  # [N]

    stacked = torch.stack(list(per_fn.values()), dim=1)  # [N, F]
    weight = torch.tensor(w, dtype=dtype)  # [F]
    total = (stacked * weight).nansum(dim=1)  # [N]  None (NaN) terms drop out
    total[torch.isnan(stacked).all(dim=1)] = math.nan  # unscorable: every function said None
    return total, per_fn


def check_unscorable(rewards: torch.Tensor, warn: Callable[[str, str], None]) -> None:
    """Warn (through ``warn(kind, message)``) when some of the ``[N]`` totals are NaN: unscorable completions."""
    unscorable = int(torch.isnan(rewards).sum())
    if unscorable:
        warn(
            "unscorable",
            f"{unscorable} of {len(rewards)} completions could not be scored (every reward function "
            "returned None); they are left out of their group's baseline and of reward_mean, "
            "and get an advantage of 0",
        )


def reward_function_means(per_fn: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Each function's mean reward for logging, skipping its None (NaN) entries.

    A function that returned None for every completion logs NaN.
    """
    return {name: float(torch.nanmean(values.float())) for name, values in per_fn.items()}


# ---------------------------------------------------------------------------
# Dataset columns and accuracy (shared by training and evaluation)
# ---------------------------------------------------------------------------


def extra_columns(rows: Sequence[Mapping], group_size: int) -> dict[str, list]:
    """Dataset columns other than prompt and answer, repeated for each completion.

    TRL passes every dataset column to reward functions as a keyword argument;
    so do we. A column counts only if every row has it.
    """
    keys = [k for k in rows[0] if k not in ("prompt", "answer") and all(k in row for row in rows)]
    return {k: [row[k] for row in rows for _ in range(group_size)] for k in keys}


def judge_correct(
    accuracy_fn: Callable | None, prompts: list, completions: list[str], answers: list, columns: Mapping
) -> list[float] | None:
    """1.0/0.0 per completion as ``accuracy_fn`` judges it (None: cannot be judged).

    With no ``accuracy_fn``, a completion is correct when :func:`extract_answer`
    finds an answer equal to the row's (``answers_match``); rows without an
    answer make the whole batch unjudgeable. An ``accuracy_fn`` has the reward
    signature and may return None for a completion it cannot judge (NaN here).
    """
    if accuracy_fn is None:
        if any(a is None for a in answers):
            return None
        return [1.0 if answers_match(extract_answer(c), a) else 0.0 for c, a in zip(completions, answers)]
    values = accuracy_fn(prompts=prompts, completions=completions, answer=answers, **columns)
    if len(values) != len(completions):
        raise ValueError(
            f"accuracy_fn returned {len(values)} values for {len(completions)} completions; expected one each"
        )
    return [math.nan if v is None else float(v) for v in values]


def reward_function_list(reward_fns: object, weights: Sequence[float] | None = None) -> list[RewardFn]:
    """One reward function or a list of them, checked, as a list (with one weight each, if weights are given)."""
    fns = [reward_fns] if callable(reward_fns) else reward_fns
    if isinstance(fns, (str, dict)) or not isinstance(fns, Sequence) or len(fns) == 0:
        raise TypeError(f"reward_fns must be a reward function or a non-empty list of them, got {reward_fns!r:.80}")
    for i, fn in enumerate(fns):
        if not callable(fn):
            raise TypeError(f"reward_fns[{i}] must be callable, got {type(fn).__name__}: {fn!r:.80}")
    if weights is not None and len(weights) != len(fns):
        raise ValueError(
            f"GRPOConfig.reward_weights has {len(weights)} entries but there are "
            f"{len(fns)} reward functions; expected one weight per function"
        )
    return list(fns)

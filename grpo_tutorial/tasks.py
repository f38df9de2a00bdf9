"""The input of a GRPO step, before stage 1: the prompts, each with an answer a program can check.

* ``make_arithmetic_dataset``: generated sums, differences and products. It
  needs no network, so every chapter can run offline.
* ``make_countdown_dataset``: reach a target from given numbers; the reward is
  ``countdown_reward``, which checks the expression with a whitelist parser.
* ``load_gsm8k``: grade-school word problems from the Hugging Face hub, online only.
* ``validate_dataset``: the checks the trainer runs before it starts.

Chapter 13's long addition (``make_long_addition_dataset``, ``worked_addition``,
``parse_worked``) is in :mod:`grpo_tutorial.long_addition`.

Every row is a dict with at least ``"prompt"`` and ``"answer"`` (a string), the
columns TRL's ``GRPOTrainer`` passes to reward functions as keyword arguments.
"""

from __future__ import annotations

import ast
import operator
import os
import random
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from fractions import Fraction
from typing import Any

from ._checks import check_int
from .chat import is_chat_messages
from .answers import canonical_number, completion_texts, parse_number, references_for

__all__ = [
    "DatasetUnavailableError",
    "countdown_expression",
    "countdown_reward",
    "evaluate_expression",
    "gsm8k_final_answer",
    "gsm8k_rows",
    "load_gsm8k",
    "make_arithmetic_dataset",
    "make_countdown_dataset",
    "train_test_split_arithmetic",
    "validate_dataset",
]

_ARITH_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_STYLES = ("plain", "question")
_ENUMERATE_LIMIT = 100_000  # below this many problems, list them all and sample from the list


# ---------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------


def _check_ops(op: str | Sequence[str]) -> list[str]:
    ops = [op] if isinstance(op, str) else list(op) if isinstance(op, Sequence) else None
    if not ops or any(o not in _ARITH_OPS for o in ops):
        raise ValueError(f"op must be one of {sorted(_ARITH_OPS)} or a list of them, got {op!r}")
    return list(dict.fromkeys(ops))  # drop repeats, keep order


def _arith_prompt(a: int, op: str, b: int, style: str) -> str:
    """``12+34=`` for the character-level model, a question for an instruct LLM."""
    if style == "plain":
        return f"{a}{op}{b}="
    return f"What is {a} {op} {b}?"


def _arith_row(a: int, op: str, b: int, style: str) -> dict:
    return {"prompt": _arith_prompt(a, op, b, style), "answer": str(_ARITH_OPS[op](a, b)), "a": a, "b": b, "op": op}


def make_arithmetic_dataset(
    n: int,
    seed: int,
    *,
    op: str | Sequence[str] = "+",
    digits: int = 2,
    style: str = "plain",
    allow_negative: bool = True,
    unique: bool = False,
    exclude: Collection[str] | None = None,
) -> list[dict]:
    """Generate ``n`` arithmetic problems, the same ones for the same arguments.

    Args:
        n: number of rows (>= 1).
        seed: seed of the private ``random.Random`` that draws them.
        op: ``"+"``, ``"-"``, ``"*"``, or a list of them (one drawn per row).
        digits: each operand is drawn uniformly from ``0 .. 10**digits - 1``,
            so ``digits=1`` means 0-9 and ``digits=2`` means 0-99.
        style: ``"plain"`` gives ``"12+34="``, built only from the characters
            ``0123456789+-*=`` (for the tiny character-level model);
            ``"question"`` gives ``"What is 12 + 34?"`` (for an instruct LLM).
        allow_negative: if False, subtraction only draws ``a >= b``.
        unique: if True, no prompt appears twice (raises if there are too few).
        exclude: prompts never to produce, e.g. a test set's
            (``train_test_split_arithmetic`` does this for you).

    Returns:
        Rows ``{"prompt", "answer", "a", "b", "op"}``; ``answer`` is the exact
        integer result as a string, such as ``"46"`` or ``"-22"``.
    """
    n = check_int(None, "n", n, 1)
    seed = check_int(None, "seed", seed)
    digits = check_int(None, "digits", digits, 1)
    ops = _check_ops(op)
    if style not in _STYLES:
        raise ValueError(f"style must be one of {list(_STYLES)}, got {style!r}")
    if exclude is not None and (isinstance(exclude, str) or not isinstance(exclude, Collection)):
        raise TypeError(f"exclude must be a set or list of prompt strings, got {type(exclude).__name__}")
    banned = set(exclude or ())
    rng = random.Random(seed)
    hi = 10**digits

    def allowed(a: int, o: str, b: int) -> bool:
        return allow_negative or o != "-" or a >= b

    if len(ops) * hi * hi <= _ENUMERATE_LIMIT:
        return _listed_problems(rng, n, ops, hi, style, allowed, banned, unique, what=f"op={op!r}, digits={digits}")
    return _drawn_problems(rng, n, ops, hi, style, allowed, banned, unique, what=f"op={op!r}, digits={digits}")


def _listed_problems(rng: random.Random, n: int, ops: list[str], hi: int, style: str,
                     allowed: Callable[[int, str, int], bool], banned: set[str], unique: bool, *,
                     what: str) -> list[dict]:
    """:func:`make_arithmetic_dataset` where every problem can be listed: ``n`` drawn from the list of them."""
    pool = [
        (a, o, b)
        for o in ops
        for a in range(hi)
        for b in range(hi)
        if allowed(a, o, b) and _arith_prompt(a, o, b, style) not in banned
    ]
    if not pool:
        raise ValueError(f"exclude removes every possible problem ({what})")
    if unique and n > len(pool):
        raise ValueError(
            f"n={n} unique problems requested but only {len(pool)} exist for {what} after exclusions"
        )
    picks = rng.sample(pool, n) if unique else [rng.choice(pool) for _ in range(n)]
    return [_arith_row(a, o, b, style) for a, o, b in picks]


def _drawn_problems(rng: random.Random, n: int, ops: list[str], hi: int, style: str,
                    allowed: Callable[[int, str, int], bool], banned: set[str], unique: bool, *,
                    what: str) -> list[dict]:
    """:func:`make_arithmetic_dataset` where there are too many problems to list: draw, and reject repeats and
    excluded ones."""
    rows: list[dict] = []
    seen: set[str] = set()
    budget = 50 * n + 10_000
    while len(rows) < n:
        if budget == 0:
            raise ValueError(
                f"could not draw {n} allowed problems ({what}, unique={unique}); "
                "relax unique or exclude"
            )
        budget -= 1
        o = rng.choice(ops)
        a, b = rng.randrange(hi), rng.randrange(hi)
        prompt = _arith_prompt(a, o, b, style)
        if not allowed(a, o, b) or prompt in banned or (unique and prompt in seen):
            continue
        seen.add(prompt)
        rows.append(_arith_row(a, o, b, style))
    return rows


def train_test_split_arithmetic(
    n_train: int,
    n_test: int,
    seed: int,
    *,
    op: str | Sequence[str] = "+",
    digits: int = 2,
    style: str = "plain",
    allow_negative: bool = True,
) -> tuple[list[dict], list[dict]]:
    """A training set and a held-out test set that share no prompt.

    The test set has ``n_test`` distinct problems; the training set draws (with
    repeats) from everything else. Both are fixed by ``seed``.
    """
    n_train = check_int(None, "n_train", n_train, 1)
    n_test = check_int(None, "n_test", n_test, 1)
    seeds = random.Random(seed)
    common = {"op": op, "digits": digits, "style": style, "allow_negative": allow_negative}
    test = make_arithmetic_dataset(n_test, seeds.getrandbits(32), unique=True, **common)
    train = make_arithmetic_dataset(
        n_train, seeds.getrandbits(32), exclude={row["prompt"] for row in test}, **common
    )
    return train, test


# ---------------------------------------------------------------------------
# Countdown
# ---------------------------------------------------------------------------

_COUNTDOWN_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_AST_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_EXPRESSION_CHARS = frozenset("0123456789+-*/() \t")
_MAX_EXPRESSION_CHARS = 200
_MAX_DRAWS = 20_000  # attempts at a legal random puzzle before giving up


def _fraction_op(op: str, x: Fraction, y: Fraction) -> Fraction | None:
    """x op y exactly, or None for a division by zero."""
    if op == "/" and y == 0:
        return None
    return _COUNTDOWN_OPS[op](x, y)


def make_countdown_dataset(
    n: int,
    seed: int,
    *,
    num_numbers: int = 3,
    max_number: int = 10,
    ops: Sequence[str] = ("+", "-", "*"),
    max_target: int | None = None,
) -> list[dict]:
    """Countdown puzzles: combine the given numbers to hit the target.

    Each instance is built backwards from a random expression, so it is always
    solvable: draw ``num_numbers`` integers in ``1..max_number``, then join two
    random sub-expressions with a random operator until one is left. Every
    intermediate value must be a positive integer (so ``/`` only divides
    exactly), as in the TV game.

    Args:
        n: number of rows (>= 1).
        seed: seed of the private ``random.Random``.
        num_numbers: how many numbers each puzzle gives (>= 2).
        max_number: the largest number drawn (>= 1).
        ops: the operators the generator may use, from ``+ - * /``. The
            verifier accepts all four whatever the generator used.
        max_target: if given, puzzles whose target exceeds it are redrawn
            (products grow fast: 4 numbers up to 10 can give 10000).

    Returns:
        Rows ``{"prompt", "answer", "target", "numbers", "solution"}``:
        ``answer`` is the target as a string, ``numbers`` a shuffled list of
        ints and ``solution`` one expression that works.
    """
    n = check_int(None, "n", n, 1)
    num_numbers = check_int(None, "num_numbers", num_numbers, 2)
    max_number = check_int(None, "max_number", max_number, 1)
    if max_target is not None:
        max_target = check_int(None, "max_target", max_target, 1)
    if isinstance(ops, str):
        ops = list(ops)
    if not ops or any(o not in _COUNTDOWN_OPS for o in ops):
        raise ValueError(f"ops must be a non-empty list from {sorted(_COUNTDOWN_OPS)}, got {ops!r}")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        numbers_, solution, target = _random_puzzle(rng, num_numbers, max_number, list(ops), max_target)
        shown = numbers_[:]
        rng.shuffle(shown)
        rows.append(
            {
                "prompt": (
                    f"Using the numbers {shown}, write an expression that equals {target}. "
                    "Use each number exactly once, with + - * / and parentheses. "
                    "Put the expression inside <answer></answer>."
                ),
                "answer": str(target),
                "target": target,
                "numbers": shown,
                "solution": solution,
            }
        )
    return rows


def _random_puzzle(
    rng: random.Random, k: int, max_number: int, ops: list[str], max_target: int | None
) -> tuple[list[int], str, int]:
    """Draw k numbers and join them into a random expression with positive integer steps.

    A draw that hits an illegal step (a non-positive or fractional value), or
    whose target exceeds ``max_target``, is thrown away and redrawn, numbers included.
    """
    for _ in range(_MAX_DRAWS):
        nums = [rng.randint(1, max_number) for _ in range(k)]
        items = [(str(x), Fraction(x)) for x in nums]
        while len(items) > 1:
            i, j = rng.sample(range(len(items)), 2)
            (ls, lv), (rs, rv) = items[i], items[j]
            op = rng.choice(ops)
            value = _fraction_op(op, lv, rv)
            if value is None or value <= 0 or value.denominator != 1:
                break  # not a legal Countdown step; start this puzzle over
            items = [it for k, it in enumerate(items) if k not in (i, j)]
            items.append((f"({ls} {op} {rs})", value))
        else:
            text, value = items[0]
            if max_target is not None and value > max_target:
                continue
            return nums, (text[1:-1] if text.startswith("(") else text), int(value)
    raise ValueError(
        f"ops={ops!r} could not build a puzzle of {k} numbers up to {max_number} with positive integer "
        f"steps and a target <= {max_target} in {_MAX_DRAWS} draws; add '+' to ops or raise max_target"
    )


def evaluate_expression(expr: str) -> tuple[Fraction, list[int]]:
    """Safely evaluate an arithmetic expression from model output. Never calls ``eval``.

    Allowed: non-negative integer literals, the binary operators ``+ - * /``
    and parentheses (``x``/``×`` and ``÷`` are read as ``*`` and ``/``).
    Everything else is rejected before evaluation: names, calls, attributes,
    strings, ``**``, ``//``, unary minus, decimals. The text is first checked
    against a character whitelist, then parsed with ``ast`` and walked with a
    whitelist of node types; values are exact fractions.

    Returns:
        ``(value, numbers_used)``, the literals in the order written.

    Raises:
        ValueError: the expression is empty, too long (> 200 characters), uses
            anything outside the whitelist, or divides by zero.
    """
    if not isinstance(expr, str):
        raise TypeError(f"expr must be a str, got {type(expr).__name__}")
    text = expr.replace("\u00d7", "*").replace("\u00f7", "/").replace("\u2212", "-").strip()
    if not text:
        raise ValueError("expr is empty; expected an arithmetic expression like '(3 + 5) * 2'")
    if len(text) > _MAX_EXPRESSION_CHARS:
        raise ValueError(f"expr has {len(text)} characters; at most {_MAX_EXPRESSION_CHARS} are allowed")
    bad = sorted(set(text) - _EXPRESSION_CHARS)
    if bad:
        raise ValueError(f"expr {expr!r:.80} contains {bad!r}; only digits, + - * /, parentheses and spaces are allowed")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise ValueError(f"expr {expr!r:.80} is not a valid expression: {err}") from None
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) not in _AST_OPS:
            raise ValueError(f"expr {expr!r:.80} uses the operator {type(node.op).__name__}, which is not allowed")
        if isinstance(node, ast.BinOp):
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ValueError(f"expr {expr!r:.80} divides by zero")
            return _AST_OPS[type(node.op)](left, right)
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            used.append(node.value)
            return Fraction(node.value)
        raise ValueError(f"expr {expr!r:.80} uses {type(node).__name__}, which is not allowed")

    return walk(tree.body), used


_TAG_RE = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.DOTALL | re.IGNORECASE)


def countdown_expression(text: str) -> str | None:
    """The expression a Countdown completion proposes, or None.

    Taken from the last ``<answer>...</answer>``, else from the last non-blank
    line. A trailing ``= result`` is dropped: ``"3 * 7 + 2 = 23"`` gives
    ``"3 * 7 + 2"``.
    """
    tags = _TAG_RE.findall(text)
    if tags:
        candidate = tags[-1]
    else:
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            return None
        candidate = lines[-1]
    candidate = candidate.split("=")[0].strip()
    return candidate or None


def countdown_reward(
    completions: Sequence,
    *,
    numbers: Sequence[Sequence[int]],
    target: Sequence | None = None,
    answer: Sequence | None = None,
    **kwargs,
) -> list[float]:
    """1.0 when a completion's expression uses each given number exactly once and equals the target.

    "Exactly once" means the multiset of literals written equals ``numbers``:
    none missing, none reused, nothing extra. The expression is read by
    ``countdown_expression`` and checked by ``evaluate_expression`` (a whitelist
    parser, never ``eval``); anything it rejects scores 0.0. ``target`` is used
    when given, else ``answer`` (the dataset has both columns).
    """
    texts = completion_texts(completions)
    refs = target if target is not None else answer
    if refs is None:
        raise TypeError("countdown_reward needs target=[...] or answer=[...], one target per completion")
    refs = references_for(refs, len(texts), "target" if target is not None else "answer")
    nums_per_row = references_for(numbers, len(texts), "numbers")
    scores = []
    for i, (text, nums, ref) in enumerate(zip(texts, nums_per_row, refs)):
        goal = parse_number(str(ref))
        if goal is None:
            raise ValueError(f"target[{i}] must be a number, got {ref!r}")
        expr = countdown_expression(text)
        if expr is None:
            scores.append(0.0)
            continue
        try:
            value, used = evaluate_expression(expr)
        except ValueError:
            scores.append(0.0)
            continue
        scores.append(1.0 if sorted(used) == sorted(int(x) for x in nums) and value == goal else 0.0)
    return scores


# ---------------------------------------------------------------------------
# GSM8K (online only)
# ---------------------------------------------------------------------------


class DatasetUnavailableError(ConnectionError):
    """The dataset needs the Hugging Face hub, which is offline or unreachable."""


_FALLBACK_ADVICE = (
    "Use the generated problems instead, which work offline: "
    "grpo_tutorial.make_arithmetic_dataset(n=1000, seed=0, style='question')."
)


def gsm8k_final_answer(solution: str) -> str:
    """The number after ``####`` in a GSM8K solution, canonical (``"1,000"`` -> ``"1000"``)."""
    if not isinstance(solution, str) or "####" not in solution:
        raise ValueError(f"solution must be a GSM8K answer text ending in '#### <number>', got {solution!r:.80}")
    tail = solution.rsplit("####", 1)[1]
    value = parse_number(tail)
    if value is None:
        raise ValueError(f"no number after '####' in {solution!r:.80}")
    return canonical_number(value)


def gsm8k_rows(records) -> list[dict]:
    """GSM8K records (``question``, ``answer`` ending in ``#### N``) as prompt/answer rows.

    Each row is ``{"prompt": question, "answer": N, "solution": the worked answer}``,
    with ``N`` canonical as :func:`gsm8k_final_answer` returns it. :func:`load_gsm8k`
    maps the hub's rows with it; a local copy in the same format (one JSON object a
    line) goes through it as well.
    """
    rows = []
    for i, record in enumerate(records):
        if not isinstance(record, Mapping) or not {"question", "answer"} <= set(record):
            raise ValueError(
                f"GSM8K record {i} must be a dict with 'question' and 'answer' keys "
                f"(the answer ending in '#### <number>'), got {record!r:.120}"
            )
        try:
            answer = gsm8k_final_answer(record["answer"])
        except ValueError as err:
            raise ValueError(f"GSM8K record {i}: {err}") from None
        rows.append({"prompt": record["question"], "answer": answer, "solution": record["answer"]})
    return rows


def load_gsm8k(split: str = "train", *, timeout: float = 3.0) -> list[dict]:
    """GSM8K from the Hugging Face hub (``openai/gsm8k``, config ``main``). Online only.

    Returns:
        Rows ``{"prompt", "answer", "solution"}``: the question, the final number
        (canonical string) and the worked solution.

    Raises:
        DatasetUnavailableError: (a ``ConnectionError``) at once when
            ``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE`` or ``HF_DATASETS_OFFLINE``
            is set, when the hub does not answer within about ``timeout``
            seconds (the probe is ``pretrained.hub_reachable``), or when the download
            fails on the hub's side: an HTTP error status (429, 503, ...), a
            refused connection or a timeout. The message names the error and
            points to ``make_arithmetic_dataset``, which needs no network.
        ImportError: the ``datasets`` package is missing.
    """
    if not isinstance(split, str) or not split.strip():
        raise TypeError(f"split must be a str such as 'train' or 'test', got {split!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    from .pretrained import hub_errors, hub_reachable  # one hub probe, one list of its errors, for models and data

    flags = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    set_flags = [f for f in flags if os.environ.get(f, "").strip().upper() in {"1", "ON", "YES", "TRUE"}]
    if set_flags:
        raise DatasetUnavailableError(
            f"load_gsm8k needs the Hugging Face hub, but {set_flags[0]}={os.environ[set_flags[0]]!r} "
            f"is set (offline mode). {_FALLBACK_ADVICE}"
        )
    if not hub_reachable(timeout):
        raise DatasetUnavailableError(
            f"load_gsm8k could not reach the Hugging Face hub within {timeout:g} s. {_FALLBACK_ADVICE}"
        )
    try:
        from datasets import load_dataset
    except ImportError as err:
        raise ImportError("load_gsm8k needs the datasets package: pip install datasets") from err
    try:
        data = load_dataset("openai/gsm8k", "main", split=split)
    except hub_errors() as err:
        raise DatasetUnavailableError(
            f"load_gsm8k could not download openai/gsm8k ({type(err).__name__}: {err}). {_FALLBACK_ADVICE}"
        ) from err
    return gsm8k_rows(data)


# ---------------------------------------------------------------------------
# Validation (the trainer calls this before training)
# ---------------------------------------------------------------------------

_HUGE_MAX_LENGTH = 10**9  # transformers uses a ~1e30 placeholder when a model sets no limit


def _prompt_lengths(prompts: list, tokenizer) -> list[int]:
    """Tokens in each prompt: text as is, chat messages through the chat template."""
    lengths = []
    for prompt in prompts:
        if isinstance(prompt, str):
            ids = tokenizer(prompt)["input_ids"]
        else:
            ids = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True)
            if isinstance(ids, Mapping) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
        lengths.append(len(ids))
    return lengths


def validate_dataset(rows: Sequence[Mapping], *, tokenizer=None, max_prompt_tokens: int | None = None) -> None:
    """Check a dataset before training; raise with the row and the problem.

    Checks: the dataset is a non-empty list of dicts; every row has a
    ``"prompt"`` (a non-blank string, or a list of chat messages) and an
    ``"answer"`` that is not None; and, when a tokenizer is given, no prompt is longer than
    ``max_prompt_tokens`` (default: ``tokenizer.model_max_length`` when that is
    a real limit).

    Raises:
        TypeError: not a list of dicts, or a prompt of the wrong type.
        ValueError: empty dataset, a missing key, a blank prompt, a None
            answer, or a prompt that is too long (naming the row, its length
            and the limit).
    """
    if isinstance(rows, (str, Mapping)) or not hasattr(rows, "__len__") or not hasattr(rows, "__getitem__"):
        raise TypeError(f"rows must be a list of dicts with 'prompt' and 'answer', got {type(rows).__name__}")
    if len(rows) == 0:
        raise ValueError("the dataset is empty; expected at least one row with 'prompt' and 'answer'")
    if max_prompt_tokens is not None:
        check_int(None, "max_prompt_tokens", max_prompt_tokens, 1)
        if tokenizer is None:
            raise ValueError("max_prompt_tokens needs a tokenizer to count tokens; pass tokenizer=...")
    prompts = []
    for i in range(len(rows)):
        row = rows[i]
        if not isinstance(row, Mapping):
            raise TypeError(f"dataset row {i} must be a dict, got {type(row).__name__}: {row!r:.80}")
        for key in ("prompt", "answer"):
            if key not in row:
                raise ValueError(
                    f"dataset row {i} is missing the key {key!r} (it has {sorted(row)}); "
                    "every row needs 'prompt' and 'answer'"
                )
        prompt = row["prompt"]
        if not (isinstance(prompt, str) or is_chat_messages(prompt)):
            raise TypeError(
                f"dataset row {i}: 'prompt' must be a str or a list of chat messages, "
                f"got {type(prompt).__name__}: {prompt!r:.80}"
            )
        if isinstance(prompt, str) and not prompt.strip():
            raise ValueError(f"dataset row {i}: 'prompt' is {prompt!r}; expected the text of a problem")
        if row["answer"] is None:
            raise ValueError(f"dataset row {i}: 'answer' is None; expected the reference answer")
        prompts.append(prompt)
    if tokenizer is None:
        return
    limit = max_prompt_tokens
    if limit is None:
        model_max = getattr(tokenizer, "model_max_length", None)
        limit = model_max if isinstance(model_max, int) and model_max < _HUGE_MAX_LENGTH else None
    if limit is None:
        return
    for i, length in enumerate(_prompt_lengths(prompts, tokenizer)):
        if length > limit:
            raise ValueError(
                f"dataset row {i}: the prompt is {length} tokens, longer than the limit of {limit} "
                f"(max_prompt_tokens / the model's context); shorten it or raise the limit. Prompt: {prompts[i]!r:.80}"
            )


def as_rows(dataset: Any) -> Any:
    """Accept a Hugging Face ``datasets.Dataset`` (as TRL users have) as a list of dicts."""
    to_list = getattr(dataset, "to_list", None)
    if callable(to_list) and not isinstance(dataset, (list, tuple)):
        return to_list()
    return dataset


def check_rows(rows: Any, name: str) -> None:
    """``rows`` is a non-empty list of dicts, each with a string or chat ``prompt``."""
    if isinstance(rows, (str, dict)) or not isinstance(rows, Sequence):
        raise TypeError(f"{name} must be a list of dicts with a 'prompt' key, got {type(rows).__name__}")
    if len(rows) == 0:
        raise ValueError(f"{name} is empty; expected at least one row with a 'prompt'")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise TypeError(f"{name}[{i}] must be a dict with a 'prompt' key, got {type(row).__name__}: {row!r:.80}")
        prompt = row.get("prompt")
        if not (isinstance(prompt, str) or is_chat_messages(prompt)):
            raise ValueError(
                f"{name}[{i}] needs a 'prompt' that is a string or a list of chat messages, got {row!r:.80}"
            )


def validate_for_model(rows: Sequence[Mapping], model: Any, tokenizer: Any, max_new_tokens: int) -> None:
    """:func:`validate_dataset` with the model's context, less the completion budget, as the prompt limit."""
    check_rows(rows, "dataset")
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    max_prompt = limit - max_new_tokens if isinstance(limit, int) else None
    if max_prompt is not None and max_prompt < 1:
        raise ValueError(
            f"GRPOConfig.max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context of {limit} tokens"
        )
    validate_dataset(rows, tokenizer=tokenizer, max_prompt_tokens=max_prompt)

"""Chapter 13's task: long addition, answered at once or worked out column by column.

A prompt is a sum such as ``"4721+3856="`` and its answer the total, as in
:func:`grpo_tutorial.tasks.make_arithmetic_dataset`'s plain style. A completion
may state the sum at once (a *guess*, ``"8577"``) or *work it out* first, one
step per column from the right, then the sum:
``"(1+6=7)(2+5=7)(7+8=15)(4+3+1=8)8577"``. The reward reads the completion's last
number either way, so it checks the answer only, never the work.

* :func:`make_long_addition_dataset`: the rows, drawn from a seed.
* :func:`worked_addition`: the worked-out completion of a sum.
* :func:`parse_worked`: the one reading of a completion (a :class:`WorkedParse`):
  its style, its steps, its answer, and whether the steps add up.

These are the step's input, before stage 1, like :mod:`grpo_tutorial.tasks`, in a module of their own
because no other chapter uses them. They sit at the top level, not in
``grpo_tutorial.chapters``, because the package exports them
(``grpo_tutorial.make_long_addition_dataset``, ``worked_addition``,
``parse_worked``) and the top level imports nothing from the chapter tools;
:mod:`grpo_tutorial.chapters.thinking` builds chapter 13's runs on them.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ._checks import check_int, is_int

__all__ = [
    "WORKED_OPEN",
    "WorkedParse",
    "make_long_addition_dataset",
    "parse_worked",
    "worked_addition",
]

#: The character that opens every step of a worked-out completion, and so its first token.
WORKED_OPEN = "("
_STEP_RE = re.compile(r"\((\d)\+(\d)(\+1)?=(\d{1,2})\)")
_ADDITION_PROMPT_RE = re.compile(r"(\d+)\+(\d+)=")


def worked_addition(a: int, b: int) -> str:
    """The worked-out completion of ``a + b``: one step per column, right to left, then the sum.

    A step is ``(x+y=s)``, or ``(x+y+1=s)`` when a carry comes in from the column
    to its right; ``s`` is the column's sum, whose tens digit is the carry into
    the next column. A shorter operand is read with leading zeros. After the last
    step comes the sum itself, so the answer is the completion's last number:

    >>> worked_addition(347, 285)
    '(7+5=12)(4+8+1=13)(3+2+1=6)632'
    >>> worked_addition(5, 7)
    '(5+7=12)12'
    """
    for name, value in (("a", a), ("b", b)):
        check_int(None, name, value, 0)
    da, db = str(int(a))[::-1], str(int(b))[::-1]
    carry, steps = 0, []
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        steps.append(f"({x}+{y}{'+1' if carry else ''}={s})")
        carry = s // 10
    return "".join(steps) + str(int(a) + int(b))


def make_long_addition_dataset(
    n: int,
    seed: int,
    *,
    digits: int | Sequence[int] = 4,
    unique: bool = False,
    exclude: Collection[str] | None = None,
) -> list[dict]:
    """Sums of two ``digits``-digit numbers, to be guessed or worked out (chapter 13).

    The prompt is ``"4721+3856="``, as in :func:`~grpo_tutorial.tasks.make_arithmetic_dataset`'s plain
    style; the answer is the sum. A completion may state it at once (``"8577"``)
    or work it out first with :func:`worked_addition`'s steps; the answer a
    reward reads is the completion's last number either way.

    Args:
        n: number of rows (>= 1).
        seed: seed of the private ``random.Random`` that draws them.
        digits: how many digits each operand has (both the same: 4 gives
            1000-9999; 1 gives 0-9), or a list of counts, one drawn per row.
        unique: if True, no prompt appears twice.
        exclude: prompts never to produce (a held-out set's).

    Returns:
        Rows ``{"prompt", "answer", "a", "b", "digits"}``.
    """
    n = check_int(None, "n", n, 1)
    seed = check_int(None, "seed", seed)
    counts = [digits] if is_int(digits) else digits
    if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence) or not counts:
        raise TypeError(f"digits must be an int >= 1 or a list of them, got {digits!r}")
    counts = [check_int(None, "digits", d, 1) for d in counts]
    if exclude is not None and (isinstance(exclude, str) or not isinstance(exclude, Collection)):
        raise TypeError(f"exclude must be a set or list of prompt strings, got {type(exclude).__name__}")
    banned = set(exclude or ())
    available = sum((10 ** d - (10 ** (d - 1) if d > 1 else 0)) ** 2 for d in set(counts))
    if unique and n > available - len(banned):
        raise ValueError(f"n={n} unique problems requested but at most {available - len(banned)} exist for digits={digits!r}")
    rng = random.Random(seed)
    rows: list[dict] = []
    seen: set[str] = set()
    budget = 50 * n + 10_000
    while len(rows) < n:
        if budget == 0:
            raise ValueError(f"could not draw {n} allowed problems (digits={digits!r}, unique={unique}); relax unique or exclude")
        budget -= 1
        d = rng.choice(counts)
        low = 10 ** (d - 1) if d > 1 else 0
        a, b = rng.randrange(low, 10**d), rng.randrange(low, 10**d)
        prompt = f"{a}+{b}="
        if prompt in banned or (unique and prompt in seen):
            continue
        seen.add(prompt)
        rows.append({"prompt": prompt, "answer": str(a + b), "a": a, "b": b, "digits": d})
    return rows


@dataclass(frozen=True)
class WorkedParse:
    """What :func:`parse_worked` reads in one completion.

    Attributes:
        style: ``"worked"`` (the completion opens a step with ``(``), ``"guess"``
            (a bare number) or ``"other"`` (anything else, the empty text included).
        steps: the steps read, in order, as ``(x, y, carry_in, s)`` tuples.
        answer: the number after the last step (or the whole guess), else None.
        well_formed: the whole text is steps then a number (worked) or a number
            alone (guess), with nothing else; the arithmetic is not checked.
        consistent: well formed and every step right: ``x + y + carry_in = s``,
            each carry the tens digit of the previous step's sum, and the answer
            the number the steps spell (the last carry, then the units digits
            from the left). The steps are not compared with the prompt.
    """

    style: str
    steps: tuple[tuple[int, int, int, int], ...]
    answer: str | None
    well_formed: bool
    consistent: bool

    @property
    def worked(self) -> bool:
        """True for a completion that works the sum out (style ``"worked"``)."""
        return self.style == "worked"


def parse_worked(text: str) -> WorkedParse:
    """Read a long-addition completion: guess or worked out, its steps, its answer.

    The one reading of the format :func:`worked_addition` writes; the chapter's
    statistics, the format-only control reward and the tests all use it.

    >>> parse_worked("(7+5=12)(4+8+1=13)(3+2+1=6)632").consistent
    True
    >>> parse_worked("632").style, parse_worked("632").answer
    ('guess', '632')
    >>> parse_worked("(7+5=12)(4+8=13)632").consistent  # the carry went missing
    False
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str (one completion), got {type(text).__name__}")
    body = text.strip()
    if re.fullmatch(r"\d+", body):
        return WorkedParse("guess", (), body, True, True)
    if not body.startswith(WORKED_OPEN):
        return WorkedParse("other", (), None, False, False)
    steps, pos = [], 0
    while True:
        m = _STEP_RE.match(body, pos)
        if m is None:
            break
        steps.append((int(m.group(1)), int(m.group(2)), 1 if m.group(3) else 0, int(m.group(4))))
        pos = m.end()
    tail = re.match(r"\d+", body[pos:])
    answer = tail.group(0) if tail else None
    well_formed = bool(steps) and answer is not None and pos + len(answer) == len(body)
    consistent = well_formed and _steps_consistent(steps, answer)
    return WorkedParse("worked", tuple(steps), answer, well_formed, consistent)


def _steps_consistent(steps: list[tuple[int, int, int, int]], answer: str) -> bool:
    """Every step adds up, carries chain, and the answer is what the steps spell."""
    carry, units = 0, []
    for x, y, c, s in steps:
        if c != carry or x + y + c != s:
            return False
        units.append(str(s % 10))
        carry = s // 10
    spelled = ("1" if carry else "") + "".join(reversed(units))
    return (spelled.lstrip("0") or "0") == (answer.lstrip("0") or "0")

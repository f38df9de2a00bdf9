"""Answers: finding the final answer in a completion and comparing it with a reference.

Stage 2 (rewards) and the tasks both need the same reading of a completion, so it
lives here once:

* :func:`extract_answer` finds the answer in free text: ``<answer>...</answer>``,
  ``\\boxed{...}``, GSM8K's ``#### 42``, or else the last number.
* :func:`marked_answer` is the strict reading: only an answer the model marked
  (a tag, a box, ``####``), never a number picked out of its working. The gap
  between the two readings is chapter 18's ``extraction_mismatch``.
* :func:`answers_match` compares a prediction with a reference as exact rationals
  when both are numbers (``"1,234" == 1234``, ``"3.50" == 3.5``), else as text.
* :func:`parse_number` and :func:`canonical_number` read and write one number;
  :func:`last_number` and :func:`last_boxed` find the last number and the last
  ``\\boxed{}`` in a text (chapter 9's format reward uses them).
* :func:`completion_texts` turns TRL's two completion formats (strings, or lists
  of chat messages, as :func:`~grpo_tutorial.chat.is_chat_messages` defines them)
  into strings, with errors that name the bad item; :func:`references_for` checks
  the ``answer`` column a reward function receives.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction

from .chat import is_chat_messages

__all__ = [
    "answer_readings",
    "answers_match",
    "canonical_number",
    "completion_texts",
    "completion_to_text",
    "extract_answer",
    "last_boxed",
    "last_number",
    "marked_answer",
    "parse_number",
    "references_for",
]

# ---------------------------------------------------------------------------
# Numbers: finding them in text and writing them one canonical way
# ---------------------------------------------------------------------------

# A number in free text. Pieces, in order:
#   (?<![\d.])                 do not start in the middle of a number
#   sign                       "-", "+" or the unicode minus, but only when it is
#                              not glued to a word or a closing bracket, so the
#                              "-" in "12-5" is an operator and "5" is the number
#   \frac{p}{q}                a LaTeX fraction (also \dfrac, \tfrac)
#   1,234,567.8                commas only as thousands separators (groups of 3)
#   1234.5 / .5                plain integers and decimals
_NUMBER_RE = re.compile(
    r"(?<![\d.])"
    r"(?:(?<![\w)\]}])(?P<sign>[-+\u2212]))?"
    r"(?:"
    r"\\[dt]?frac\{\s*(?P<fnum>\d+)\s*\}\{\s*(?P<fden>\d+)\s*\}"
    r"|(?P<num>\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r")"
)

# A string that is *only* a number, give or take "$", "%", spaces and a full stop.
_PLAIN_NUMBER_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)")
_FRACTION_RE = re.compile(r"([-+]?)(\d+)\s*/\s*(\d+)")
_LATEX_FRACTION_RE = re.compile(r"([-+]?)\\[dt]?frac\{\s*(\d+)\s*\}\{\s*(\d+)\s*\}")

_ANSWER_TAG_RE = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.DOTALL | re.IGNORECASE)
_GSM8K_RE = re.compile(r"^[ \t]*####[ \t]*(.*?)[ \t]*$", re.MULTILINE)
_BOXED_RE = re.compile(r"\\boxed\s*\{")


def canonical_number(value: Fraction) -> str:
    """Write a rational number one way only: ``12``, ``-3.5`` or ``1/3``.

    Integers lose any ``.0``; a value with a finite decimal expansion is written
    as a decimal without trailing zeros; anything else stays a reduced fraction.
    """
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den != 1:  # e.g. 1/3: no finite decimal
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)  # the fewest decimal places that are exact, so no trailing zeros
    scaled = abs(value.numerator) * 10**places // value.denominator
    digits = str(scaled).rjust(places + 1, "0")
    text = f"{digits[:-places]}.{digits[-places:]}"
    return f"-{text}" if value < 0 else text


def _clean_number_text(text: str) -> str:
    """Drop the decorations that do not change a number's value."""
    t = text.strip().replace("\u2212", "-")
    t = t.replace("\\$", "").replace("\\%", "").replace("{,}", ",").replace("\\!", "")
    t = t.strip().rstrip(".").strip()
    t = t.replace("$", "").replace("%", "").strip()
    return t


def parse_number(text: str) -> Fraction | None:
    """The value of a string that holds exactly one number, else None.

    Accepts ``1,234``, ``-7``, ``3.50``, ``$5``, ``50%``, ``3/4`` and ``\\frac{3}{4}``.
    """
    t = _clean_number_text(text)
    if _PLAIN_NUMBER_RE.fullmatch(t):
        return Fraction(t.replace(",", ""))
    for pattern in (_FRACTION_RE, _LATEX_FRACTION_RE):
        m = pattern.fullmatch(t)
        if m and int(m.group(3)) != 0:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) == "-" else value
    return None


def _match_value(m: re.Match) -> Fraction | None:
    """The value of one ``_NUMBER_RE`` match (None for a fraction over zero)."""
    if m.group("num") is not None:
        value = Fraction(m.group("num").replace(",", ""))
    else:
        den = int(m.group("fden"))
        if den == 0:
            return None
        value = Fraction(int(m.group("fnum")), den)
    return -value if m.group("sign") in ("-", "\u2212") else value


def last_number(text: str) -> Fraction | None:
    """The value of the last number written anywhere in ``text``, as an exact rational, else None.

    Numbers are read as :func:`parse_number` reads them (``1,234``, ``-7``,
    ``3.5``, ``\\frac{3}{4}``); a ``-`` glued to a word or a closing bracket is an
    operator, so the last number of ``"12-5"`` is 5.

    >>> last_number("12 apples, then 1,234.5 pears")
    Fraction(2469, 2)
    >>> last_number("no digits") is None
    True
    """
    values = [v for v in map(_match_value, _NUMBER_RE.finditer(text)) if v is not None]
    return values[-1] if values else None


def _normalise_text(text: str) -> str:
    """Strip, collapse runs of whitespace and casefold (for non-numeric answers)."""
    return " ".join(text.split()).casefold()


def _answer_from_content(content: str) -> str | None:
    """What an ``<answer>`` tag or a ``\\boxed{}`` holds, normalised.

    A content that is one number, or that contains numbers, gives the (last)
    number in canonical form. Text without numbers is returned stripped. An
    empty content gives None.
    """
    stripped = content.strip()
    if not stripped:
        return None
    value = parse_number(stripped)
    if value is None:
        value = last_number(stripped)
    if value is not None:
        return canonical_number(value)
    return " ".join(stripped.split())


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` whose braces balance, else None.

    Nested braces count: ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``. The
    content is returned as written; :func:`extract_answer` normalises it.

    >>> last_boxed(r"so \\boxed{3} or rather \\boxed{\\frac{1}{2}}")
    '\\\\frac{1}{2}'
    """
    found = None
    for m in _BOXED_RE.finditer(text):
        depth, start = 1, m.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    found = text[start:i]
                    break
    return found


def extract_answer(text: str) -> str | None:
    """Pull the final answer out of a model's text, normalised for comparison.

    Looks for, in this order of priority (the first kind present decides):

    1. the last ``<answer>...</answer>``;
    2. the last ``\\boxed{...}`` (nested braces are fine: ``\\boxed{\\frac{1}{2}}``);
    3. GSM8K's final line ``#### 42`` (only when that line is just a number);
    4. the last number anywhere in the text.

    Numbers come back in one canonical form, so equal values give equal
    strings: commas as thousands separators are dropped (``1,234`` -> ``1234``),
    signs are kept (``-7``), ``$`` and ``%`` are dropped, decimals lose trailing
    zeros (``3.50`` -> ``3.5``, ``12.0`` -> ``12``), and ``\\frac{3}{4}`` -> ``0.75``.

    Inside a tag or a box the last number wins (``<answer>2+2=4</answer>`` -> ``4``);
    if there is no number there, the stripped text is returned
    (``<answer> Paris </answer>`` -> ``Paris``). An empty tag or box returns None
    without falling back to later rules: the model did answer, with nothing.

    Returns:
        The normalised answer, or None when nothing answer-like is found.
    """
    found, marked = _marked(text)
    if marked:
        return found
    value = last_number(text)
    return None if value is None else canonical_number(value)


def _marked(text: str) -> tuple[str | None, bool]:
    """``(answer, True)`` from the first of rules 1-3 of :func:`extract_answer` that applies, else ``(None, False)``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}: {text!r:.80}")
    tags = _ANSWER_TAG_RE.findall(text)
    if tags:
        return _answer_from_content(tags[-1]), True
    boxed = last_boxed(text)
    if boxed is not None:
        return _answer_from_content(boxed), True
    for line in reversed(_GSM8K_RE.findall(text)):
        value = parse_number(line)
        if value is not None:
            return canonical_number(value), True
    return None, False


def marked_answer(text: str) -> str | None:
    """The strict reading of a completion: the answer it *marks*, or None.

    Rules 1-3 of :func:`extract_answer` only (the last ``<answer>`` tag, the last
    ``\\boxed{}``, GSM8K's ``#### N`` line), normalised the same way; a text that
    marks no answer gives None instead of its last number. verl's GSM8K score reads
    ``####`` only, and the same Qwen2.5-0.5B-Instruct scores 36.4 there against 49.6
    in Qwen's report: a model that answers in prose loses the difference to the
    reading, not to the mathematics (chapter 18).

    >>> marked_answer("3 + 4 = 7"), extract_answer("3 + 4 = 7")
    (None, '7')
    >>> marked_answer("3 + 4 = 7\\n#### 7")
    '7'
    """
    return _marked(text)[0]


def _reference_value(ref: object, name: str) -> Fraction | str:
    """A reference answer as a number when it is one, else as normalised text."""
    if isinstance(ref, bool) or not isinstance(ref, (str, numbers.Real)):
        raise TypeError(f"{name} must be a str or a number, got {type(ref).__name__}: {ref!r:.80}")
    if isinstance(ref, str):
        value = parse_number(ref)
        return value if value is not None else _normalise_text(ref)
    if isinstance(ref, numbers.Integral):
        return Fraction(int(ref))
    if not math.isfinite(float(ref)):
        raise ValueError(f"{name} must be a finite number, got {ref!r}")
    return Fraction(repr(float(ref)))  # 0.1 means the decimal 0.1, not its binary neighbour


def answers_match(pred: str | float | None, ref: str | float) -> bool:
    """True when a predicted answer equals the reference.

    If both parse as numbers (``"1,234"``, ``"3.50"``, ``"$5"``, ``"3/4"``, ints,
    floats) they are compared as exact rationals, so ``"3.5" == 3.50`` and
    ``"12" == 12.0``. Otherwise both are compared as text after stripping,
    collapsing whitespace and casefolding. A ``pred`` of None never matches.
    """
    if pred is None:
        return False
    p = _reference_value(pred, "pred")
    r = _reference_value(ref, "ref")
    if isinstance(p, Fraction) and isinstance(r, Fraction):
        return p == r
    if isinstance(p, Fraction) or isinstance(r, Fraction):
        return False  # a number never equals a non-numeric text
    return p == r



def completion_to_text(completion: object) -> str:
    """The text of one completion, in either of TRL's two formats.

    A string is returned as is. A list of chat messages gives the content of the
    last ``assistant`` message (or of the last message if none has that role);
    a content given as a list of blocks (``{"type": "text", "text": ...}``)
    is joined.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        completion = [completion]
    if is_chat_messages(completion):
        assistant = [m for m in completion if m.get("role") == "assistant"]
        message = (assistant or list(completion))[-1]
        content = message.get("content", "")
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        if isinstance(content, Sequence):
            return "".join(
                block.get("text", "") if isinstance(block, Mapping) else str(block) for block in content
            )
    raise TypeError(
        "a completion must be a str or a list of chat messages like "
        f"[{{'role': 'assistant', 'content': '...'}}], got {type(completion).__name__}: {completion!r:.80}"
    )


def completion_texts(completions: object) -> list[str]:
    """The text of each completion: what every reward function reads first.

    ``completions`` is a list of strings or of chat message lists (TRL's two
    formats); each item goes through :func:`completion_to_text`. A str, a dict
    or a non-list raises ``TypeError``, and so does a bad item, naming its index.
    """
    if isinstance(completions, (str, Mapping)) or not isinstance(completions, Sequence):
        raise TypeError(
            f"completions must be a list (one item per completion), got {type(completions).__name__}"
        )
    texts = []
    for i, c in enumerate(completions):
        try:
            texts.append(completion_to_text(c))
        except TypeError as err:
            raise TypeError(f"completions[{i}]: {err}") from None
    return texts


def references_for(answer: object, n: int, name: str = "answer") -> list:
    """``answer`` as a list, checked to hold one reference per completion (``n`` of them).

    A reward function receives the dataset's ``answer`` column this way; ``name``
    is what the error messages call it. Not a list: ``TypeError``; a list of
    the wrong length: ``ValueError``.
    """
    if isinstance(answer, (str, Mapping)) or not isinstance(answer, Sequence):
        raise TypeError(
            f"{name} must be a list with one reference per completion, got {type(answer).__name__}: {answer!r:.80}"
        )
    if len(answer) != n:
        raise ValueError(f"{name} has {len(answer)} items but there are {n} completions; expected one per completion")
    return list(answer)



def answer_readings(completion: object, answer: object) -> dict:
    """Both readings of a completion's answer and whether each matches ``answer``: what a run keeps of each kept
    completion (:mod:`~grpo_tutorial.run.completions`) and chapter 18's doctor reads.

    ``{"extracted": {"lenient": ..., "strict": ...}, "correct": {"lenient": ..., "strict": ...}}``: the lenient
    reading is :func:`extract_answer`'s, the strict one :func:`marked_answer`'s (``#### 42`` or a boxed answer
    only); ``correct`` is None when there is no reference to match (``answer`` None or not a number or text).

    >>> answer_readings("6 * 7 = 42", 42)["correct"]
    {'lenient': True, 'strict': False}
    """
    text = completion_to_text(completion)
    extracted = {"lenient": extract_answer(text), "strict": marked_answer(text)}
    correct = None
    if isinstance(answer, (str, int, float)) and not isinstance(answer, bool):
        try:
            correct = {k: answers_match(v, answer) for k, v in extracted.items()}
        except (TypeError, ValueError):  # a reference that is not a number or a text (inf, say)
            correct = None
    return {"extracted": extracted, "correct": correct}

"""A calculator tool that nothing the model writes can abuse, and TRL's rules for one tool call.

Stage 1 with tools (chapter 16): the policy writes an arithmetic expression, the tool
computes it, and the result goes back into the completion (GSM8K's solutions carry such
calls as ``<<48/2=24>>``: the model writes ``48/2``, the tool answers ``24``). The model
writes whatever it likes, so the tool must never run what it writes, nor hang the run:

* :func:`calculator` reads the expression with a small recursive-descent parser, never
  ``eval``, ``exec`` or ``compile``: numbers, ``+ - * /``, unary minus and parentheses,
  nothing else. It computes exactly, with :class:`fractions.Fraction`, within fixed bounds
  (:data:`MAX_LENGTH` characters, :data:`MAX_DIGITS` digits a number, :data:`MAX_DEPTH`
  levels of nesting, every value's numerator and denominator below :data:`MAX_VALUE`),
  so every call is over in microseconds. There is no power operator: ``9**9**9`` has
  about 370 million digits. Bad input raises :class:`CalculatorError`.
* :func:`call_with_time_limit` runs any tool with a time limit, in a worker thread.
* :func:`run_tool_call` runs one call as TRL 1.16's ``GRPOTrainer._tool_call_loop`` does:
  an error becomes an ``{"error": ...}`` result the model sees, never an exception that
  ends the run.
* :func:`safe_text` turns anything a tool returns or raises into text the tokenizer takes:
  a ``str()`` that raises, or a lone surrogate (``"\\ud800"``, which JSON lets the model
  write), never reaches the tokenizer as such.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from .._checks import check_time_limit

__all__ = [
    "MAX_ABANDONED", "MAX_DEPTH", "MAX_DIGITS", "MAX_LENGTH", "MAX_VALUE",
    "CalculatorError", "ToolTimeout", "abandoned_calls", "calculator", "call_with_time_limit", "run_tool_call",
    "safe_text",
]

#: The longest expression, in characters.
MAX_LENGTH = 100
#: The most digits one number may have (before and after its decimal point together).
MAX_DIGITS = 20
#: The deepest nesting of parentheses and unary minus.
MAX_DEPTH = 20
#: Every value, the intermediate ones too, has |numerator| and denominator below this.
MAX_VALUE = 10**30
#: Decimal places of a result that is not a whole number (rounded half to even, trailing zeros dropped).
PLACES = 6
DIGITS = "0123456789"  # ASCII only: ``\d`` and ``str.isdigit`` also take '٣' and '²'
#: One token: a number, ``**``, an operator or a parenthesis, a run of spaces, or any other one character.
TOKEN = re.compile(r"[0-9]+(?:\.[0-9]+)?|\*\*|[-+*/()^]|[ \t]+|.", re.DOTALL)


#: The most tool calls left running in the background (past their time limit) before new calls are refused.
#: Python cannot kill a thread: an abandoned call runs on until it ends, holding its thread and whatever CPU and
#: memory it uses. The cap bounds how many a run can pile up; a call refused for it gets an error result.
MAX_ABANDONED = 16
_abandoned: set[threading.Thread] = set()
_abandoned_lock = threading.Lock()


def abandoned_calls() -> int:
    """How many tool calls abandoned at their time limit are still running (their threads cannot be stopped)."""
    with _abandoned_lock:
        for thread in [t for t in _abandoned if not t.is_alive()]:
            _abandoned.discard(thread)
        return len(_abandoned)


def safe_text(value: Any) -> str:
    """``str(value)``, made safe for a tokenizer: a ``str()`` that raises gives ``repr``'s text or a placeholder, and
    lone surrogates (which no UTF-8 text holds) are written as ``\\udXXX`` escapes."""
    if not isinstance(value, str):
        try:
            value = str(value)
        except Exception:  # noqa: BLE001 - a tool's object may raise anything from __str__
            try:
                value = repr(value)
            except Exception:  # noqa: BLE001
                value = f"<an unprintable {type(value).__name__}>"
    if not isinstance(value, str):  # a __str__ that returned something else
        value = f"<an unprintable {type(value).__name__}>"
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


class CalculatorError(ValueError):
    """The expression cannot be computed; the message says why, in a few words."""


class ToolTimeout(TimeoutError):
    """A tool call ran past its time limit (its thread was abandoned, not stopped)."""


def calculator(expression: str) -> str:
    """Compute an arithmetic expression exactly: numbers, + - * /, unary minus and parentheses.

    Args:
        expression: The arithmetic to compute, for example "48/2" or "(3 + 4) * -2.5".

    Returns:
        The value: a whole number ("24"), or a decimal with at most 6 places ("0.333333").
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"the expression must be a string, not {type(expression).__name__}")
    if len(expression) > MAX_LENGTH:
        raise CalculatorError(f"expression too long: {len(expression)} characters (at most {MAX_LENGTH})")
    return _format(_Parser(expression).parse())


def _format(value: Fraction) -> str:
    """``value`` as the calculator writes it: ``"408"``, ``"2.5"``, ``"-0.333333"``."""
    if value.denominator == 1:
        return str(value.numerator)
    scaled = round(value * 10**PLACES)  # Fraction's round: half to even
    whole, fraction = divmod(abs(scaled), 10**PLACES)
    text = f"{whole}.{fraction:0{PLACES}d}".rstrip("0").rstrip(".")
    return "-" + text if scaled < 0 else text


class _Parser:
    """expression := term (('+' | '-') term)*;  term := factor (('*' | '/') factor)*;
    factor := '-' factor | number | '(' expression ')'.  One method per rule."""

    def __init__(self, text: str):
        self.text, self.tokens, self.i, self.depth = text, _tokens(text), 0, 0

    def parse(self) -> Fraction:
        if not self.tokens:
            raise CalculatorError("empty expression")
        value = self.expression()
        if self.i < len(self.tokens):
            token, pos = self.tokens[self.i]
            raise CalculatorError(f"unexpected {token!r} at position {pos} after a complete expression")
        return value

    def peek(self) -> str | None:
        return self.tokens[self.i][0] if self.i < len(self.tokens) else None

    def expression(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op, pos = self.tokens[self.i]
            self.i += 1
            value = _bounded(value + self.term() if op == "+" else value - self.term(), pos)
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op, pos = self.tokens[self.i]
            self.i += 1
            right = self.factor()
            if op == "/" and right == 0:
                raise CalculatorError(f"division by zero at position {pos}")
            value = _bounded(value * right if op == "*" else value / right, pos)
        return value

    def factor(self) -> Fraction:
        if self.i == len(self.tokens):
            raise CalculatorError(f"expected a number or '(' at position {len(self.text)}, the end")
        token, pos = self.tokens[self.i]
        self.i += 1
        if token in ("-", "("):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise CalculatorError(f"too deeply nested at position {pos} (at most {MAX_DEPTH} levels)")
            if token == "-":
                value = -self.factor()
            else:
                value = self.expression()
                if self.peek() != ")":
                    raise CalculatorError(f"missing ')' for the '(' at position {pos}")
                self.i += 1
            self.depth -= 1
            return value
        if token[0] in DIGITS:
            return _bounded(Fraction(token), pos)
        raise CalculatorError(f"expected a number or '(' at position {pos}, found {token!r}")


def _tokens(text: str) -> list[tuple[str, int]]:
    """The tokens of ``text`` with their positions: numbers (``12``, ``2.5``), ``+ - * / ( )``; spaces skipped."""
    tokens = []
    for match in TOKEN.finditer(text):
        token, k = match.group(), match.start()
        if token in ("**", "^"):
            raise CalculatorError(f"no power operator ({token!r} at position {k}): write the product out")
        if token[0] not in DIGITS + "+-*/() \t":
            raise CalculatorError(f"unexpected character {token!r} at position {k}")
        if token[0] in DIGITS and len(token.replace(".", "")) > MAX_DIGITS:
            raise CalculatorError(f"number too long at position {k} (at most {MAX_DIGITS} digits)")
        if token[0] not in " \t":
            tokens.append((token, k))
    return tokens


def _bounded(value: Fraction, pos: int) -> Fraction:
    if abs(value.numerator) >= MAX_VALUE or value.denominator >= MAX_VALUE:
        limit = f"10**{len(str(MAX_VALUE)) - 1}"
        raise CalculatorError(f"number too large at position {pos} (every value stays below {limit})")
    return value


def call_with_time_limit(fn: Callable[..., Any], arguments: Mapping[str, Any], seconds: float) -> Any:
    """``fn(**arguments)``, waiting at most ``seconds``: its result, its exception, or :class:`ToolTimeout`.

    The call runs in a daemon thread. Python cannot kill a thread, so a call past its
    limit is abandoned, not stopped: its thread runs on in the background until it ends
    (and dies with the process). The limit keeps the run going; it cannot take back the
    time or memory of a tool that never ends, which is why :func:`calculator` bounds
    its own work.
    """
    check_time_limit(None, "seconds", seconds, optional=False)
    if abandoned_calls() >= MAX_ABANDONED:
        raise ToolTimeout(f"{MAX_ABANDONED} tool calls are still running past their time limit; no more are started")
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["result"] = fn(**arguments)
        except BaseException as error:  # handed to the caller, who sees it as if it had called fn
            outcome["error"] = error

    name = getattr(fn, "__name__", "tool")
    worker = threading.Thread(target=work, name=f"tool call {name}", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        with _abandoned_lock:
            _abandoned.add(worker)
        raise ToolTimeout(f"Tool {safe_text(name)} timed out after {seconds:g} s.")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def run_tool_call(
    tools: Mapping[str, Callable[..., Any]], name: str, arguments: Any, time_limit: float | None = None,
) -> tuple[Any, bool]:
    """One tool call as TRL 1.16's ``GRPOTrainer._tool_call_loop`` runs it: ``(result, failed)``.

    TRL's rules: the tool's return value, as it is, when the call succeeds; a tool that
    raises gives ``{"error": str(e)}``; a name not in ``tools`` gives
    ``{"error": "Tool <name> not found."}``. Each error counts as a failure (TRL's
    ``tool_failure_count``). Ours, where TRL has no rule: with ``time_limit`` (seconds),
    a call past it gives ``{"error": "Tool <name> timed out after <seconds> s."}``
    (TRL has no time limit); arguments that are not a dict give an error result that
    says so (TRL would call ``tool(**arguments)`` and report Python's TypeError). Both
    are failures. It never raises for anything the model wrote; ``tools`` not a dict,
    or a bad ``time_limit``, are the caller's mistakes and raise.
    """
    if not isinstance(tools, Mapping):
        raise TypeError(f"tools must be a dict of name -> function, not {type(tools).__name__}")
    if time_limit is not None:
        check_time_limit(None, "time_limit", time_limit)
    tool = tools.get(name) if isinstance(name, str) else None
    if tool is None:
        return {"error": f"Tool {safe_text(name)} not found."}, True
    if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
        return {"error": f"Tool {name} takes its arguments as a JSON object, not {type(arguments).__name__}."}, True
    try:
        result = tool(**arguments) if time_limit is None else call_with_time_limit(tool, arguments, time_limit)
    except Exception as error:  # TRL catches Exception, so KeyboardInterrupt still stops the run
        return {"error": safe_text(error)}, True
    # a tool that answers with an error result of its own: shown to the model as one, and counted as one (ours:
    # TRL counts only the calls that raise)
    return result, isinstance(result, Mapping) and "error" in result

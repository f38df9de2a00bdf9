"""Completions shown while training: a few prompts, what the model wrote, and what it earned.

A reward curve alone hides what the model actually writes. With
``GRPOConfig.log_completions`` (TRL's name), every ``log_every`` steps the
trainer picks ``num_completions_to_print`` of the step's completions (all of
them when it is None, TRL's default), prints them (with the progress bar's
``write`` when there is a bar, so the bar stays below them) and appends them to
``output_dir/completions.jsonl``, one JSON object per completion::

    {"step": 12, "prompt": "3+4=", "completion": "7", "reward": 1.0,
     "rewards": {"correctness_reward": 1.0}, "advantage": 0.87}

``reward`` is the weighted total the advantages were computed from, ``rewards``
each function's own value (``null`` where it could not score the completion).
The sample is drawn with a generator seeded by the run's seed and the step, so
it is the same on every run and after a resume, and it touches no global RNG.
Resuming cuts the file back to the checkpoint's step, as the history is cut, so
an interrupted and resumed run leaves the same file as an uninterrupted one.

Whether or not it prints them, a run *keeps* ``GRPOConfig.completions_to_keep``
completions of every step (8 by default; another seeded draw) in the same file,
with what chapter 18's doctor reads beside the curves
(:func:`sample_completions` with ``details``): the row's reference ``answer``,
``index`` and ``group`` in the batch, whether it was ``truncated``, its
``length`` in the policy's tokens, its ``tool_calls`` and ``tool_failures``
(with tools), and both readings of its answer, ``extracted`` and ``correct``,
``{"lenient": ..., "strict": ...}`` (:func:`~grpo_tutorial.answers.extract_answer`
and :func:`~grpo_tutorial.answers.marked_answer`), computed on the whole text. A
kept row is at most :data:`ROW_BYTES` bytes of JSON (a long prompt or completion
keeps its beginning and its end), so a step adds at most
``completions_to_keep * ROW_BYTES`` bytes.
"""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..chat import is_chat_messages
from .disk import disk_errors
from .layout import COMPLETIONS_FILE

__all__ = ["COMPLETIONS_FILE", "CompletionsWriter", "ROW_BYTES", "append_completions", "format_completions",
           "read_completions", "sample_completions", "truncate_completions"]

#: The most bytes (UTF-8 JSON, without its newline) a kept row may take.
ROW_BYTES = 8192
#: A kept prompt or completion of chat messages keeps at most this many (the last ones).
MAX_MESSAGES = 4


def _number(value: Any) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value


def sample_completions(
    step: int,
    prompts: Sequence,
    completions: Sequence[str],
    rewards: Sequence[float],
    per_function: Mapping[str, Sequence[float]],
    advantages: Sequence[float],
    *,
    count: int | None,
    seed: int,
    details: Mapping[str, Sequence | None] | None = None,
    group_size: int | None = None,
    stream: str = "completions",
    readings: Callable[[Any, Any], dict] | None = None,
) -> list[dict]:
    """The rows to log for ``step``: ``count`` completions drawn without replacement (None = all), in batch order.

    Every sequence has one entry per completion (N of them); ``per_function``
    maps each reward function's name to its N values. The draw depends only on
    ``seed``, ``step`` and ``stream`` (the printed sample's, or ``"kept"``).

    With ``details`` (:attr:`~grpo_tutorial.step.GRPOStep.last_details`: ``answers``,
    ``truncated``, ``lengths``, ``tool_calls``, ``tool_failures``) each row is a kept
    row: those fields, its ``index`` (and ``group``, with ``group_size``) in the batch,
    what ``readings(completion, answer)`` reads of its answer
    (:func:`~grpo_tutorial.answers.answer_readings`: both readings and whether each
    matches; the run machinery reads no answers itself), texts cut to fit
    :data:`ROW_BYTES` (see the module).
    """
    n = len(completions)
    checked = [("prompts", prompts), ("rewards", rewards), ("advantages", advantages),
               *((f"per_function[{k!r}]", v) for k, v in per_function.items())]
    if details is not None:
        checked += [(f"details[{k!r}]", v) for k, v in details.items() if v is not None]
    for name, values in checked:
        if len(values) != n:
            raise ValueError(f"{name} has {len(values)} entries but there are {n} completions")
    if count is None or count >= n:
        chosen = list(range(n))
    else:
        chosen = sorted(random.Random(f"{stream}:{seed}:{step}").sample(range(n), count))
    rows = []
    for i in chosen:
        row = {
            "step": int(step),
            "prompt": prompts[i],
            "completion": completions[i],
            "reward": _number(rewards[i]),
            "rewards": {name: _number(values[i]) for name, values in per_function.items()},
            "advantage": _number(advantages[i]),
        }
        if details is not None:
            row = _kept_row(row, i, details, group_size, readings)
        rows.append(row)
    return rows


def _kept_row(row: dict, i: int, details: Mapping[str, Sequence | None], group_size: int | None,
              readings: Callable[[Any, Any], dict] | None) -> dict:
    """``row`` with the doctor's fields for completion ``i``, its texts cut to fit :data:`ROW_BYTES`."""
    answer = details["answers"][i] if details.get("answers") is not None else None
    kept = {"step": row["step"], "index": i, "group": None if group_size is None else i // group_size, **row}
    kept["answer"] = answer if answer is None or isinstance(answer, (int, float)) else str(answer)
    for key, name in (("truncated", "truncated"), ("lengths", "length"), ("tool_calls", "tool_calls"),
                      ("tool_failures", "tool_failures")):
        if details.get(key) is not None:
            value = details[key][i]
            kept[name] = bool(value) if key == "truncated" else int(value)
    if readings is not None:
        kept.update(readings(row["completion"], answer))
    return _fit(kept)


def _cut(value: Any, limit: int) -> Any:
    """A text (or each chat message's content, the last :data:`MAX_MESSAGES` of them) cut to ``limit``
    characters: its beginning and its end around a marker that says how much was cut."""
    if is_chat_messages(value):
        return [{**m, "content": _cut(m["content"], limit)} for m in value[-MAX_MESSAGES:]]
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    head = limit // 3
    tail = limit - head
    return f"{text[:head]} […{len(text) - limit} characters cut…] {text[len(text) - tail:] if tail else ''}"


def _size(row: dict) -> int:
    return len(json.dumps(row, ensure_ascii=False).encode("utf-8"))


def _fit(row: dict) -> dict:
    """``row`` with its texts (prompt, completion, answer and its readings) cut until it takes at most
    :data:`ROW_BYTES` bytes; a row that cannot fit even so keeps its numbers only."""
    texts = ("prompt", "completion", "answer")
    limit = 4096
    fitted = row
    while _size(fitted) > ROW_BYTES and limit >= 16:
        fitted = dict(row)
        for key in texts:
            if isinstance(row.get(key), (str, list)):
                fitted[key] = _cut(row[key], limit)
        fitted["extracted"] = {k: None if v is None else _cut(v, limit) for k, v in row["extracted"].items()}
        limit //= 2
    if _size(fitted) > ROW_BYTES:  # hundreds of reward functions, say: the numbers that matter, and the cut
        fitted = {k: row[k] for k in ("step", "index", "group", "reward", "advantage") if k in row}
        fitted["cut"] = True
    return fitted


def append_completions(file, rows: Sequence[dict]) -> None:
    """Append ``rows`` to an open ``completions.jsonl``, one line each, and flush."""
    for row in rows:
        file.write(json.dumps(row, ensure_ascii=False) + "\n")
    file.flush()


def read_completions(path: str | os.PathLike) -> list[dict]:
    """The rows of a ``completions.jsonl`` ([] if there is none). A last line cut off by a kill is dropped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    for number, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines) - 1 and not line.endswith("\n"):
                break  # the line being written when the run was killed
            raise ValueError(f"{path}: line {number + 1} is not JSON; the file is damaged") from None
    return rows


def truncate_completions(path: str | os.PathLike, step: int) -> None:
    """Keep the rows of steps <= ``step`` (the checkpoint's), atomically; the later steps are redone on resume."""
    path = Path(path)
    if not path.exists():
        return
    kept = [row for row in read_completions(path) if row["step"] <= step]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as file:
        append_completions(file, kept)
        os.fsync(file.fileno())
    os.replace(tmp, path)


def _one_line(value: Any) -> str:
    """The text of a prompt or completion on one line (chat messages: the last one's content)."""
    if is_chat_messages(value):
        value = value[-1]["content"]
    return " ".join(str(value).split())


def _short(value: Any, width: int) -> str:
    """The first ``width`` characters, "…" where the rest is cut."""
    text = _one_line(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _ends(value: Any, head: int, tail: int) -> str:
    """The whole text if it is short, else its first ``head`` and last ``tail`` characters around " … "."""
    text = _one_line(value)
    return text if len(text) <= head + tail + 3 else f"{text[:head].rstrip()} … {text[-tail:].lstrip()}"


def format_completions(
    rows: Sequence[dict], *, total: int | None = None, prompt_width: int = 40, head: int = 40, tail: int = 60
) -> str:
    """A few lines of text for the console: the step, then one line per completion.

    Each line holds the completion's reward (and each function's, when there are
    several), its advantage, the prompt's first ``prompt_width`` characters and the
    completion, whitespace and newlines collapsed. A completion longer than
    ``head + tail`` characters shows its first ``head`` and last ``tail``
    characters around " … ": its end is where the answer the reward pays for
    usually is (``\\boxed{72}``). ``total`` is the number of completions in the step
    (shown as "3 of 128").
    """
    if not rows:
        return ""
    step = rows[0]["step"]
    top = f"step {step}: {len(rows)}" + (f" of {total}" if total is not None else "") + " completions"
    lines = [top]
    for row in rows:
        reward = "  n/a" if row["reward"] is None else f"{row['reward']:5.2f}"
        parts = ""
        if len(row["rewards"]) > 1:
            parts = " (" + ", ".join(
                f"{name.removesuffix('_reward')} {'n/a' if v is None else f'{v:g}'}" for name, v in row["rewards"].items()
            ) + ")"
        lines.append(
            f"  reward {reward}{parts}  adv {row['advantage']:+.2f}  "
            f"{_short(row['prompt'], prompt_width)} -> '{_ends(row['completion'], head, tail)}'"
        )
    return "\n".join(lines)


class CompletionsWriter:
    """A run's ``completions.jsonl`` while :meth:`GRPOTrainer.train` runs.

    Opening cuts the file back to ``step`` (the checkpoint's; the later steps are
    redone), and, when ``enabled`` (``log_completions``, or ``completions_to_keep``), opens it for
    :meth:`append`. With ``output_dir=None`` every method does nothing.
    """

    def __init__(self, output_dir: str | os.PathLike | None, step: int, *, enabled: bool) -> None:
        self.output_dir = None if output_dir is None else Path(output_dir)
        self.path = None if self.output_dir is None else self.output_dir / COMPLETIONS_FILE
        self._handle = None
        if self.path is not None:
            with disk_errors(self.path, self.output_dir):
                truncate_completions(self.path, step)
                if enabled:
                    self._handle = open(self.path, "a", encoding="utf-8")

    def append(self, rows: Sequence[dict]) -> None:
        if self._handle is not None:
            with disk_errors(self.path, self.output_dir):
                append_completions(self._handle, rows)

    def show(self, rows: Sequence[dict], *, total: int | None = None, bar: Any = None) -> None:
        """Append ``rows`` and print them (:meth:`show_only`)."""
        self.append(rows)
        self.show_only(rows, total=total, bar=bar)

    @staticmethod
    def show_only(rows: Sequence[dict], *, total: int | None = None, bar: Any = None) -> None:
        """Print ``rows``: with the progress bar's ``write`` (the bar stays at the bottom), or plainly without
        a bar, as TRL prints its sample whatever the progress setting."""
        text = format_completions(rows, total=total)
        if bar is not None:
            bar.write(text)
        else:
            print(text, flush=True)

    def sync(self) -> None:
        if self._handle is not None:
            with disk_errors(self.path, self.output_dir):
                os.fsync(self._handle.fileno())

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> "CompletionsWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

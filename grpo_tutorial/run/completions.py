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
"""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..chat import is_chat_messages
from .disk import disk_errors
from .layout import COMPLETIONS_FILE

__all__ = ["COMPLETIONS_FILE", "CompletionsWriter", "append_completions", "format_completions", "read_completions",
           "sample_completions", "truncate_completions"]


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
) -> list[dict]:
    """The rows to log for ``step``: ``count`` completions drawn without replacement (None = all), in batch order.

    Every sequence has one entry per completion (N of them); ``per_function``
    maps each reward function's name to its N values. The draw depends only on
    ``seed`` and ``step``.
    """
    n = len(completions)
    for name, values in (("prompts", prompts), ("rewards", rewards), ("advantages", advantages),
                         *((f"per_function[{k!r}]", v) for k, v in per_function.items())):
        if len(values) != n:
            raise ValueError(f"{name} has {len(values)} entries but there are {n} completions")
    if count is None or count >= n:
        chosen = list(range(n))
    else:
        chosen = sorted(random.Random(f"completions:{seed}:{step}").sample(range(n), count))
    return [
        {
            "step": int(step),
            "prompt": prompts[i],
            "completion": completions[i],
            "reward": _number(rewards[i]),
            "rewards": {name: _number(values[i]) for name, values in per_function.items()},
            "advantage": _number(advantages[i]),
        }
        for i in chosen
    ]


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
    redone), and, when ``enabled`` (``log_completions``), opens it for
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
        """Append ``rows`` and print them: with the progress bar's ``write`` (the bar stays at the
        bottom), or plainly without a bar, as TRL prints its sample whatever the progress setting."""
        self.append(rows)
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

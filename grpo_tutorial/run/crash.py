"""The error that ended a run's last attempt, kept beside its history.

A step can die of something the history never records: sampling from weights that
went non-finite raises inside ``generate`` before the step has a row to write
(``RuntimeError: probability tensor contains either inf, nan or element < 0``).
:meth:`~grpo_tutorial.trainer.GRPOTrainer.train` writes ``output_dir/crash.json``
(the step it was on, the error's type and message) when a step raises, and removes
it when the run starts again; chapter 18's doctor reads it
(:mod:`grpo_tutorial.doctor`). A Ctrl-C is not a crash: it saves a checkpoint and
writes nothing here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .disk import write_json
from .layout import CRASH_FILE

__all__ = ["clear_crash", "read_crash", "write_crash"]

#: The most characters of the error's message kept (a traceback's message can be long).
MESSAGE_CHARS = 2000


def write_crash(output_dir: str | os.PathLike, step: int, err: BaseException) -> None:
    """Keep ``err``, raised during ``step``, in ``output_dir/crash.json``. It never raises over ``err``: a disk that
    cannot take this file is left as it is (the error itself still reaches the caller)."""
    record = {"step": int(step), "error": type(err).__name__, "message": str(err)[:MESSAGE_CHARS]}
    try:
        write_json(Path(output_dir) / CRASH_FILE, record, output_dir)
    except OSError:  # allowed: the step's own error is the one to raise; this file is a note beside it
        return


def clear_crash(output_dir: str | os.PathLike) -> None:
    """Remove ``crash.json``: a new attempt starts (resumed or not)."""
    Path(output_dir, CRASH_FILE).unlink(missing_ok=True)


def read_crash(output_dir: str | os.PathLike) -> dict | None:
    """The kept error (``step``, ``error``, ``message``), or None when the last attempt did not crash or the file
    cannot be read."""
    try:
        data = json.loads(Path(output_dir, CRASH_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("step"), int) or not isinstance(data.get("error"), str):
        return None
    return {"step": data["step"], "error": data["error"], "message": str(data.get("message", ""))}

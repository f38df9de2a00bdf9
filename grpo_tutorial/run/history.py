"""``history.jsonl``: one JSON object per training step, appended and flushed as the step ends.

A value that does not exist (``kl`` when beta = 0) is written as ``null``, so
any JSON tool can read the file; :func:`read_history` turns it back into NaN.
Resuming cuts the file back to the checkpoint's step (:func:`history_until`),
and the later steps are redone.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Sequence

from .disk import disk_errors, write_durably
from .layout import HISTORY_FILE
from ..warn import GRPOWarning, caller_stacklevel

__all__ = ["HistoryWriter", "append_history", "history_line", "history_until", "read_history", "write_history"]


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def history_line(row: dict) -> str:
    """One history row as a line of strict JSON (NaN and inf become ``null``)."""
    return json.dumps({key: _json_value(value) for key, value in row.items()}, allow_nan=False) + "\n"


def read_history(path: str | os.PathLike, *, drop_cut_last_line: bool = False) -> list[dict]:
    """Rows of a ``history.jsonl`` (a directory holding one is fine too).

    ``null`` reads back as NaN (a value that did not exist), and so does the
    bare ``NaN`` that files from older versions hold. A last line cut short by
    a kill mid-write is an error, unless ``drop_cut_last_line`` (resuming does
    that: the step it belonged to is redone).
    """
    p = Path(path)
    if p.is_dir():
        p = p / HISTORY_FILE
    if not p.exists():
        raise FileNotFoundError(f"no history file at {str(p)!r}")
    rows = []
    lines = p.read_text(encoding="utf-8").splitlines()
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if drop_cut_last_line and line_no == len(lines):
                break
            raise ValueError(f"{p}:{line_no} is not valid JSON ({err}); was the file cut short?") from None
        rows.append({key: math.nan if value is None else value for key, value in row.items()})
    return rows


def write_history(path: Path, rows: Sequence[dict]) -> None:
    """Make ``path`` hold exactly ``rows`` (written to a temporary file, then renamed)."""
    tmp = path.with_name(path.name + ".tmp")
    with disk_errors(tmp, path.parent):
        write_durably(tmp, "".join(history_line(row) for row in rows).encode("utf-8"))
        os.replace(tmp, path)


def append_history(handle: Any, row: dict) -> None:
    """Append one row to an open history file and flush it to the OS."""
    with disk_errors(handle.name, Path(handle.name).parent):
        handle.write(history_line(row))
        handle.flush()


def history_until(root: Path, meta: dict) -> list[dict]:
    """The history up to the checkpoint's step: rows logged after the save are dropped (they are redone).

    Format-1 checkpoints carried the history themselves; format 2 reads it from
    ``root/history.jsonl``. A history with fewer rows than steps is returned
    with a warning.
    """
    step = int(meta["step"])
    if "history" in meta:
        rows = list(meta["history"])[: int(meta["history_len"])]
    else:
        rows = read_history(root, drop_cut_last_line=True) if (root / HISTORY_FILE).exists() else []
    rows = [row for row in rows if row.get("step", 0) <= step]
    if len(rows) != step:
        warnings.warn(
            f"{root / HISTORY_FILE} has {len(rows)} rows up to the checkpoint's step {step}; "
            "the history of the resumed run will be incomplete",
            GRPOWarning,
            stacklevel=caller_stacklevel(),
        )
    return rows


class HistoryWriter:
    """A run's ``history.jsonl``, open for appending while :meth:`GRPOTrainer.train` runs.

    Opening makes the file hold exactly ``rows`` (the history so far: empty for a
    new run, cut to the checkpoint's step for a resumed one); :meth:`append`
    then adds one row per step, flushed to the OS; :meth:`sync` makes the rows
    durable before a checkpoint names their step. With ``output_dir=None`` every
    method does nothing (the history lives in memory only).
    """

    def __init__(self, output_dir: str | os.PathLike | None, rows: Sequence[dict]) -> None:
        self.output_dir = None if output_dir is None else Path(output_dir)
        self.path = None if self.output_dir is None else self.output_dir / HISTORY_FILE
        self._handle = None
        if self.path is not None:
            write_history(self.path, rows)
            with disk_errors(self.path, self.output_dir):
                self._handle = open(self.path, "a", encoding="utf-8")

    def append(self, row: dict) -> None:
        if self._handle is not None:
            append_history(self._handle, row)

    def sync(self) -> None:
        if self._handle is not None:
            with disk_errors(self.path, self.output_dir):
                os.fsync(self._handle.fileno())

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> "HistoryWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

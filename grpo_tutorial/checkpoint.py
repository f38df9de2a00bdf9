"""What a run leaves on disk: ``history.jsonl`` and an atomic ``checkpoint/``.

``output_dir/``
    ``history.jsonl``  one JSON object per step, appended and flushed as the
    step ends. A value that does not exist (``kl`` when beta = 0) is written as
    ``null``, so any JSON tool can read the file; :func:`read_history` turns it
    back into NaN.

    ``checkpoint/``  ``state.pt`` (weights, optimizer, scheduler, reference,
    RNG states) and ``trainer_state.json`` (step, data position, config). The
    history is *not* copied into it: a checkpoint grows with the model, not with
    the run. Resuming cuts ``history.jsonl`` back to the checkpoint's step.

A checkpoint is written into ``checkpoint.tmp/`` and fsynced; then the old one
is renamed to ``checkpoint.old``, the new one renamed into place, and the old one
deleted. At every instant a complete checkpoint exists under ``checkpoint`` or
``checkpoint.old`` (:func:`find_checkpoint`), so a kill mid-save loses at most
the new one.

Every write here goes through :func:`~grpo_tutorial.rundir.disk_errors`: a full
disk or a read-only file system raises ``RunDirectoryError`` with one line
that names the file and the last good checkpoint, which is left as it was.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch

from .config import GRPOConfig
from .metrics import GRPOWarning
from .rundir import disk_errors

__all__ = [
    "CHECKPOINT",
    "HISTORY_FILE",
    "META_FILE",
    "STATE_FILE",
    "append_history",
    "config_changes",
    "history_until",
    "dataset_fingerprint",
    "find_checkpoint",
    "load_model_state",
    "read_checkpoint",
    "read_history",
    "history_line",
    "write_checkpoint",
    "write_history",
]

CHECKPOINT = "checkpoint"
CHECKPOINT_TMP = "checkpoint.tmp"
CHECKPOINT_OLD = "checkpoint.old"
STATE_FILE = "state.pt"
META_FILE = "trainer_state.json"
HISTORY_FILE = "history.jsonl"
#: 1: the history was stored inside trainer_state.json; 2: only in history.jsonl.
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)


# ---------------------------------------------------------------------------
# history.jsonl
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Durable writes
# ---------------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (POSIX; a no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open a directory: nothing to sync there
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a directory; the data files are synced
        pass
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


# ---------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------


def find_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The last complete checkpoint under ``output_dir``, or None.

    ``output_dir/checkpoint`` normally; if a save was killed between its two
    renames, the previous checkpoint is still complete under ``checkpoint.old``.
    A leftover ``checkpoint.tmp`` is an unfinished write and is never used.
    ``output_dir`` may also be a checkpoint directory itself.
    """
    root = Path(output_dir)
    if (root / META_FILE).exists() and (root / STATE_FILE).exists():
        return root
    for name in (CHECKPOINT, CHECKPOINT_OLD):
        candidate = root / name
        if (candidate / META_FILE).exists() and (candidate / STATE_FILE).exists():
            return candidate
    return None


def read_meta(path: Path) -> dict:
    """``trainer_state.json`` of the checkpoint at ``path``, format checked."""
    meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    if meta.get("format") not in READABLE_FORMATS:
        raise ValueError(f"checkpoint {path} has format {meta.get('format')!r}; expected one of {READABLE_FORMATS}")
    return meta


def read_checkpoint(path: Path) -> tuple[dict, dict]:
    """``(state, meta)`` of the checkpoint at ``path`` (state tensors on the CPU)."""
    meta = read_meta(path)
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    return state, meta


def load_model_state(model: torch.nn.Module, checkpoint: str | os.PathLike) -> dict:
    """Load a trainer checkpoint's policy weights into ``model``; return its metadata."""
    path = find_checkpoint(checkpoint)
    if path is None:
        raise FileNotFoundError(
            f"no checkpoint found in {os.fspath(checkpoint)!r}; expected {CHECKPOINT}/{STATE_FILE} "
            f"and {CHECKPOINT}/{META_FILE} (written by GRPOTrainer.train with checkpoint_every > 0)"
        )
    state, meta = read_checkpoint(path)
    model.load_state_dict(state["model"])
    return meta


def write_checkpoint(root: Path, state: dict, meta: dict) -> Path:
    """Write ``root/checkpoint/`` atomically (see the module docstring); return its path."""
    final, tmp, old = root / CHECKPOINT, root / CHECKPOINT_TMP, root / CHECKPOINT_OLD
    with disk_errors(tmp, root):
        root.mkdir(parents=True, exist_ok=True)
        # recover from an earlier save killed between its renames, then clear leftovers
        if not final.exists() and old.exists():
            os.replace(old, final)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        try:
            tmp.mkdir()
            with open(tmp / STATE_FILE, "wb") as fh:  # a Python file, so a full disk is an OSError
                try:
                    torch.save(state, fh)
                except RuntimeError as err:  # torch's zip writer hides a failed write's OSError behind its own
                    if isinstance(err.__context__, OSError):
                        raise err.__context__ from None
                    raise
                fh.flush()
                os.fsync(fh.fileno())
            write_durably(tmp / META_FILE, json.dumps({"format": FORMAT_VERSION, **meta}, indent=1).encode("utf-8"))
            fsync_dir(tmp)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # give back the space; the last checkpoint is untouched
            raise

        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        fsync_dir(root)
        shutil.rmtree(old, ignore_errors=True)
    return final


#: Fields that may change between a run and its resumption without changing its numbers.
RESUME_FREE_FIELDS = frozenset(
    {"output_dir", "log_every", "checkpoint_every", "eval_batch_size", "log_completions", "num_completions_to_print"}
)


def config_changes(saved: dict, current: dict) -> str:
    """The fields (other than :data:`RESUME_FREE_FIELDS`) whose values differ, as ``"name: old -> new, ..."``.

    A field the saved config lacks (added to the package since) counts as having
    its default, so an old checkpoint does not look changed.
    """
    defaults = GRPOConfig().to_dict()
    changed = [
        f"{k}: {saved.get(k, defaults.get(k))!r} -> {v!r}"
        for k, v in current.items()
        if k not in RESUME_FREE_FIELDS and saved.get(k, defaults.get(k)) != v
    ]
    return ", ".join(changed)


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
            stacklevel=3,
        )
    return rows


def dataset_fingerprint(dataset: Sequence[dict]) -> str:
    """A digest of the prompts and answers, to catch resuming on other data."""
    digest = hashlib.sha256()
    for row in dataset:
        digest.update(json.dumps([row.get("prompt"), row.get("answer")], default=str).encode("utf-8"))
    return digest.hexdigest()[:16]

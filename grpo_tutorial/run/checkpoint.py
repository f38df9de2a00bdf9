"""An atomic ``checkpoint/``: weights, optimizer, scheduler, reference and RNG states, and where the run stands.

``state.pt`` holds the tensors (:func:`write_checkpoint`'s ``state``),
``trainer_state.json`` the rest (``meta``: the step, the data position, the
config; see :class:`~grpo_tutorial.run.state.RunState`). The write is atomic
(see :mod:`~grpo_tutorial.run.layout`): at every instant a complete checkpoint
exists, so a kill mid-save loses at most the new one. A full disk raises
:class:`~grpo_tutorial.run.disk.RunDirectoryError` naming the last good
checkpoint, which is left as it was.

The global RNGs (Python, NumPy, torch, CUDA) go into every checkpoint
(:func:`capture_rng_state`): the package's own randomness comes from named seed
streams (:mod:`grpo_tutorial.seeding`), but a reward function may draw from the
global ones, and a resumed run must draw what the uninterrupted one drew.

:func:`save_training` and :func:`load_training` are a trainer's save and load:
the history file, the tensors and the warnings of a resume, with the trainer's
objects passed in (this module knows no GRPO); :func:`resume_or_start` decides,
before a run, what to do with the checkpoint its directory holds.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .disk import disk_errors, fsync_dir, write_durably
from .history import write_history
from .layout import (
    CHECKPOINT, CHECKPOINT_OLD, CHECKPOINT_TMP, FORMAT_VERSION, HISTORY_FILE, META_FILE, STATE_FILE, WRITING_FILE,
    find_checkpoint, read_meta,
)
from .state import check_same_dataset
from ..warn import warn_now

__all__ = [
    "RESUME_FREE_FIELDS",
    "capture_rng_state",
    "config_changes",
    "load_model_state",
    "load_training",
    "read_checkpoint",
    "restore_rng_state",
    "resume_or_start",
    "restore_training_state",
    "save_training",
    "training_state",
    "write_checkpoint",
]


def training_state(model, optimizer, scheduler, ref_model=None, extra: dict | None = None) -> dict:
    """A checkpoint's tensors: weights, optimizer, scheduler, reference (or None), the global RNGs, and ``extra``:
    what else the run's step holds (a value model and its optimizer; None or ``{}`` when it holds nothing more)."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "ref_model": None if ref_model is None else ref_model.state_dict(),
        "rng": capture_rng_state(),
        "extra": extra or {},
    }


def restore_training_state(state: dict, model, optimizer, scheduler, ref_model=None) -> bool:
    """Undo :func:`training_state`. False when ``ref_model`` is given but the checkpoint holds none (kept as is)."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    restored = True
    if ref_model is not None:
        if state["ref_model"] is not None:
            ref_model.load_state_dict(state["ref_model"])
        else:
            restored = False
    restore_rng_state(state["rng"])
    return restored


def read_checkpoint(path: Path) -> tuple[dict, dict]:
    """``(state, meta)`` of the checkpoint at ``path`` (state tensors on the CPU)."""
    meta = read_meta(path)
    state = torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)
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


def _save_tensors(path: Path, state: dict) -> None:
    """``torch.save`` into ``path`` (truncated if it exists), synced; a full disk is an OSError."""
    with open(path, "wb") as fh:  # a Python file, so a full disk is an OSError
        try:
            torch.save(state, fh)
        except RuntimeError as err:  # torch's zip writer hides a failed write's OSError behind its own
            if isinstance(err.__context__, OSError):
                raise err.__context__ from None
            raise
        fh.flush()
        os.fsync(fh.fileno())


def write_checkpoint(root: Path, state: dict, meta: dict, *, in_place: bool = False) -> Path:
    """Write ``root/checkpoint/`` atomically, or ``in_place``; return its path.

    Atomically (the default): into ``checkpoint.tmp/``, then renamed over the
    old one, which is deleted (see :mod:`~grpo_tutorial.run.layout`); for a
    moment two checkpoints exist, and the old one's files are deleted.
    ``in_place``: the existing files are overwritten, so only one checkpoint's
    bytes ever exist and no file is deleted (on Google Drive a deleted file goes
    to the bin, which counts against the quota); ``checkpoint/.writing`` marks
    the save while it runs, and a save killed mid-way leaves no usable checkpoint.
    """
    root = Path(root)
    if in_place:
        return _write_in_place(root, state, meta)
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
            _save_tensors(tmp / STATE_FILE, state)
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


def _write_in_place(root: Path, state: dict, meta: dict) -> Path:
    final = root / CHECKPOINT
    marker = final / WRITING_FILE
    with disk_errors(final, None):
        final.mkdir(parents=True, exist_ok=True)
        write_durably(marker, b"an in-place save is running; this checkpoint is incomplete until it ends\n")
        fsync_dir(final)
        _save_tensors(final / STATE_FILE, state)
        write_durably(final / META_FILE, json.dumps({"format": FORMAT_VERSION, **meta}, indent=1).encode("utf-8"))
        marker.unlink()
        fsync_dir(final)
    return final


def save_training(
    root: str | os.PathLike, model, optimizer, scheduler, ref_model, *, meta: dict, history: Sequence[dict],
    appending: Sequence[Any] = (), in_place: bool = False, extra: dict | None = None,
) -> Path:
    """A trainer's save: the history up to this step on disk first, then the atomic checkpoint; return its path.

    ``appending`` holds the writers a run appends with (``history.jsonl``,
    ``completions.jsonl``): when they write into ``root``, they are synced, else
    ``root/history.jsonl`` is rewritten to hold ``history``. The history is not
    stored in the checkpoint. ``meta`` is where the run stands (JSON-ready).
    ``in_place``: overwrite the checkpoint's files (:func:`write_checkpoint`). ``extra``: the step's own
    state (tensors and the like), given back by :func:`load_training` to its ``load_extra``.
    """
    root = Path(root)
    if appending and all(writer.output_dir == root for writer in appending):
        for writer in appending:
            writer.sync()  # the rows the checkpoint's step covers are on disk before it
    else:
        with disk_errors(root, root):
            root.mkdir(parents=True, exist_ok=True)
        write_history(root / HISTORY_FILE, history)
    return write_checkpoint(root, training_state(model, optimizer, scheduler, ref_model, extra), meta,
                            in_place=in_place)


def load_training(
    root: str | os.PathLike, model, optimizer, scheduler, ref_model, *, config: dict, defaults: dict,
    load_extra: Callable[[dict], None] | None = None,
) -> dict | None:
    """Undo :func:`save_training`'s checkpoint: load its tensors into the objects given, return its meta.

    None when ``root`` holds no checkpoint. Warns when the saved config differs
    from ``config`` (:func:`config_changes`) and when the checkpoint holds no
    reference model for ``ref_model``. ``load_extra`` gets the step's own state as
    saved (``{}`` from a checkpoint that has none, or was saved before it existed),
    before anything else is loaded, so that it can refuse a checkpoint without it.
    The history is the caller's to read back (:func:`~grpo_tutorial.run.history.history_until`).
    """
    path = find_checkpoint(root)
    if path is None:
        return None
    state, meta = read_checkpoint(path)
    if load_extra is not None:
        load_extra(state.get("extra") or {})
    changed = config_changes(meta["config"], config, defaults)
    if changed:
        warn_now(f"resuming from {path} with a different config ({changed}); the resumed run will not "
                 "match an uninterrupted one")
    if not restore_training_state(state, model, optimizer, scheduler, ref_model):
        warn_now(f"checkpoint {path} holds no reference model (it was saved with beta=0); "
                 "the reference stays as it is now")
    return meta


def resume_or_start(
    output_dir: str | os.PathLike | None, fingerprint: str, *, resume: bool, fresh: bool,
    load: Callable[[str | os.PathLike], bool],
) -> None:
    """Before a run in ``output_dir`` (None: none) on the dataset with ``fingerprint``: resume, or start and say so.

    With ``resume``, a checkpoint made on another dataset is refused before
    any state is touched, then ``load(output_dir)`` (the trainer's load,
    False when there is no checkpoint) restores it; with none, the run starts
    from step 0 with a warning. Without ``resume``, a ``fresh`` run (at step 0)
    warns that it will replace the checkpoint ``output_dir`` holds.
    """
    if resume:
        if output_dir is None:
            raise ValueError("train(resume=True) needs GRPOConfig.output_dir, where the checkpoint lives")
        saved = find_checkpoint(output_dir)
        if saved is not None:  # refuse a different dataset before touching any state
            where = f"the checkpoint in {output_dir!r}"
            check_same_dataset(fingerprint, read_meta(saved).get("dataset_fingerprint"), where)
        if not load(output_dir):
            warn_now(f"resume=True but no checkpoint in {output_dir!r}; starting from step 0")
    elif output_dir is not None and fresh and find_checkpoint(output_dir) is not None:
        warn_now(f"{output_dir!r} already holds a checkpoint; starting a new run from step 0 that will "
                 "replace it at its first save (pass resume=True to continue the old run instead)")


#: Fields that may change between a run and its resumption without changing its numbers.
RESUME_FREE_FIELDS = frozenset(
    {"output_dir", "log_every", "checkpoint_every", "checkpoint_in_place", "eval_batch_size", "log_completions",
     "num_completions_to_print", "completions_to_keep", "report_to"}
)


def config_changes(saved: dict, current: dict, defaults: dict) -> str:
    """The fields (other than :data:`RESUME_FREE_FIELDS`) whose values differ, as ``"name: old -> new, ..."``.

    A field the saved config lacks (added to the package since) counts as having
    its value in ``defaults`` (today's defaults), so an old checkpoint does not
    look changed.
    """
    changed = [
        f"{k}: {saved.get(k, defaults.get(k))!r} -> {v!r}"
        for k, v in current.items()
        if k not in RESUME_FREE_FIELDS and saved.get(k, defaults.get(k)) != v
    ]
    return ", ".join(changed)


def capture_rng_state() -> dict:
    """Every global RNG a reward function might touch, in a ``torch.save``-safe form."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(float, np_state[2:])],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Undo :func:`capture_rng_state`: put every global RNG back where it was."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

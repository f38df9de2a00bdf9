"""What a run leaves on disk, and where the last good checkpoint is.

``output_dir/``
    ``history.jsonl``  one JSON object per step, appended and flushed as the
    step ends (:mod:`~grpo_tutorial.run.history`).

    ``checkpoint/``  ``state.pt`` (weights, optimizer, scheduler, reference,
    RNG states) and ``trainer_state.json`` (step, data position, config). The
    history is *not* copied into it: a checkpoint grows with the model, not with
    the run (:mod:`~grpo_tutorial.run.checkpoint`).

    ``.lock``  held while a run uses the directory (:mod:`~grpo_tutorial.run.lock`).

    ``completions.jsonl``  every step's kept sample of completions
    (``completions_to_keep``), and the few shown every ``log_every`` steps with
    ``log_completions`` (:mod:`~grpo_tutorial.run.completions`).

    ``crash.json``  the error that ended the last attempt, if a step raised
    (:mod:`~grpo_tutorial.run.crash`); removed when the run starts again.

    ``run.json``, ``eval.json``  the command line's arguments and config, and
    its evaluations (``python -m grpo_tutorial train``).

    ``tensorboard/``  TensorBoard's event files, each step's numbers, with
    ``report_to="tensorboard"`` (:mod:`~grpo_tutorial.run.tensorboard`).

    ``base.safetensors``  a LoRA run's warm-started base, written once by the
    command line before GRPO starts: the checkpoints of a run with
    ``use_peft`` hold the adapters only, and this is the base they sit on.

A checkpoint is written into ``checkpoint.tmp/``, then the old one is renamed to
``checkpoint.old``, the new one renamed into place and the old one deleted, so
at every instant a complete checkpoint exists under ``checkpoint`` or
``checkpoint.old``; :func:`find_checkpoint` finds it.

A checkpoint written *in place* (``GRPOConfig.checkpoint_in_place``, for a folder
on Google Drive, where a deleted file goes to the bin and still counts against the
quota) overwrites ``checkpoint/``'s two files instead. ``checkpoint/.writing``
exists while it does, and :func:`find_checkpoint` ignores a checkpoint that holds
it: a save killed in place leaves no usable checkpoint (the price of keeping one
copy only).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = [
    "CHECKPOINT",
    "CHECKPOINT_OLD",
    "CHECKPOINT_TMP",
    "COMPLETIONS_FILE",
    "CRASH_FILE",
    "EVAL_FILE",
    "HISTORY_FILE",
    "LOCK_FILE",
    "META_FILE",
    "RUN_FILE",
    "STATE_FILE",
    "TENSORBOARD_DIR",
    "WRITING_FILE",
    "find_checkpoint",
    "read_meta",
    "what_was_kept",
]

HISTORY_FILE = "history.jsonl"
COMPLETIONS_FILE = "completions.jsonl"
CRASH_FILE = "crash.json"
CHECKPOINT = "checkpoint"
CHECKPOINT_TMP = "checkpoint.tmp"
CHECKPOINT_OLD = "checkpoint.old"
STATE_FILE = "state.pt"
META_FILE = "trainer_state.json"
#: Present inside ``checkpoint/`` while an in-place save overwrites it.
WRITING_FILE = ".writing"
LOCK_FILE = ".lock"
RUN_FILE = "run.json"
EVAL_FILE = "eval.json"
TENSORBOARD_DIR = "tensorboard"
#: 1: the history was stored inside trainer_state.json; 2: only in history.jsonl.
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)


def find_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The last complete checkpoint under ``output_dir``, or None.

    ``output_dir/checkpoint`` normally; if a save was killed between its two
    renames, the previous checkpoint is still complete under ``checkpoint.old``.
    A leftover ``checkpoint.tmp`` is an unfinished write and is never used, nor is
    a checkpoint an in-place save was killed in (it holds ``.writing``).
    ``output_dir`` may also be a checkpoint directory itself.
    """
    root = Path(output_dir)
    for candidate in (root, root / CHECKPOINT, root / CHECKPOINT_OLD):
        if all((candidate / name).exists() for name in (META_FILE, STATE_FILE)) and not (
            candidate / WRITING_FILE
        ).exists():
            return candidate
    return None


def read_meta(path: Path) -> dict:
    """``trainer_state.json`` of the checkpoint at ``path``, format checked."""
    meta = json.loads((Path(path) / META_FILE).read_text(encoding="utf-8"))
    if meta.get("format") not in READABLE_FORMATS:
        raise ValueError(f"checkpoint {path} has format {meta.get('format')!r}; expected one of {READABLE_FORMATS}")
    return meta


def what_was_kept(output_dir: str | os.PathLike | None) -> str:
    """"the last good checkpoint is step N, at PATH", or that there is none yet."""
    if output_dir is None:
        return "nothing was saved (no output_dir)"
    path = find_checkpoint(output_dir)
    if path is None:
        return f"no checkpoint has been saved in {os.fspath(output_dir)} yet"
    try:
        step = read_meta(path)["step"]
    except (OSError, ValueError, KeyError) as err:  # reported, not swallowed: it goes into the message
        return f"the checkpoint at {path} could not be read back ({err})"
    return f"the last good checkpoint is step {step}, at {path}"

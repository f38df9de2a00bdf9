"""``report_to="tensorboard"``: every history row as TensorBoard scalars, live.

TRL's ``GRPOConfig`` (a transformers ``TrainingArguments``) reports to TensorBoard
with ``report_to="tensorboard"``; so does the package's trainer. While
:meth:`~grpo_tutorial.trainer.GRPOTrainer.train` runs, a :class:`TensorBoardWriter`
is one of the trainer's ``row_listeners``: each row's numbers become scalars
tagged ``train/<key>`` (``train/reward_mean``, ``train/reward/correctness``) at
the row's ``step``, in ``output_dir/tensorboard/``, flushed after every row so
that TensorBoard shows the run as it goes::

    %load_ext tensorboard
    %tensorboard --logdir runs/tiny/tensorboard

A value the step did not compute (``kl`` when beta = 0: NaN in the row, ``null``
in ``history.jsonl``) is left out: its curve has no point at that step.

Resuming redoes the steps after the checkpoint, and ``history.jsonl`` is cut
back to the checkpoint's step. TensorBoard's files are never rewritten, so the
resumed run opens a new event file with ``purge_step`` = the first step it will
write: TensorBoard then hides every value an earlier file holds for that step
or later, and each step shows one value, the one ``history.jsonl`` holds.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from .layout import TENSORBOARD_DIR

__all__ = ["TAG_PREFIX", "TensorBoardWriter", "check_reporting", "report_rows"]

#: What every tag starts with, as in transformers' TensorBoard callback (``train/loss``).
TAG_PREFIX = "train/"

INSTALL_HINT = "pip install tensorboard (Colab has it already; the package's extra: grpo-tutorial[tensorboard])"


def _summary_writer() -> type:
    """torch's ``SummaryWriter``, or an ``ImportError`` that says how to install TensorBoard."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise ImportError(f"report_to='tensorboard' needs the tensorboard package: {INSTALL_HINT}") from err
    return SummaryWriter


def check_reporting(report_to: str, output_dir: str | os.PathLike | None) -> None:
    """Refuse ``report_to="tensorboard"`` without an ``output_dir`` or without TensorBoard, before a run starts.

    The trainer calls it when it is built. The config itself takes the value
    without an ``output_dir``: a saved config is rebuilt without one to evaluate.
    """
    if report_to != "tensorboard":
        return
    if output_dir is None:
        raise ValueError("GRPOConfig.report_to must be 'none' when output_dir is None, got 'tensorboard': "
                         "TensorBoard's event files go to output_dir/tensorboard/, so set output_dir")
    _summary_writer()


def _scalar(value: Any) -> float | None:
    """``value`` as a finite float, or None for what is not one number (a bool, a str, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


class TensorBoardWriter:
    """Writes history rows into ``log_dir`` as TensorBoard scalars; call it with each row.

    Args:
        log_dir: the event files' folder (the trainer's: ``output_dir/tensorboard``).
        first_step: the first step this writer will write. Values that earlier
            event files in ``log_dir`` hold for this step or later are hidden
            (``SummaryWriter``'s ``purge_step``): on resume, the steps after the
            checkpoint, which the run redoes.

    Raises ``ImportError``, saying how to install it, when TensorBoard is missing.
    """

    def __init__(self, log_dir: str | os.PathLike, *, first_step: int = 1) -> None:
        self.log_dir = Path(log_dir)
        self._writer = _summary_writer()(log_dir=os.fspath(self.log_dir), purge_step=first_step)

    def __call__(self, row: dict) -> None:
        """Write ``row``'s numbers at ``row["step"]``, and flush them to disk."""
        step = row["step"]
        for key, value in row.items():
            number = _scalar(value)
            if key != "step" and number is not None:
                self._writer.add_scalar(TAG_PREFIX + key, number, global_step=step)
        self._writer.flush()  # now, not every two minutes: a live view sees each step as it ends

    def close(self) -> None:
        self._writer.close()


@contextlib.contextmanager
def report_rows(
    report_to: str, output_dir: str | os.PathLike | None, listeners: list[Callable[[dict], None]], *, first_step: int
) -> Iterator[TensorBoardWriter | None]:
    """While the block runs, a :class:`TensorBoardWriter` into ``output_dir/tensorboard`` is one of ``listeners``.

    Only when ``report_to`` is ``"tensorboard"`` (``"none"``: nothing happens).
    At the end, however the block ends, the writer leaves ``listeners`` and is closed.
    """
    check_reporting(report_to, output_dir)  # again: the config may have changed since the trainer was built
    if report_to != "tensorboard":
        yield None
        return
    writer = TensorBoardWriter(Path(output_dir) / TENSORBOARD_DIR, first_step=first_step)
    listeners.append(writer)
    try:
        yield writer
    finally:
        listeners.remove(writer)
        writer.close()

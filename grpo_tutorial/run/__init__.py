"""The machinery of a run: what happens around the stages of a step so that hours of work are safe.

Nothing here knows GRPO: these modules import nothing from the stages, the
trainer or the chapter tools (``tests/test_layout.py`` checks it). The trainer,
the warm start and the command line use them.

=================  ================================================================
Module             What it holds
=================  ================================================================
``layout``         the files of an output directory; where the last good checkpoint is
``disk``           durable, atomic writes; a disk error said in one line
``lock``           one run per output directory (a re-entrant ``flock``)
``history``        ``history.jsonl``: read, write, and the writer a run appends with
``checkpoint``     the atomic ``checkpoint/``; RNG snapshots; a trainer's save, load, resume
``state``          where a run stands (step, data position, dataset), checkpoint form
``interrupt``      Ctrl-C: finish the step, save, stop
``progress``       progress bars for a terminal, Colab and the book
``completions``    every step's kept sample, and ``log_completions``' shown ones, in ``completions.jsonl``
``crash``          ``crash.json``: the error that ended the last attempt, for the doctor
``tensorboard``    ``report_to="tensorboard"``: each step's numbers as TensorBoard scalars, live
=================  ================================================================

``GRPOWarning`` and its once-per-run issuer live in the shared leaf
:mod:`grpo_tutorial.warn`, which the stages use too; this package re-exports them.
"""

from .checkpoint import load_model_state, read_checkpoint, write_checkpoint
from .disk import RunDirectoryError, disk_errors
from .history import HistoryWriter, read_history, write_history
from .interrupt import StopAfterStep
from .layout import HISTORY_FILE, find_checkpoint, read_meta
from .lock import RunLockedError, run_lock
from .progress import progress_bar
from .state import RunState, dataset_fingerprint
from ..warn import GRPOWarning, WarnOnce

__all__ = [
    "GRPOWarning",
    "HISTORY_FILE",
    "HistoryWriter",
    "RunDirectoryError",
    "RunLockedError",
    "RunState",
    "StopAfterStep",
    "WarnOnce",
    "dataset_fingerprint",
    "disk_errors",
    "find_checkpoint",
    "load_model_state",
    "progress_bar",
    "read_checkpoint",
    "read_history",
    "read_meta",
    "run_lock",
    "write_checkpoint",
    "write_history",
]

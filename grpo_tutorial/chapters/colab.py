"""Where chapter 9's run lives, so that nothing is lost: one folder per run, on Google Drive in Colab.

A Colab runtime can disconnect at any time, and everything on its disk goes with
it. So in Colab the GPU run writes into Google Drive, one folder per run named by
its settings (:func:`run_name`): running the notebook again with the same settings
finds the same folder, and :func:`plan_run` says what to do there:

- ``"new"``: no checkpoint yet, start from step 0 (no resume, no warning);
- ``"interrupted"``: a checkpoint short of the run's steps, or a finished
  training without its final evaluation: resume;
- ``"finished"``: trained to the end and evaluated: nothing to train, the
  results are read back; change a setting (a new folder) to start another.

Google Drive's free 15 GB is shared with Gmail and Photos, and a deleted file
goes to the bin, where it still counts until the bin is emptied. A trainer
that writes each checkpoint beside the old one and then deletes the old one
(the default, :func:`~grpo_tutorial.run.checkpoint.write_checkpoint`) leaves one
checkpoint's bytes in the bin at every save. On Drive the run therefore saves
``checkpoint_in_place``: one checkpoint, overwritten. :func:`drive_usage` does the
arithmetic for both ways of saving, from the checkpoint's size, and
:func:`checkpoint_bytes` measures that size from the files of a run.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:  # POSIX: a run folder's owner holds a lock on it (temporary_root)
    import fcntl
except ImportError:  # Windows
    fcntl = None

from .._checks import check_int
from ..run import find_checkpoint, read_meta
from ..lora import is_peft_model
from ..run.checkpoint import RESUME_FREE_FIELDS
from ..run.lock import try_lock

__all__ = [
    "DRIVE_FOLDER",
    "DRIVE_MOUNT",
    "RunPlan",
    "checkpoint_bytes",
    "choose_run_root",
    "drive_usage",
    "estimate_checkpoint_bytes",
    "free_bytes",
    "in_colab",
    "mount_drive",
    "plan_run",
    "run_name",
    "remove_stale_roots",
    "temporary_root",
]

#: Where Colab mounts Google Drive, and the folder under it that holds chapter 9's runs.
DRIVE_MOUNT = "/content/drive"
DRIVE_FOLDER = "/content/drive/MyDrive/grpo-tutorial-runs"
#: Where a GPU run goes when Drive cannot be mounted (Colab) or is not there (elsewhere).
COLAB_DISK_FOLDER = "/content/grpo-tutorial-runs"
LOCAL_FOLDER = Path.home() / "grpo-tutorial-runs"
#: The file that says a run was trained to its end and evaluated (written by ``gsm8k_run``).
FINISHED_FILE = "eval_after.json"


def in_colab() -> bool:
    """True inside a Google Colab runtime (its ``google.colab`` module is loaded there)."""
    return "google.colab" in sys.modules


def mount_drive(mount: str = DRIVE_MOUNT) -> bool:
    """Mount Google Drive in Colab (it asks for permission once); False, with the reason printed, when it cannot."""
    try:
        from google.colab import drive  # only in Colab

        drive.mount(mount)
    except Exception as err:  # declined, timed out or not in Colab: the run goes to the VM's disk, said loudly
        print(f"Google Drive is not mounted ({type(err).__name__}: {err}); the run goes to this runtime's disk "
              "and is lost with it", flush=True)
        return False
    return True


def run_name(model: str, config: Any, steps: int, task: str) -> str:
    """A folder name that changes whenever a setting that changes the run's numbers changes.

    ``model`` and ``task`` are short labels; ``config`` a ``GRPOConfig``. The
    name reads ``<model>-<task>-<steps>steps-seed<seed>-<hash>``: the hash covers
    every config field except those a resume may change
    (:data:`~grpo_tutorial.run.checkpoint.RESUME_FREE_FIELDS`), so a changed
    learning rate gets a new folder instead of resuming the old run with it.
    """
    check_int(None, "steps", steps, 1)
    fields = {k: v for k, v in config.to_dict().items() if k not in RESUME_FREE_FIELDS}
    digest = hashlib.sha256(json.dumps([model, task, steps, fields], sort_keys=True, default=str).encode()).hexdigest()
    label = "".join(c if c.isalnum() or c in ".-" else "-" for c in f"{model.split('/')[-1]}-{task}").lower()
    return f"{label}-{steps}steps-seed{config.seed}-{digest[:8]}"


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What :func:`plan_run` found in a run's folder, and what to do there.

    Attributes:
        path: the run's folder.
        status: ``"new"``, ``"interrupted"`` or ``"finished"`` (see the module).
        checkpoint_step: the step of the folder's checkpoint, or None.
        steps: the steps the run trains to.
        where: where the folder is, in words (Google Drive, the VM's disk, ...).
    """

    path: Path
    status: str
    checkpoint_step: int | None
    steps: int
    where: str

    @property
    def resume(self) -> bool:
        """Whether ``gsm8k_run`` should resume: only when there is a checkpoint to resume from."""
        return self.status != "new"

    def describe(self) -> str:
        """One paragraph for the notebook: where the run is and what running it will do."""
        head = f"run folder ({self.where}): {self.path}\n"
        if self.status == "new":
            return head + f"a new run: no checkpoint yet, training starts at step 0 of {self.steps}"
        if self.status == "interrupted":
            return head + (f"an interrupted run: its checkpoint is at step {self.checkpoint_step} of {self.steps}; "
                           "it resumes from there, with the 'before' evaluation read back")
        return head + (f"a finished run: trained to step {self.checkpoint_step} and evaluated; nothing is trained "
                       "again and its results are read back. To start another run, change a setting (it gets a new "
                       "folder) or delete this folder.")


def plan_run(root: str | os.PathLike, name: str, steps: int, *, where: str = "this machine's disk") -> RunPlan:
    """Look into ``root/name`` and say whether the run there is new, interrupted or finished (see the module)."""
    check_int(None, "steps", steps, 1)
    path = Path(root) / name
    checkpoint = find_checkpoint(path) if path.is_dir() else None
    if checkpoint is None:
        return RunPlan(path, "new", None, steps, where)
    step = int(read_meta(checkpoint)["step"])
    finished = step >= steps and (path / FINISHED_FILE).is_file()
    return RunPlan(path, "finished" if finished else "interrupted", step, steps, where)


def choose_run_root(on_gpu: bool, in_colab: bool, *, mount: Any = mount_drive) -> tuple[Path, str, bool]:
    """Where chapter 9's runs go: ``(root, where in words, on Google Drive?)``.

    - on a CPU: a new temporary folder (:func:`temporary_root`, deleted when the process ends), so the page
      shows a live run every time;
    - on a GPU in Colab: Google Drive, mounted by ``mount()`` (False: it could
      not be; the run then goes to the runtime's own disk, and the words say it
      is lost with the runtime);
    - on a GPU elsewhere: ``~/grpo-tutorial-runs``, which outlives the kernel.
    """
    if not on_gpu:
        return temporary_root(), "a new temporary folder, deleted when this kernel stops: the CPU run starts afresh every time", False
    if in_colab:
        if mount():
            return Path(DRIVE_FOLDER), "Google Drive", True
        return Path(COLAB_DISK_FOLDER), "this runtime's own disk: LOST when the runtime is recycled", False
    return LOCAL_FOLDER, "this machine's disk", False


#: The prefix of chapter 9's temporary run folders, and the file in each that its owner holds locked.
TEMPORARY_PREFIX, OWNER_FILE = "grpo-chapter9-", "owner.pid"
#: A temporary run folder that no lock can speak for (made before there was one, or on Windows) is left
#: alone until nothing in it has changed for this long.
STALE_SECONDS = 24 * 3600
_HELD: list = []  # the open, locked owner files of this process's folders (closed when it exits)


def temporary_root() -> Path:
    """A fresh folder under the system's temporary directory (the CPU demonstration starts anew each time).

    The folder is deleted when the Python process ends (the notebook's kernel shuts
    down): the CPU run's checkpoints are 1.6 GB, and a folder left behind by every
    run of the chapter fills a disk (a CI machine's ``/tmp`` ran out after a few). A
    kernel that is killed cannot delete its own, so each new folder also deletes the
    ones nobody owns any more (:func:`remove_stale_roots`): the owner holds an
    exclusive lock on the folder's ``owner.pid`` for as long as it runs.
    """
    remove_stale_roots(Path(tempfile.gettempdir()))
    path = Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX))
    if fcntl is not None:  # locked before it has its name, so no scan ever sees it unlocked
        handle = open(path / (OWNER_FILE + ".new"), "w")
        if try_lock(handle.fileno()) is None:  # a file system without locks (network mounts): judged by its age
            handle.close()
            os.remove(path / (OWNER_FILE + ".new"))
        else:  # a new file: nobody else holds it
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            os.replace(path / (OWNER_FILE + ".new"), path / OWNER_FILE)
            _HELD.append(handle)
    atexit.register(shutil.rmtree, path, True)  # ignore_errors: gone already, or never written
    return path


def remove_stale_roots(folder: Path, *, now: float | None = None) -> list[Path]:
    """Delete chapter 9's temporary run folders in ``folder`` that nobody owns any more; return those deleted.

    A folder is stale when its ``owner.pid`` is not locked (its owner has ended, however
    it ended: the lock goes with the process), or, where no lock can say (no
    ``owner.pid``: folders made before it existed; Windows, which has no ``flock``),
    when nothing in it has changed for :data:`STALE_SECONDS`. Only folders named
    ``grpo-chapter9-*`` are touched, never through a symbolic link.
    """
    now = time.time() if now is None else now
    removed = []
    for path in sorted(Path(folder).glob(TEMPORARY_PREFIX + "*")):
        if path.is_symlink() or not path.is_dir():
            continue
        owner = path / OWNER_FILE
        try:
            if fcntl is not None and owner.is_file():
                stale = _unlocked(owner)
            else:
                stale = now - _newest_change(path) > STALE_SECONDS
        except OSError:
            continue
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                removed.append(path)
    return removed


def _unlocked(owner: Path) -> bool:
    """Whether nobody holds ``owner`` locked (then it is ours for a moment, and released); False where it cannot be
    told (a file system without locks): the folder is kept."""
    with open(owner) as handle:
        if not try_lock(handle.fileno()):  # held: its owner runs
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def _newest_change(path: Path) -> float:
    """The latest modification time of ``path`` or anything under it."""
    return max([path.stat().st_mtime, *(p.stat().st_mtime for p in path.rglob("*") if not p.is_symlink())])


def estimate_checkpoint_bytes(model: Any, config: Any = None) -> int:
    """A checkpoint's size before the first save: every weight, plus AdamW's two moments per trainable weight.

    With a ``config`` that has ``use_peft`` (and a model not wrapped yet), the
    checkpoint holds only the LoRA adapters it will get (``r * (in + out)`` per
    targeted layer, :func:`~grpo_tutorial.chapters.low_rank.lora_parameter_count`)
    and their two moments, in the base's dtype. The scheduler, the RNG states
    and ``trainer_state.json`` add kilobytes; a reference model (``beta > 0``,
    full fine-tuning) would add its weights once more.
    """
    if config is not None and getattr(config, "use_peft", False) and not is_peft_model(model):
        from .low_rank import lora_parameter_count

        size = next(model.parameters()).element_size()
        return 3 * size * lora_parameter_count(model, config.lora_r, config.lora_target_modules)
    weights = sum(p.numel() * p.element_size() for p in model.parameters()
                  if p.requires_grad or not is_peft_model(model))
    moments = sum(2 * p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return weights + moments


def checkpoint_bytes(run_dir: str | os.PathLike) -> int:
    """The bytes of the checkpoint a run folder holds (0 when it holds none)."""
    path = find_checkpoint(run_dir)
    if path is None:
        return 0
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())


def drive_usage(checkpoint: int, saves: int, *, in_place: bool, free: int | None = None, has_bin: bool = True) -> dict:
    """What a run's checkpoints take on Google Drive, counting the bin (or on a disk without one).

    Args:
        checkpoint: the bytes of one checkpoint.
        saves: how many times the run saves (``ceil(steps / checkpoint_every)``:
            the trainer also saves at the end).
        in_place: saves overwrite the checkpoint (``checkpoint_in_place``);
            else each save writes a new checkpoint beside the old one, then
            deletes the old one, which goes to Drive's bin.
        free: the free bytes where the run goes, if known; ``fits`` then says
            whether the run's checkpoints fit in them.
        has_bin: deleted files keep counting until a bin is emptied (Google Drive).
            False for an ordinary disk (chapter 9's CPU run, a GPU machine's own
            disk), where a deleted checkpoint's bytes are free again at once.

    Returns:
        ``live`` (the checkpoint kept at the end), ``bin`` (what the run's
        deletions leave in the bin), ``total`` (``live + bin``: what the run adds
        to the quota until the bin is emptied), ``need`` (the most bytes the
        checkpoints hold at one moment, which must be free: with a bin, ``total``,
        since with atomic saves the last save holds the old checkpoint, the new one
        and every earlier deletion, the same sum; without one, two checkpoints
        during an atomic save after the first, one when saving in place) and
        ``fits`` (``need <= free``; None without ``free``).
    """
    check_int(None, "checkpoint", checkpoint, 0)
    check_int(None, "saves", saves, 0)
    live = checkpoint if saves else 0
    deleted = 0 if in_place or not saves else (saves - 1) * checkpoint
    binned = deleted if has_bin else 0
    if has_bin:
        need = live + binned
    else:
        need = live * (2 if not in_place and saves >= 2 else 1)
    return {"live": live, "bin": binned, "total": live + binned, "need": need,
            "fits": None if free is None else need <= free}


def free_bytes(path: str | os.PathLike) -> int | None:
    """The free bytes of the file system that holds ``path`` (on Colab's Drive mount: the account's quota, as the
    mount reports it), or None when it cannot be read."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None

"""The output directory of a run: one run at a time, and disk errors said plainly.

Two things protect the hours of work in ``output_dir``:

**A lock.** :func:`run_lock` holds an exclusive ``fcntl.flock`` on
``output_dir/.lock`` while a run uses the directory; the file says which
process (pid and host) holds it. The operating system drops a ``flock`` when
its process ends, however it ends (return, exception, Ctrl-C, ``kill -9``), so
a lock left by a dead run never blocks the next one and there is nothing to
clean up by hand. We call ``fcntl`` directly rather than through a library
such as ``filelock`` (which wraps the same call): it is the standard library,
it is a few lines, and we control what the file holds, so a second run can
say who holds the lock. (Older ``filelock`` versions opened the file with
``O_TRUNC``, which would wipe the holder's pid as a contender tried the lock.)
Where ``fcntl`` does not exist (Windows), no lock is taken and a warning says
so. The lock is re-entrant within one process: the command line holds it
for the whole command, and the trainer it calls takes it again.

**One place for disk errors.** Every file the package writes for a run
(history, checkpoint, ``run.json``, ``eval.json``, plots) is written inside
:func:`disk_errors`, which turns an ``OSError`` into a
:class:`RunDirectoryError` with one line: which file, what went wrong (no
space, a read-only file system, no permission) and what was kept (the last
good checkpoint and its step). Writes are to temporary files that are then
renamed, so a failed write never replaces a good file.
"""

from __future__ import annotations

import errno
import os
import socket
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_FILE", "RunDirectoryError", "RunLockedError", "disk_errors", "run_lock", "what_was_kept"]

LOCK_FILE = ".lock"

_REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EDQUOT: "the disk quota is used up",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
}


class RunDirectoryError(OSError):
    """A run's output directory could not be written; the message is one line."""

    def __str__(self) -> str:  # OSError's default adds "[Errno N]"; the message already says it
        return str(self.args[-1]) if self.args else ""


class RunLockedError(RunDirectoryError):
    """Another process is running in the same output directory."""


def what_was_kept(output_dir: str | os.PathLike | None) -> str:
    """"the last good checkpoint is step N, at PATH", or that there is none yet."""
    if output_dir is None:
        return "nothing was saved (no output_dir)"
    from .checkpoint import find_checkpoint, read_meta

    path = find_checkpoint(output_dir)
    if path is None:
        return f"no checkpoint has been saved in {os.fspath(output_dir)} yet"
    try:
        step = read_meta(path)["step"]
    except (OSError, ValueError, KeyError) as err:  # reported, not swallowed: it goes into the message
        return f"the checkpoint at {path} could not be read back ({err})"
    return f"the last good checkpoint is step {step}, at {path}"


def _reason(err: OSError) -> str:
    return _REASONS.get(err.errno) or err.strerror or str(err) or type(err).__name__


@contextmanager
def disk_errors(path: str | os.PathLike, output_dir: str | os.PathLike | None = None) -> Iterator[None]:
    """Writes inside this block that fail raise :class:`RunDirectoryError` with one clear line.

    ``path`` is the file being written (the error's own file name wins when it
    has one); ``output_dir`` is the run's directory, whose last good checkpoint
    the message names.
    """
    try:
        yield
    except RunDirectoryError:
        raise
    except OSError as err:
        target = err.filename if err.filename is not None else os.fspath(path)
        kept = what_was_kept(output_dir) if output_dir is not None else "no existing file was replaced"
        raise RunDirectoryError(
            err.errno, f"cannot write {target}: {_reason(err)}; {kept}"
        ) from err


_held: dict[str, list] = {}  # resolved directory -> [fd, depth], for the re-entrant lock


def _holder(fd: int) -> str:
    """What the lock file says about its holder ("pid 123 on host x")."""
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
    except OSError as err:
        return f"an unknown process (the lock file could not be read: {_reason(err)})"
    fields = dict(item.split("=", 1) for item in text if "=" in item)
    if "pid" in fields:
        return f"process {fields['pid']} on {fields.get('host', 'an unknown host')}"
    return "another process"


@contextmanager
def run_lock(output_dir: str | os.PathLike | None) -> Iterator[None]:
    """Hold the exclusive lock on ``output_dir`` (created if needed) for the block.

    ``None`` takes no lock. A directory that another process holds raises
    :class:`RunLockedError` at once, naming the directory and the holder.
    """
    if output_dir is None:
        yield
        return
    root = Path(output_dir)
    with disk_errors(root, None):
        root.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(root)
    if key in _held:  # this process holds it already (the CLI, then the trainer it calls)
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    if fcntl is None:
        warnings.warn(f"no fcntl on this platform: {root} is not locked against a second run", stacklevel=3)
        yield
        return
    lock_path = root / LOCK_FILE
    with disk_errors(lock_path, None):
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunLockedError(
                errno.EBUSY,
                f"{root} is in use by {_holder(fd)}: one run per output directory; "
                "wait for it to finish, stop it, or choose another directory",
            ) from None
        except OSError as err:  # a file system without locks (some network mounts): say so, run unlocked
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            warnings.warn(f"{root} cannot be locked ({_reason(err)}): nothing stops a second run there", stacklevel=3)
        with disk_errors(lock_path, root):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode(), 0)
        _held[key] = [fd, 1]
        try:
            yield
        finally:
            del _held[key]
    finally:
        os.close(fd)  # closing the descriptor releases the flock

"""One run at a time per output directory.

:func:`run_lock` holds an exclusive ``fcntl.flock`` on ``output_dir/.lock``
while a run uses the directory; the file names the process that holds it (pid
and host). The operating system drops a ``flock`` when its process ends, however
it ends (return, exception, Ctrl-C, ``kill -9``), so a lock left by a dead run
never blocks the next one and there is nothing to clean up by hand. We call
``fcntl`` directly rather than through a library such as ``filelock`` (which
wraps the same call): it is the standard library, it is a few lines, and we
control what the file holds, so a second run can say who holds the lock. (Older
``filelock`` versions opened the file with ``O_TRUNC``, which would wipe the
holder's pid as a contender tried the lock.) Where ``fcntl`` does not exist
(Windows), no lock is taken and a warning says so.

The lock is re-entrant within one process: the command line holds it for the
whole command, and the trainer it calls takes it again. No table of held locks
is kept for that: the lock file itself names its holder, and a process that
finds the lock taken *and* itself named in the file already holds it (the outer
block releases it). The holder clears the file before it unlocks, so the file
never names a process that no longer holds the lock, unless that process died.
"""

from __future__ import annotations

import errno
import os
import socket
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .disk import RunDirectoryError, disk_errors, reason
from .layout import LOCK_FILE

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_FILE", "RunLockedError", "run_lock", "try_lock"]


class RunLockedError(RunDirectoryError):
    """Another process is running in the same output directory."""


def _signature() -> str:
    """What the lock file says while this process holds the lock."""
    return f"pid={os.getpid()} host={socket.gethostname()}\n"


def _read(fd: int) -> str:
    return os.pread(fd, 200, 0).decode("utf-8", "replace")


def _holder(fd: int) -> str:
    """What the lock file says about its holder ("process 123 on host x")."""
    try:
        text = _read(fd).split()
    except OSError as err:
        return f"an unknown process (the lock file could not be read: {reason(err)})"
    fields = dict(item.split("=", 1) for item in text if "=" in item)
    if "pid" in fields:
        return f"process {fields['pid']} on {fields.get('host', 'an unknown host')}"
    return "another process"


#: The errors of ``flock`` on a file system that has no locks (some network mounts).
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def try_lock(fd: int) -> bool | None:
    """An exclusive ``flock`` on ``fd``, without waiting (POSIX only: ``fcntl``).

    True: locked now; False: another open file holds it; None: this file system
    has no locks (:data:`NO_LOCKS`). Any other error is raised. The run's lock and
    chapter 9's temporary folders (:mod:`grpo_tutorial.chapters.colab`) both ask this.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno not in NO_LOCKS:
            raise
        return None
    return True


def _try_flock(fd: int, root: Path) -> bool | None:
    """:func:`try_lock`, with a warning where the file system has no locks (the run goes on unlocked)."""
    locked = try_lock(fd)
    if locked is None:
        warnings.warn(f"{root} cannot be locked (its file system has no locks): nothing stops a second run there",
                      stacklevel=4)
    return locked


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
    if fcntl is None:
        warnings.warn(f"no fcntl on this platform: {root} is not locked against a second run", stacklevel=3)
        yield
        return
    lock_path = root / LOCK_FILE
    with disk_errors(lock_path, None):
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        locked = _try_flock(fd, root)
        if locked is False:
            if _read(fd) != _signature():
                raise RunLockedError(
                    errno.EBUSY,
                    f"{root} is in use by {_holder(fd)}: one run per output directory; "
                    "wait for it to finish, stop it, or choose another directory",
                )
            yield  # this process holds it already (the command line, then the trainer it calls)
            return
        if locked:
            with disk_errors(lock_path, root):
                os.ftruncate(fd, 0)
                os.pwrite(fd, _signature().encode(), 0)
        try:
            yield
        finally:
            if locked:
                with disk_errors(lock_path, root):
                    os.ftruncate(fd, 0)  # the file stops naming this process before the lock is released
    finally:
        os.close(fd)  # closing the descriptor releases the flock

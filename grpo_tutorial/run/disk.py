"""Writing a run's files: durably, atomically, and with disk errors said in one line.

Every file the package writes for a run (history, checkpoint, ``run.json``,
``eval.json``, plots) is written inside :func:`disk_errors`, which turns an
``OSError`` into a :class:`RunDirectoryError` with one line: which file, what
went wrong (no space, a read-only file system, no permission) and what was kept
(the last good checkpoint and its step). Writes go to temporary files that are
then renamed, so a failed write never replaces a good file.
"""

from __future__ import annotations

import errno
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .layout import what_was_kept

__all__ = ["RunDirectoryError", "disk_errors", "fsync_dir", "reason", "write_durably", "write_json"]

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


def reason(err: OSError) -> str:
    """What went wrong, in words ("no space left on the device")."""
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
        raise RunDirectoryError(err.errno, f"cannot write {target}: {reason(err)}; {kept}") from err


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


def write_json(path: str | os.PathLike, data: Any, output_dir: str | os.PathLike | None = None) -> None:
    """Write ``data`` as indented JSON to ``path`` (through a temporary file, then renamed)."""
    path = Path(path)
    with disk_errors(path.parent, output_dir):
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with disk_errors(tmp, output_dir):
        tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)

"""grpo_tutorial/run/disk.py: a failed write said in one line (which file, why, what was kept), and atomic JSON.

``tests/test_faults.py`` fills a real disk and checks every package write goes
through :func:`disk_errors`; here the errors are raised by hand, one errno each,
so every part of the message can be checked word for word.
"""

import errno
import json
import os

import pytest

from grpo_tutorial.run import RunDirectoryError, disk_errors
from grpo_tutorial.run.disk import reason, write_durably, write_json


@pytest.mark.parametrize(
    "code, words",
    [
        (errno.ENOSPC, "no space left on the device"),
        (errno.EROFS, "the file system is read-only"),
        (errno.EACCES, "permission denied"),
        (errno.EPERM, "operation not permitted"),
        (errno.EDQUOT, "the disk quota is used up"),
        (errno.ENOTDIR, "a part of the path is a file, not a directory"),
    ],
)
def test_reason_in_words(code, words):
    assert reason(OSError(code, os.strerror(code))) == words


def test_reason_falls_back_to_what_the_error_says():
    assert reason(OSError(errno.EIO, "Input/output error")) == "Input/output error"  # not in the table
    assert reason(OSError("a message only")) == "a message only"
    assert reason(OSError()) == "OSError"


def test_run_directory_error_is_one_line_without_errno():
    err = RunDirectoryError(errno.ENOSPC, "cannot write x: no space left on the device; kept y")
    assert str(err) == "cannot write x: no space left on the device; kept y"
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    assert str(RunDirectoryError()) == ""


def test_disk_errors_names_the_file_the_reason_and_what_was_kept(run_dir):
    with pytest.raises(RunDirectoryError) as caught:
        with disk_errors(run_dir / "history.jsonl"):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert str(caught.value) == f"cannot write {run_dir / 'history.jsonl'}: no space left on the device; " \
                                "no existing file was replaced"
    assert caught.value.errno == errno.ENOSPC and isinstance(caught.value.__cause__, OSError)

    with pytest.raises(RunDirectoryError) as caught:  # the error's own file name wins, and the run's checkpoint is named
        with disk_errors(run_dir / "checkpoint.tmp", run_dir):
            raise OSError(errno.EROFS, "Read-only file system", str(run_dir / "checkpoint.tmp" / "state.pt"))
    assert str(caught.value) == (
        f"cannot write {run_dir / 'checkpoint.tmp' / 'state.pt'}: the file system is read-only; "
        f"no checkpoint has been saved in {run_dir} yet"
    )


def test_disk_errors_lets_other_errors_through_unchanged(tmp_path):
    first = RunDirectoryError(errno.EBUSY, "in use")
    with pytest.raises(RunDirectoryError) as caught:
        with disk_errors(tmp_path / "a"):
            raise first
    assert caught.value is first
    with pytest.raises(KeyError):  # not a disk error: not its business
        with disk_errors(tmp_path / "a"):
            raise KeyError("x")
    with disk_errors(tmp_path / "a"):
        pass


def test_write_json_makes_the_folders_and_leaves_no_temporary_file(run_dir):
    path = run_dir / "deep" / "eval.json"
    write_json(path, {"accuracy": 0.5, "rows": [1, 2]})
    assert path.read_text() == '{\n "accuracy": 0.5,\n "rows": [\n  1,\n  2\n ]\n}\n'
    write_json(path, {"accuracy": 0.75})  # replaced whole
    assert json.loads(path.read_text()) == {"accuracy": 0.75}
    assert sorted(p.name for p in path.parent.iterdir()) == ["eval.json"]


def test_write_json_under_a_file_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(RunDirectoryError) as caught:
        write_json(tmp_path / "afile" / "run.json", {"a": 1}, output_dir=tmp_path)
    message = str(caught.value)
    # mkdir says EEXIST here (the file is in the way), which is not in reason()'s table: its own words are used
    assert caught.value.errno in (errno.EEXIST, errno.ENOTDIR)
    assert message.startswith(f"cannot write {tmp_path / 'afile'}: ") and "\n" not in message
    assert message.endswith(f"; no checkpoint has been saved in {tmp_path} yet")
    assert not (tmp_path / "afile").is_dir()


def test_write_durably_writes_the_bytes(tmp_path):
    write_durably(tmp_path / "x.bin", b"\x00\x01abc")
    assert (tmp_path / "x.bin").read_bytes() == b"\x00\x01abc"

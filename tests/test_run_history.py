"""grpo_tutorial/run/history.py: ``history.jsonl`` written as strict JSON, read back, cut at a checkpoint.

``tests/test_faults.py`` checks a trainer's file end to end (and a full disk);
here each function on a file written by hand: the exact lines, NaN as ``null``,
a line cut short by a kill, the writer a run appends with, and a resume's cut.
"""

import json
import math
import warnings

import pytest

from grpo_tutorial.run import GRPOWarning, HistoryWriter, read_history, write_history
from grpo_tutorial.run.history import history_line, history_until


def same_rows(got, expected):
    """Row lists equal, NaN equal to NaN (both written as null)."""
    assert [history_line(r) for r in got] == [history_line(r) for r in expected]


def test_history_line_is_strict_json_with_null_for_what_does_not_exist():
    line = history_line({"step": 1, "kl": math.nan, "loss": 0.25, "grad_norm": math.inf, "lr": -math.inf, "name": "x"})
    assert line == '{"step": 1, "kl": null, "loss": 0.25, "grad_norm": null, "lr": null, "name": "x"}\n'
    json.loads(line, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))


def test_write_then_read_back(run_dir):
    run_dir.mkdir()
    rows = [{"step": 1, "kl": math.nan, "loss": 0.5}, {"step": 2, "kl": 0.01, "loss": 0.25}]
    write_history(run_dir / "history.jsonl", rows)
    assert (run_dir / "history.jsonl").read_text() == (
        '{"step": 1, "kl": null, "loss": 0.5}\n{"step": 2, "kl": 0.01, "loss": 0.25}\n'
    )
    assert not (run_dir / "history.jsonl.tmp").exists()
    same_rows(read_history(run_dir), rows)  # a directory holding the file is fine too
    same_rows(read_history(run_dir / "history.jsonl"), rows)
    write_history(run_dir / "history.jsonl", rows[:1])  # replaces, never appends
    assert len(read_history(run_dir)) == 1


def test_read_history_accepts_old_files_and_blank_lines(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text('{"step": 1, "kl": NaN}\n\n{"step": 2, "kl": null}\n')  # older versions wrote a bare NaN
    rows = read_history(path)
    assert [r["step"] for r in rows] == [1, 2] and all(math.isnan(r["kl"]) for r in rows)


def test_a_missing_file_and_a_cut_line_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        read_history(tmp_path)
    assert str(caught.value) == f"no history file at {str(tmp_path / 'history.jsonl')!r}"
    path = tmp_path / "history.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    with pytest.raises(ValueError, match=r"history.jsonl:3 is not valid JSON \(.*\); was the file cut short\?$"):
        read_history(path)
    assert read_history(path, drop_cut_last_line=True) == [{"step": 1}, {"step": 2}]  # a resume redoes step 3
    path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')  # a bad line that is not the last is never dropped
    with pytest.raises(ValueError, match="history.jsonl:2 is not valid JSON"):
        read_history(path, drop_cut_last_line=True)


def test_the_writer_a_run_appends_with(run_dir):
    run_dir.mkdir()
    (run_dir / "history.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')  # a resumed run's old file
    with HistoryWriter(run_dir, [{"step": 1}]) as writer:  # cut to the checkpoint's step on opening
        assert writer.path == run_dir / "history.jsonl"
        assert read_history(run_dir) == [{"step": 1}]
        writer.append({"step": 2, "kl": math.nan})
        assert (run_dir / "history.jsonl").read_text() == '{"step": 1}\n{"step": 2, "kl": null}\n'  # flushed at once
        writer.sync()
    writer.close()  # twice is fine
    writer.append({"step": 3})  # after close: nothing, and no error
    assert len(read_history(run_dir)) == 2


def test_without_an_output_dir_the_writer_does_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    writer = HistoryWriter(None, [{"step": 1}])
    writer.append({"step": 2})
    writer.sync()
    writer.close()
    assert writer.path is None and list(tmp_path.iterdir()) == []


def test_history_until_cuts_at_the_checkpoint_step(tmp_path):
    write_history(tmp_path / "history.jsonl", [{"step": s, "loss": 0.1 * s} for s in (1, 2, 3, 4)])
    rows = history_until(tmp_path, {"step": 2})
    assert rows == [{"step": 1, "loss": 0.1}, {"step": 2, "loss": 0.2}]
    with open(tmp_path / "history.jsonl", "a") as fh:
        fh.write('{"step": 5, "lo')  # killed mid-write after the save
    assert len(history_until(tmp_path, {"step": 4})) == 4


def test_history_until_reads_a_format_1_checkpoint(tmp_path):
    meta = {"step": 2, "history": [{"step": 1}, {"step": 2}, {"step": 3}], "history_len": 2}
    assert history_until(tmp_path, meta) == [{"step": 1}, {"step": 2}]  # no history.jsonl needed


def test_history_until_warns_when_rows_are_missing(tmp_path):
    write_history(tmp_path / "history.jsonl", [{"step": 1}, {"step": 3}])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = history_until(tmp_path, {"step": 3})
    assert rows == [{"step": 1}, {"step": 3}]
    (warning,) = caught
    assert warning.category is GRPOWarning and warning.filename == __file__
    assert str(warning.message) == (
        f"{tmp_path / 'history.jsonl'} has 2 rows up to the checkpoint's step 3; "
        "the history of the resumed run will be incomplete"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert history_until(tmp_path / "nothing", {"step": 0}) == []  # no file at step 0: nothing missing
    assert caught == []

"""grpo_tutorial/run/layout.py: the files of an output directory, and where the last complete checkpoint is.

A checkpoint is written as ``checkpoint.tmp``, then renamed over ``checkpoint``
with the old one parked as ``checkpoint.old``; :func:`find_checkpoint` must find
a complete one at every instant of that dance. Directories are built by hand here.
"""

import json

import pytest

from grpo_tutorial.run.layout import (
    CHECKPOINT,
    CHECKPOINT_OLD,
    CHECKPOINT_TMP,
    COMPLETIONS_FILE,
    EVAL_FILE,
    HISTORY_FILE,
    LOCK_FILE,
    META_FILE,
    RUN_FILE,
    STATE_FILE,
    find_checkpoint,
    read_meta,
    what_was_kept,
)


def checkpoint(path, step=1, fmt=2, state=True):
    """A checkpoint directory at ``path`` as far as the layout can tell (a meta file and a state file)."""
    path.mkdir(parents=True)
    (path / META_FILE).write_text(json.dumps({"format": fmt, "step": step}))
    if state:
        (path / STATE_FILE).write_bytes(b"tensors")
    return path


def test_the_file_names_are_the_on_disk_contract():
    assert (HISTORY_FILE, COMPLETIONS_FILE, CHECKPOINT, CHECKPOINT_TMP, CHECKPOINT_OLD, STATE_FILE, META_FILE,
            LOCK_FILE, RUN_FILE, EVAL_FILE) == (
        "history.jsonl", "completions.jsonl", "checkpoint", "checkpoint.tmp", "checkpoint.old", "state.pt",
        "trainer_state.json", ".lock", "run.json", "eval.json")


def test_no_checkpoint(run_dir):
    assert find_checkpoint(run_dir) is None  # not even the directory
    checkpoint(run_dir / CHECKPOINT, state=False)  # a meta file alone is not a checkpoint
    assert find_checkpoint(run_dir) is None
    checkpoint(run_dir / CHECKPOINT_TMP)  # an unfinished write is never used
    assert find_checkpoint(run_dir) is None


def test_every_instant_of_a_save_has_a_complete_checkpoint(run_dir):
    old = checkpoint(run_dir / CHECKPOINT, step=2)
    assert find_checkpoint(run_dir) == old
    checkpoint(run_dir / CHECKPOINT_TMP, step=4)  # writing the new one
    assert find_checkpoint(run_dir) == run_dir / CHECKPOINT
    (run_dir / CHECKPOINT).rename(run_dir / CHECKPOINT_OLD)  # first rename: the old one parked
    assert find_checkpoint(run_dir) == run_dir / CHECKPOINT_OLD and read_meta(find_checkpoint(run_dir))["step"] == 2
    (run_dir / CHECKPOINT_TMP).rename(run_dir / CHECKPOINT)  # second rename: the new one in place
    assert find_checkpoint(run_dir) == run_dir / CHECKPOINT and read_meta(find_checkpoint(run_dir))["step"] == 4


def test_a_checkpoint_directory_is_its_own_checkpoint(run_dir):
    path = checkpoint(run_dir / CHECKPOINT)
    assert find_checkpoint(path) == path
    assert find_checkpoint(str(run_dir)) == path  # a str is fine


@pytest.mark.parametrize("fmt", [1, 2])
def test_read_meta_reads_the_readable_formats(tmp_path, fmt):
    assert read_meta(checkpoint(tmp_path / "c", step=7, fmt=fmt)) == {"format": fmt, "step": 7}


@pytest.mark.parametrize("fmt, shown", [(3, "3"), (None, "None"), ("2", "'2'")])
def test_read_meta_refuses_other_formats(tmp_path, fmt, shown):
    path = checkpoint(tmp_path / "c", fmt=fmt)
    with pytest.raises(ValueError) as caught:
        read_meta(path)
    assert str(caught.value) == f"checkpoint {path} has format {shown}; expected one of (1, 2)"


def test_what_was_kept_in_words(run_dir):
    assert what_was_kept(None) == "nothing was saved (no output_dir)"
    assert what_was_kept(run_dir) == f"no checkpoint has been saved in {run_dir} yet"
    checkpoint(run_dir / CHECKPOINT, step=6)
    assert what_was_kept(run_dir) == f"the last good checkpoint is step 6, at {run_dir / CHECKPOINT}"


def test_what_was_kept_reports_an_unreadable_checkpoint(run_dir):
    path = checkpoint(run_dir / CHECKPOINT)
    (path / META_FILE).write_text('{"format": 2, "st')
    kept = what_was_kept(run_dir)
    assert kept.startswith(f"the checkpoint at {path} could not be read back (") and "char" in kept
    (path / META_FILE).write_text('{"format": 2}')  # no step
    assert what_was_kept(run_dir) == f"the checkpoint at {path} could not be read back ('step')"

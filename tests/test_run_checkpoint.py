"""grpo_tutorial/run/checkpoint.py: the atomic checkpoint, the global RNG snapshot, and what a resume compares.

``tests/test_trainer_pieces.py`` saves and loads a trainer's objects and decides
resume-or-start, ``tests/test_faults.py`` kills and starves saves; here: the
files one :func:`write_checkpoint` leaves (and the leftovers of a killed one it
clears), the RNG snapshot through ``torch.save``, :func:`config_changes` word
for word, and :func:`load_model_state`. A ``torch.nn.Linear`` stands in for a model.
"""

import io
import json
import pickle
import random

import numpy as np
import pytest
import torch

from grpo_tutorial.run import load_model_state, read_checkpoint, write_checkpoint
from grpo_tutorial.run.checkpoint import (
    RESUME_FREE_FIELDS,
    capture_rng_state,
    config_changes,
    restore_rng_state,
    restore_training_state,
    training_state,
)
from grpo_tutorial.run.layout import (
    CHECKPOINT, CHECKPOINT_OLD, CHECKPOINT_TMP, META_FILE, STATE_FILE, find_checkpoint, read_meta,
)


def parts(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, optimizer, scheduler


class Unwritable:
    """A state entry torch.save cannot write (and not an OSError: no disk is involved)."""

    def __reduce__(self):
        raise pickle.PicklingError("this object cannot be written")


def draws():
    return random.random(), float(np.random.rand()), float(torch.rand(1))


# ---------------------------------------------------------------------------
# write_checkpoint, read_checkpoint
# ---------------------------------------------------------------------------


def test_write_checkpoint_leaves_exactly_the_checkpoint(run_dir):
    path = write_checkpoint(run_dir, {"w": torch.arange(3.0)}, {"step": 2, "config": {"seed": 0}})
    assert path == run_dir / CHECKPOINT
    assert sorted(p.name for p in run_dir.iterdir()) == [CHECKPOINT]
    assert sorted(p.name for p in path.iterdir()) == [STATE_FILE, META_FILE]
    meta = json.loads((path / META_FILE).read_text())
    assert meta == {"format": 2, "step": 2, "config": {"seed": 0}} and list(meta)[0] == "format"
    state, meta = read_checkpoint(path)
    assert torch.equal(state["w"], torch.arange(3.0)) and meta["step"] == 2


def test_a_new_checkpoint_replaces_the_old_and_clears_leftovers(run_dir):
    write_checkpoint(run_dir, {"w": torch.zeros(1)}, {"step": 1})
    (run_dir / CHECKPOINT_TMP).mkdir()  # a save killed while writing
    (run_dir / CHECKPOINT_TMP / STATE_FILE).write_bytes(b"half")
    write_checkpoint(run_dir, {"w": torch.ones(1)}, {"step": 2})
    assert sorted(p.name for p in run_dir.iterdir()) == [CHECKPOINT]
    state, meta = read_checkpoint(run_dir / CHECKPOINT)
    assert meta["step"] == 2 and torch.equal(state["w"], torch.ones(1))


def test_a_state_that_cannot_be_written_leaves_the_last_checkpoint(run_dir):
    write_checkpoint(run_dir, {"w": torch.zeros(1)}, {"step": 1})
    with pytest.raises(pickle.PicklingError, match="this object cannot be written"):
        write_checkpoint(run_dir, {"w": Unwritable()}, {"step": 2})
    assert find_checkpoint(run_dir) == run_dir / CHECKPOINT and read_meta(run_dir / CHECKPOINT)["step"] == 1
    write_checkpoint(run_dir, {"w": torch.ones(1)}, {"step": 3})  # and the next save clears what it left
    assert sorted(p.name for p in run_dir.iterdir()) == [CHECKPOINT]


def test_a_save_killed_between_its_renames_is_recovered_before_the_next(run_dir):
    write_checkpoint(run_dir, {"w": torch.zeros(1)}, {"step": 1})
    (run_dir / CHECKPOINT).rename(run_dir / CHECKPOINT_OLD)  # killed after the first rename: only .old is complete
    assert find_checkpoint(run_dir) == run_dir / CHECKPOINT_OLD
    with pytest.raises(pickle.PicklingError):  # the next save fails too: the step-1 checkpoint must still be there
        write_checkpoint(run_dir, {"w": Unwritable()}, {"step": 2})
    assert find_checkpoint(run_dir) == run_dir / CHECKPOINT and read_meta(find_checkpoint(run_dir))["step"] == 1
    write_checkpoint(run_dir, {"w": torch.ones(1)}, {"step": 2})
    assert sorted(p.name for p in run_dir.iterdir()) == [CHECKPOINT]
    assert read_meta(run_dir / CHECKPOINT)["step"] == 2


# ---------------------------------------------------------------------------
# training_state and the RNGs
# ---------------------------------------------------------------------------


def test_the_rng_snapshot_survives_torch_save_and_replays_the_draws():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = capture_rng_state()
    expected = [draws() for _ in range(3)]
    buffer = io.BytesIO()
    torch.save(state, buffer)  # as a checkpoint stores it, and reads it back with weights_only=True
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    draws()  # move every generator on
    restore_rng_state(loaded)
    assert [draws() for _ in range(3)] == expected


def test_training_state_round_trip_and_a_missing_reference(tmp_path):
    model, optimizer, scheduler = parts(0)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    state = training_state(model, optimizer, scheduler)
    assert set(state) == {"model", "optimizer", "scheduler", "ref_model", "rng", "extra"} and state["ref_model"] is None
    assert state["extra"] == {}  # GRPO's step holds nothing beyond the policy
    write_checkpoint(tmp_path, state, {"step": 1})

    other, other_opt, other_sched = parts(1)
    reference = torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in reference.parameters()]
    loaded, _ = read_checkpoint(tmp_path / CHECKPOINT)
    assert restore_training_state(loaded, other, other_opt, other_sched, reference) is False  # saved with beta = 0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(before, reference.parameters()))  # the reference kept as it was
    assert other_sched.last_epoch == scheduler.last_epoch == 1
    assert other_opt.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]

    with_ref = training_state(model, optimizer, scheduler, ref_model=model)
    assert restore_training_state(with_ref, other, other_opt, other_sched, reference) is True
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))


# ---------------------------------------------------------------------------
# load_model_state
# ---------------------------------------------------------------------------


def test_load_model_state_loads_the_policy_and_returns_the_meta(run_dir):
    model, optimizer, scheduler = parts(0)
    write_checkpoint(run_dir, training_state(model, optimizer, scheduler), {"step": 4})
    other, _, _ = parts(1)
    assert load_model_state(other, run_dir) == {"format": 2, "step": 4}
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))


def test_load_model_state_without_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        load_model_state(torch.nn.Linear(1, 1), tmp_path)
    assert str(caught.value) == (
        f"no checkpoint found in {str(tmp_path)!r}; expected checkpoint/state.pt and checkpoint/trainer_state.json "
        "(written by GRPOTrainer.train with checkpoint_every > 0)"
    )


# ---------------------------------------------------------------------------
# config_changes
# ---------------------------------------------------------------------------


def test_the_fields_a_resume_may_change():
    assert RESUME_FREE_FIELDS == {"output_dir", "log_every", "checkpoint_every", "checkpoint_in_place",
                                  "eval_batch_size", "log_completions", "num_completions_to_print", "report_to",
                                  "completions_to_keep"}


def test_config_changes_word_for_word():
    defaults = {"seed": 0, "learning_rate": 1e-4, "beta": 0.0, "log_every": 1}
    saved = {"seed": 0, "learning_rate": 1e-4, "log_every": 1, "output_dir": "a"}
    assert config_changes(saved, {**saved, "log_every": 5, "output_dir": "b"}, defaults) == ""  # free fields only
    current = {"seed": 1, "learning_rate": 3e-3, "beta": 0.0, "log_every": 5, "output_dir": "b"}
    # beta is not in the saved config (added since): it counts as its default, 0.0, so it did not change
    assert config_changes(saved, current, defaults) == "seed: 0 -> 1, learning_rate: 0.0001 -> 0.003"
    assert config_changes(saved, {"beta": 0.1}, defaults) == "beta: 0.0 -> 0.1"
    assert config_changes({}, {"reward_weights": [1.0]}, {}) == "reward_weights: None -> [1.0]"

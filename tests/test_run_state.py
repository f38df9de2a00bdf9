"""grpo_tutorial/run/state.py: where a run stands, its checkpoint form, the dataset it is tied to, and its warnings.

``tests/test_trainer_pieces.py`` ties a run to one dataset; this file checks the
checkpoint form (``to_meta`` and back), the fingerprint's exact value and what
it depends on, and :class:`WarnOnce`, the run's record of the warnings it gave
(imported from ``grpo_tutorial.run``, which re-exports it wherever it lives).
"""

import hashlib
import json
import warnings

import pytest

from grpo_tutorial.run import GRPOWarning, RunState, WarnOnce, dataset_fingerprint
from grpo_tutorial.run.state import check_same_dataset


def test_a_new_run_stands_at_the_start():
    state = RunState()
    assert (state.step, state.epoch, state.index, state.dataset_fingerprint, state.skipped_updates) == (0, 0, 0, None, 0)
    assert state.warn.issued == set()
    assert RunState().warn is not state.warn  # each run its own record


def test_to_meta_is_json_and_reads_back():
    state = RunState(step=12, epoch=3, index=5, dataset_fingerprint="e069fffdd842e2a8", skipped_updates=2,
                     warn=WarnOnce(["truncated", "collapse"]))
    meta = state.to_meta()
    assert meta == {"step": 12, "epoch": 3, "index": 5, "dataset_fingerprint": "e069fffdd842e2a8",
                    "skipped_updates": 2, "warned": ["collapse", "truncated"]}  # sorted: the same file every time
    back = RunState.from_meta(json.loads(json.dumps({**meta, "config": {"seed": 0}, "format": 2})))  # other keys
    assert back.to_meta() == meta and back.warn.issued == {"collapse", "truncated"}


def test_from_meta_needs_every_field():
    meta = RunState().to_meta()
    del meta["skipped_updates"]
    with pytest.raises(KeyError, match="skipped_updates"):
        RunState.from_meta(meta)


def test_the_fingerprint_of_the_tiny_batch(tiny_batch):
    assert dataset_fingerprint(tiny_batch) == "e069fffdd842e2a8"
    # the first 16 hex digits of the SHA-256 of each row's [prompt, answer] as JSON, in order
    digest = hashlib.sha256()
    for row in tiny_batch:
        digest.update(json.dumps([row["prompt"], row["answer"]]).encode())
    assert dataset_fingerprint(tiny_batch) == digest.hexdigest()[:16]
    assert dataset_fingerprint([]) == hashlib.sha256().hexdigest()[:16] == "e3b0c44298fc1c14"


def test_the_fingerprint_reads_prompts_answers_and_their_order_only(tiny_batch):
    base = dataset_fingerprint(tiny_batch)
    assert dataset_fingerprint([{**row, "a": 1, "op": "+"} for row in tiny_batch]) == base  # other keys: ignored
    assert dataset_fingerprint(tiny_batch[::-1]) != base
    assert dataset_fingerprint([{**tiny_batch[0], "answer": "47"}, *tiny_batch[1:]]) != base
    assert dataset_fingerprint([{"prompt": "1+1=", "answer": 2}]) != dataset_fingerprint([{"prompt": "1+1=", "answer": "2"}])
    assert dataset_fingerprint([{"prompt": "1+1="}]) == dataset_fingerprint([{"prompt": "1+1=", "answer": None}])


def test_another_dataset_is_refused_with_both_fingerprints():
    with pytest.raises(ValueError) as caught:
        check_same_dataset("aaaa", "bbbb", "the checkpoint in 'out'")
    assert str(caught.value) == (
        "the dataset differs from the one the checkpoint in 'out' trained on (fingerprint aaaa vs bbbb); "
        "train on the same dataset, or start a new trainer (and output_dir) for a new one"
    )
    check_same_dataset("aaaa", "aaaa", "x")
    state = RunState(dataset_fingerprint="bbbb")
    with pytest.raises(ValueError, match="fingerprint aaaa vs bbbb"):
        state.use_dataset("aaaa", "this trainer")
    assert state.dataset_fingerprint == "bbbb"  # refused: still tied to its own dataset


def test_warn_once_says_each_kind_once_and_points_at_the_caller():
    warn = WarnOnce(["truncated"])  # resumed: this one was said before the checkpoint
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn("zero_std", "no signal")
        warn("zero_std", "no signal again")
        warn("truncated", "too long")
        warn("collapse", "collapsing")
    assert [(w.category, str(w.message)) for w in caught] == [(GRPOWarning, "no signal"), (GRPOWarning, "collapsing")]
    assert all(w.filename == __file__ for w in caught)  # the user's line, not the package's
    assert warn.issued == {"truncated", "zero_std", "collapse"}
    assert RunState(warn=warn).to_meta()["warned"] == ["collapse", "truncated", "zero_std"]


def test_grpo_warning_is_a_user_warning():
    assert issubclass(GRPOWarning, UserWarning)

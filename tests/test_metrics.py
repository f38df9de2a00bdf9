"""grpo_tutorial/metrics.py: the history row of a step, the failure-mode warnings, and the stage clocks.

``tests/test_failure_warnings.py`` tells mastery from collapse and
``tests/test_trainer_pieces.py`` hears a real step's stages; here :func:`step_row`
is checked field by field on a row small enough to add up by hand, the other
warnings and their thresholds, and :class:`StageClock` on a clock that ticks
when the test says so.
"""

import math
from types import SimpleNamespace

import pytest
import torch

import grpo_tutorial.metrics as metrics
from grpo_tutorial.metrics import TIMING_KEYS, StageClock, step_row, timed, watch_stages

NAN = math.nan


def small_step(**changes):
    """One step of 4 completions (2 groups of 2), 3 token positions, two micro-batches."""
    args = dict(
        step=3,
        rewards=torch.tensor([1.0, 0.0, NAN, 1.0]),  # the third could not be scored
        per_function={"correctness_reward": 2 / 3},
        correct=[1.0, 0.0, NAN, 1.0],
        update_stats=[
            dict(kl=0.1, clip_frac_low=0.0, clip_frac_high=0.25, clip_frac=0.25, ratio_mean=1.0, ratio_max=1.2),
            dict(kl=NAN, clip_frac_low=0.5, clip_frac_high=0.0, clip_frac=0.5, ratio_mean=0.9, ratio_max=NAN),
        ],
        losses=[0.5, NAN],  # one update was not finite
        grad_norms=[2.0, 4.0],
        entropy=torch.tensor([[0.5, 1.5, 9.0], [1.0, 1.0, 1.0], [NAN, NAN, NAN], [2.0, 2.0, 2.0]]),
        mask=torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]),
        zero_std=torch.tensor([True, False]),
        truncated=torch.tensor([False, False, True, False]),
        lr=1e-4,
        skipped_updates=1,
        seconds={"step_seconds": 2.0, "sample_seconds": 0.5},
    )
    args.update(changes)
    return step_row(**args)


def test_step_row_field_by_field():
    row = small_step()
    assert list(row) == [
        "step", "reward_mean", "reward_std", "reward/correctness_reward", "accuracy", "kl", "clip_frac_low",
        "clip_frac_high", "clip_frac", "ratio_mean", "ratio_max", "entropy", "completion_len_mean",
        "completion_len_max", "frac_zero_std", "frac_truncated", "grad_norm", "loss", "lr", "skipped_updates",
        "step_seconds", "sample_seconds", "tokens_per_s",
    ]
    expected = {
        "step": 3,
        "reward_mean": 2 / 3,  # the scored rewards 1, 0, 1
        "reward_std": math.sqrt(1 / 3),  # their sample std: ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3
        "reward/correctness_reward": 2 / 3,
        "accuracy": 2 / 3,  # NaN (no answer) left out
        "kl": 0.1,  # the NaN micro-batch left out
        "clip_frac_low": 0.25,
        "clip_frac_high": 0.125,
        "clip_frac": 0.375,
        "ratio_mean": 0.95,
        "ratio_max": 1.2,
        "entropy": 11 / 8,  # rows 0, 1, 3 (row 2 was never scored): (0.5 + 1.5 + 3 + 6) / (2 + 3 + 3) tokens
        "completion_len_mean": 9 / 4,
        "completion_len_max": 3.0,
        "frac_zero_std": 0.5,
        "frac_truncated": 0.25,
        "grad_norm": 3.0,
        "loss": 0.5,  # the mean of the finite losses
        "lr": 1e-4,
        "skipped_updates": 1.0,
        "step_seconds": 2.0,
        "sample_seconds": 0.5,
        "tokens_per_s": 9 / 2.0,  # every generated token, scored or not
    }
    assert row == pytest.approx(expected, rel=1e-6)
    assert type(row["skipped_updates"]) is float and all(type(v) in (int, float) for v in row.values())


def test_step_row_when_nothing_is_there():
    row = small_step(rewards=torch.tensor([NAN, NAN, NAN, NAN]), correct=None, losses=[NAN, math.inf],
                     grad_norms=[math.inf], entropy=torch.full((4, 3), NAN), seconds={"step_seconds": 0.0})
    assert math.isnan(row["reward_mean"]) and row["reward_std"] == 0.0
    assert math.isnan(row["accuracy"]) and math.isnan(row["entropy"]) and math.isnan(row["tokens_per_s"])
    assert math.isnan(row["loss"])  # no finite loss: the first value itself, so NaN says what went wrong
    assert row["grad_norm"] == math.inf
    one = small_step(rewards=torch.tensor([NAN, 0.5, NAN, NAN]))
    assert one["reward_mean"] == 0.5 and one["reward_std"] == 0.0  # a single reward has no spread


def test_timing_keys_are_the_seconds_and_the_rate():
    assert TIMING_KEYS == {
        "step_seconds", "tokens_per_s", "other_seconds", "sample_seconds", "reward_seconds", "advantages_seconds",
        "score_seconds", "update_seconds", "reference_seconds", "forward_seconds", "backward_seconds",
        "optimizer_seconds", "sampler/decode_ms", "sampler/compile_seconds",
        "generate_seconds", "rollout_seconds",  # older histories' names for stage 1 (issue 44)
    }


def test_the_timing_keys_of_the_stages_are_the_stages_names_in_order():
    """One set of names (issue 44): the history's per-stage seconds, the clock's laps and the stages."""
    from grpo_tutorial.metrics import STAGE_SECONDS
    from grpo_tutorial.stages import STAGES

    assert STAGE_SECONDS == ("sample_seconds", "reward_seconds", "advantages_seconds", "score_seconds",
                             "update_seconds")
    assert [key.removesuffix("_seconds") for key in STAGE_SECONDS] == [s.name for s in STAGES]


#: The timing fields of a history row as the step wrote them before issue 44 gave the stages' seconds the stages'
#: names (StageClock.done() and the update's pieces at commit ba1c0d9).
OLD_ROW = {
    "step_seconds": 40.0, "rollout_seconds": 10.0, "generate_seconds": 10.0, "reward_seconds": 0.5,
    "score_seconds": 4.0, "reference_seconds": 3.0, "update_seconds": 20.0, "other_seconds": 2.5,
    "forward_seconds": 8.0, "backward_seconds": 11.0, "optimizer_seconds": 1.0,
}


def test_stage_seconds_reads_new_rows_and_old_histories():
    from grpo_tutorial.metrics import stage_seconds

    new = {"step_seconds": 40.0, "sample_seconds": 10.0, "reward_seconds": 0.5, "advantages_seconds": 0.25,
           "score_seconds": 6.75, "reference_seconds": 3.0, "update_seconds": 20.0, "other_seconds": 2.5}
    assert stage_seconds(new) == {"sample": 10.0, "reward": 0.5, "advantages": 0.25, "score": 6.75, "update": 20.0}
    # an older row: stage 1 was "generate"; its score_seconds left the reference out (and held stage 3's time)
    assert stage_seconds(OLD_ROW) == {"sample": 10.0, "reward": 0.5, "advantages": 0.0, "score": 7.0, "update": 20.0}
    assert sum(stage_seconds(OLD_ROW).values()) + OLD_ROW["other_seconds"] == OLD_ROW["step_seconds"]


def test_the_committed_old_histories_still_read():
    """The committed SmolLM2 histories are older still (only ``rollout_seconds``): every row reads, stage by stage."""
    from grpo_tutorial.data import read_data
    from grpo_tutorial.metrics import stage_seconds
    from grpo_tutorial.stages import STAGES

    for name in ("smollm2_history.jsonl", "smollm2_history_seed1.jsonl", "smollm2_history_seed2.jsonl"):
        rows = read_data(name)
        assert rows and "rollout_seconds" in rows[0] and "sample_seconds" not in rows[0]  # an old history indeed
        for row in rows:
            seconds = stage_seconds(row)
            assert list(seconds) == [s.name for s in STAGES]
            assert seconds["sample"] == row["rollout_seconds"] > 0
            assert seconds["sample"] <= row["step_seconds"]


# ---------------------------------------------------------------------------
# StageClock, timed, watch_stages
# ---------------------------------------------------------------------------


@pytest.fixture
def ticks(monkeypatch):
    """metrics' clock reads the times in this list, one per call."""
    times: list[float] = []
    monkeypatch.setattr(metrics, "time", SimpleNamespace(perf_counter=lambda: times.pop(0)))
    return times


def test_stage_clock_adds_laps_by_name_and_fills_the_rest(ticks):
    ticks.extend([10.0, 11.0, 11.5, 14.0, 15.0])  # start; sample; reward; sample again; done
    clock = StageClock()
    clock.lap("sample")
    clock.lap("reward")
    clock.lap("sample")
    assert clock.done() == {
        "step_seconds": 5.0,
        "sample_seconds": 3.5,  # 1.0 + 2.5
        "reward_seconds": 0.5,
        "advantages_seconds": 0.0,
        "score_seconds": 0.0,
        "update_seconds": 0.0,
        "other_seconds": 1.0,  # 5.0 - 4.0 between the laps and done()
    }
    assert not ticks


def test_timed_adds_the_block_to_its_field(ticks):
    ticks.extend([1.0, 1.25, 2.0, 4.0])
    seconds = {"forward_seconds": 0.5}
    with timed(seconds, "forward_seconds"):
        pass
    with timed(seconds, "forward_seconds"):
        pass
    assert seconds == {"forward_seconds": 0.5 + 0.25 + 2.0}


def test_watchers_hear_each_lap_and_nest():
    outer, inner = [], []
    clock = StageClock()
    with watch_stages(outer.append):
        clock.lap("sample")
        with watch_stages(inner.append):
            clock.lap("reward")
            with timed({"forward_seconds": 0.0}, "forward_seconds"):
                pass
        clock.lap("score")
    clock.lap("update")
    assert outer == ["sample", "reward", "forward_seconds", "score"]
    assert inner == ["reward", "forward_seconds"]


def test_a_watcher_leaves_even_when_the_block_raises():
    heard = []
    with pytest.raises(KeyError):
        with watch_stages(heard.append):
            raise KeyError("boom")
    StageClock().lap("sample")
    assert heard == []


def test_watch_stages_refuses_what_cannot_be_called():
    with pytest.raises(TypeError, match="^watcher must be a function of the stage name, got list$"):
        with watch_stages([]):
            pass

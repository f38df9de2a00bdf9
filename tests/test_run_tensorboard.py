"""``report_to="tensorboard"`` (issue 33): each history row as TensorBoard scalars, live, and right after a resume.

The event files are read back with TensorBoard's own reader (``EventAccumulator``),
which is what ``tensorboard --load_fast=false`` shows; it keeps every value of a
tag (TensorBoard samples long runs; these are short).
"""

from __future__ import annotations

import math
import sys
import threading
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from grpo_tutorial.__main__ import build_parser, config_from_args, resolve_run_defaults  # noqa: E402
from grpo_tutorial.run.tensorboard import TAG_PREFIX, TensorBoardWriter  # noqa: E402
from grpo_tutorial.tasks import make_arithmetic_dataset  # noqa: E402
from grpo_tutorial.trainer import GRPOConfig, GRPOTrainer, GRPOWarning  # noqa: E402

from helpers import length_reward, small_model  # noqa: E402


def data():
    return make_arithmetic_dataset(16, 0, digits=1)


def trainer(out, reward=length_reward, **cfg) -> GRPOTrainer:
    model, tok = small_model(seed=0)
    config = GRPOConfig(group_size=4, prompts_per_step=2, max_new_tokens=3, output_dir=str(out), **cfg)
    return GRPOTrainer(model, tok, reward, config)


def train(t: GRPOTrainer, steps: int, **kwargs) -> list[dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        return t.train(data(), steps, progress=False, **kwargs)


def scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag in ``log_dir`` -> its (step, value) pairs, as TensorBoard shows them."""
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep every value
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def expected(history: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """The history as TensorBoard should hold it: finite numbers only, stored as float32."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in history:
        for key, value in row.items():
            if key != "step" and not isinstance(value, bool) and math.isfinite(value):
                out.setdefault(TAG_PREFIX + key, []).append((row["step"], float(np.float32(value))))
    return out


def writer_threads() -> int:
    """TensorBoard's event-writing threads alive in this process: one per open writer, until it is closed."""
    return sum(type(thread).__name__ == "_AsyncWriterThread" for thread in threading.enumerate())

def test_a_run_writes_every_row_as_scalars_live_at_its_step(run_dir):
    t = trainer(run_dir, report_to="tensorboard")
    seen_during_training, open_during_training = [], []

    def look(row):  # called before the trainer's own TensorBoard writer, which train() appends
        open_during_training.append(writer_threads())
        seen_during_training.append(sorted({step for pairs in scalars(run_dir / "tensorboard").values()
                                            for step, _ in pairs}))

    t.row_listeners.append(look)
    before = writer_threads()
    history = train(t, 3)
    assert seen_during_training == [[], [1], [1, 2]]  # TensorBoard sees each step while the run goes on
    assert open_during_training == [before + 1] * 3 and writer_threads() == before  # closed when train() ended
    written = scalars(run_dir / "tensorboard")
    assert written == expected(history)
    assert written[TAG_PREFIX + "reward_mean"] == [(r["step"], float(np.float32(r["reward_mean"]))) for r in history]
    assert TAG_PREFIX + "kl" not in written  # beta = 0: kl is NaN in every row, so there is no curve
    assert {TAG_PREFIX + "loss", TAG_PREFIX + "reward/length_reward", TAG_PREFIX + "step_seconds"} <= set(written)
    assert len(t.row_listeners) == 1  # the writer left the listeners when train() ended


def test_a_resumed_run_leaves_exactly_one_value_per_step(run_dir):
    calls = []

    def dies_in_step_4(completions, **kwargs):  # a kill after step 3 was logged, with the checkpoint at step 2
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("killed")
        return length_reward(completions)

    with pytest.raises(Exception, match="killed"):
        train(trainer(run_dir, dies_in_step_4, report_to="tensorboard", checkpoint_every=2), 5)
    cut = scalars(run_dir / "tensorboard")
    assert [step for step, _ in cut[TAG_PREFIX + "reward_mean"]] == [1, 2, 3]  # step 3 is past the checkpoint
    time.sleep(1)  # event files sort by their name, which starts with the second they were opened in
    resumed = trainer(run_dir, report_to="tensorboard", checkpoint_every=2)
    history = train(resumed, 5, resume=True)
    assert [r["step"] for r in history] == [1, 2, 3, 4, 5]
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2  # appended, not rewritten
    written = scalars(run_dir / "tensorboard")
    assert written == expected(history)  # step 3 once: the interrupted run's value is purged, the redone one kept
    for pairs in written.values():
        steps = [step for step, _ in pairs]
        assert steps == sorted(set(steps)), pairs


def test_turning_tensorboard_on_at_a_resume_is_not_a_config_change(run_dir):
    train(trainer(run_dir, checkpoint_every=2), 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GRPOWarning)
        history = trainer(run_dir, report_to="tensorboard", checkpoint_every=2).train(data(), 3, resume=True,
                                                                                      progress=False)
    assert not [w for w in caught if "different config" in str(w.message)]
    assert scalars(run_dir / "tensorboard") == expected(history[2:])  # from the resumed step on


def test_the_default_writes_no_tensorboard_folder(run_dir):
    t = trainer(run_dir)
    assert t.config.report_to == "none"
    train(t, 1)
    assert (run_dir / "history.jsonl").exists() and not (run_dir / "tensorboard").exists()
    assert t.row_listeners == []


def test_the_writer_flushes_each_row_and_skips_what_is_not_a_number(tmp_path):
    writer = TensorBoardWriter(tmp_path, first_step=1)
    writer({"step": 1, "reward_mean": 0.5, "kl": math.nan, "loss": math.inf, "flag": True, "note": "text", "n": 3})
    assert scalars(tmp_path) == {TAG_PREFIX + "reward_mean": [(1, 0.5)], TAG_PREFIX + "n": [(1, 3.0)]}  # still open
    writer.close()


@pytest.mark.parametrize("value, stored", [
    ("tensorboard", "tensorboard"), (["tensorboard"], "tensorboard"), (("tensorboard",), "tensorboard"),
    ("none", "none"), ([], "none"), (["none"], "none"),  # transformers' spellings of "nothing"
])
def test_report_to_takes_transformers_spellings_and_stores_one_name(value, stored):
    config = GRPOConfig(report_to=value, output_dir="out")
    assert config.report_to == stored
    assert GRPOConfig(**config.to_dict()) == config


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(report_to="wandb", output_dir="out"), ValueError,
     "GRPOConfig.report_to must be one of ['none', 'tensorboard'] or a list of them, got 'wandb': the package "
     "writes TensorBoard's files only; to send each step's row elsewhere (wandb, trackio, ...), append a function "
     "to GRPOTrainer.row_listeners"),
    (dict(report_to=["tensorboard", "all"], output_dir="out"), ValueError,
     "GRPOConfig.report_to must be one of ['none', 'tensorboard'] or a list of them, got ['tensorboard', 'all']"),
    (dict(report_to=None), TypeError,
     "GRPOConfig.report_to must be one of ['none', 'tensorboard'] or a list of them, got None (type NoneType)"),
])
def test_bad_values_are_refused_naming_the_field(kwargs, error, message):
    with pytest.raises(error) as info:
        GRPOConfig(**kwargs)
    assert str(info.value).startswith(message)


def test_the_trainer_refuses_tensorboard_without_an_output_dir_when_it_is_built(small_policy):
    config = GRPOConfig(report_to="tensorboard")  # the config takes it: `evaluate --checkpoint` rebuilds a
    assert config.report_to == "tensorboard"  # run's config without its output_dir
    model, tok = small_policy
    with pytest.raises(ValueError) as info:
        GRPOTrainer(model, tok, length_reward, config)
    assert str(info.value) == (
        "GRPOConfig.report_to must be 'none' when output_dir is None, got 'tensorboard': TensorBoard's event files "
        "go to output_dir/tensorboard/, so set output_dir")


def test_without_tensorboard_the_error_says_how_to_install_it(run_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # what an environment without it raises
    message = (r"report_to='tensorboard' needs the tensorboard package: pip install tensorboard "
               r"\(Colab has it already")
    with pytest.raises(ImportError, match=message):
        trainer(run_dir, report_to="tensorboard")  # when the trainer is built, before any step
    with pytest.raises(ImportError, match=message):
        TensorBoardWriter(run_dir)
    assert not run_dir.exists()


def test_the_command_line_flag():
    def parse(*flags):
        return config_from_args(resolve_run_defaults(build_parser().parse_args(["train", "--out", "x", *flags])))

    assert parse().report_to == "none" and parse("--report-to", "tensorboard").report_to == "tensorboard"
    with pytest.raises(SystemExit):
        parse("--report-to", "wandb")  # argparse lists the choices

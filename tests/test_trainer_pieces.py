"""The pieces of the trainer's step that live beside their stage, each on a small exact example.

``GRPOTrainer`` calls them (``tests/test_golden.py`` checks the whole step bit for
bit); here each one is checked on its own: the minibatch order and the sampling
seeds (seeding.py), the data stream, the loss's normalisers for an update
(loss.py), the entropy control and its checkpoint form (objectives.py), the end
of an optimizer update (optim.py), the frozen reference (models.py), the
unscorable-reward warning (rewards.py) and the run's save, load and resume
(run/checkpoint.py, run/state.py).
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

from grpo_tutorial import GRPOConfig, GRPOTrainer
from grpo_tutorial.loss import LossOptions, update_normalisers
from grpo_tutorial.metrics import timed, watch_stages
from grpo_tutorial.models import frozen_reference
from grpo_tutorial.objectives import EntropyControl, adapt_entropy_coef
from grpo_tutorial.optim import SKIPPED, finish_update, make_optimizer
from grpo_tutorial.rewards import check_unscorable
from grpo_tutorial.run.checkpoint import load_training, resume_or_start, save_training
from grpo_tutorial.run.layout import find_checkpoint, read_meta
from grpo_tutorial.run.state import RunState, check_same_dataset
from grpo_tutorial.warn import GRPOWarning
from grpo_tutorial.seeding import (
    MINIBATCHES, RESAMPLING, SAMPLING, DataStream, derive_seed, minibatches, next_batch, sampling_seed, stream_generator,
    stream_seed,
)

# ---------------------------------------------------------------------------
# seeding.py
# ---------------------------------------------------------------------------


def test_minibatches_are_each_pass_s_shuffle_cut_into_updates():
    shuffle = stream_generator(3, MINIBATCHES, 7)
    first, second = torch.randperm(6, generator=shuffle), torch.randperm(6, generator=shuffle)
    got = list(minibatches(6, 4, 2, seed=3, step=7))
    assert [t.tolist() for t in got] == [first[:4].tolist(), first[4:].tolist(), second[:4].tolist(), second[4:].tolist()]
    assert sorted(torch.cat(got[:2]).tolist()) == list(range(6))  # every row once per pass
    assert not torch.equal(first, second)  # a new order every pass


def test_sampling_seed_is_the_sampling_stream_then_the_resampling_rounds():
    assert sampling_seed(5, 3) == sampling_seed(5, 3, 0) == stream_seed(5, SAMPLING, 3)
    assert sampling_seed(5, 3, 2) == derive_seed(5, RESAMPLING, 3, 2)
    assert len({sampling_seed(5, 3, r) for r in range(4)}) == 4


def test_the_data_stream_draws_what_next_batch_gives_and_keeps_the_position():
    data = list(range(5))
    stream = DataStream(data, 3, seed=1, epoch=0, index=2)
    rows, epoch, index = next_batch(data, 3, 1, 0, 2)
    assert stream.draw() == rows and (stream.epoch, stream.index) == (epoch, index) == (1, 0)
    rows, epoch, index = next_batch(data, 3, 1, epoch, index)
    assert stream.draw() == rows and (stream.epoch, stream.index) == (epoch, index) == (1, 3)


# ---------------------------------------------------------------------------
# loss.py, objectives.py, optim.py, metrics.py
# ---------------------------------------------------------------------------


def test_update_normalisers_count_the_update_s_tokens_less_the_truncated_ones():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    truncated = torch.tensor([False, True, False, False])
    rows = torch.tensor([1, 2, 3])  # an update of three completions, one micro-batch each
    plain = update_normalisers(LossOptions(), mask, truncated, rows, 1)
    assert plain["gradient_accumulation_steps"] == 3 and float(plain["num_items_in_batch"]) == 7.0
    masked = update_normalisers(LossOptions(mask_truncated_completions=True), mask, truncated, rows, 1)
    assert float(masked["num_items_in_batch"]) == 4.0  # row 1 (truncated) no longer counts
    assert update_normalisers(LossOptions(), mask, truncated, torch.arange(4), 2)["gradient_accumulation_steps"] == 2


def test_a_fixed_entropy_coefficient_never_moves():
    control = EntropyControl.from_config(GRPOConfig(entropy_coef=0.01))
    options = LossOptions(entropy_coef=0.01)
    assert control.loss_options(options) is options
    control.measured([{"entropy_sum": 1.0, "entropy_tokens": 10.0}])
    assert control.coef == 0.01 and math.isinf(control.last_entropy)
    assert control.to_meta() == {"coef": 0.01, "last_entropy": None}


def test_adaptive_entropy_control_gates_then_adapts_and_round_trips():
    config = GRPOConfig(use_adaptive_entropy=True, entropy_coef=0.05, entropy_target=0.5, entropy_coef_delta=0.02,
                        entropy_coef_max=0.2)
    control = EntropyControl.from_config(config)
    assert control.loss_options(config.loss_options()).entropy_coef == 0.0  # no entropy measured yet: no bonus
    control.measured([{"entropy_sum": 1.0, "entropy_tokens": 4.0}, {"entropy_sum": 0.5, "entropy_tokens": 2.0}])
    assert control.last_entropy == 1.5 / 6.0
    assert control.coef == adapt_entropy_coef(0.05, 0.25, target=0.5, delta=0.02, coef_min=0.0, coef_max=0.2)
    assert control.loss_options(config.loss_options()).entropy_coef == control.coef  # at or below the target
    back = EntropyControl.from_config(config, control.to_meta())
    assert (back.coef, back.last_entropy) == (control.coef, control.last_entropy)
    # a checkpoint from before the control was saved: start afresh
    assert EntropyControl.from_config(config, None) == EntropyControl.from_config(config)


def test_finish_update_steps_or_skips_with_the_reason():
    param = torch.nn.Parameter(torch.ones(3))
    optimizer, scheduler = make_optimizer([param], GRPOConfig(learning_rate=0.1))
    param.grad = torch.tensor([3.0, 0.0, 4.0])
    norm, skipped = finish_update([param], optimizer, scheduler, 1.0, loss=0.5)
    assert norm == 5.0 and skipped is None and param.grad is None and not torch.equal(param, torch.ones(3))

    before = param.detach().clone()
    param.grad = torch.tensor([1.0, 1.0, 1.0])
    norm, skipped = finish_update([param], optimizer, scheduler, 1.0, loss=math.nan)
    assert math.isnan(norm) and skipped == f"the loss is nan; {SKIPPED}" and param.grad is None
    param.grad = torch.tensor([math.inf, 0.0, 0.0])
    norm, skipped = finish_update([param], optimizer, scheduler, 1.0, loss=0.5)
    assert skipped == f"the gradient norm is inf; {SKIPPED}" and param.grad is None
    assert torch.equal(param, before)  # neither skipped update moved the weights


def test_timed_adds_the_block_s_seconds():
    seconds = {"forward_seconds": 1.0}
    with timed(seconds, "forward_seconds"):
        pass
    assert 1.0 <= seconds["forward_seconds"] < 2.0


def test_watch_stages_hears_each_stage_of_a_step_in_order_and_only_inside_the_block(tiny_policy):
    model, tokenizer = tiny_policy
    config = GRPOConfig(group_size=2, prompts_per_step=2, max_new_tokens=3, micro_batch_size=2, seed=0)
    trainer = GRPOTrainer(model, tokenizer, lambda completions, **kw: [len(c) % 2 * 1.0 for c in completions], config)
    batch = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "2+2=", "answer": "4"}]
    heard: list[str] = []
    with watch_stages(heard.append):
        trainer.train_step(batch)
    micro_batch = ["forward_seconds", "backward_seconds"]  # 4 completions, 2 at a time, one update
    # the stages by their names, in order, each piece (the reference's part of stage 4, the update's) before its stage
    assert heard == ["sample", "reward", "advantages", "reference_seconds", "score", *micro_batch, *micro_batch,
                     "optimizer_seconds", "update"]
    trainer.train_step(batch)
    assert len(heard) == 11  # the watcher is gone after the block
    with pytest.raises(TypeError, match="watcher must be a function"):
        with watch_stages("generate"):
            pass


# ---------------------------------------------------------------------------
# models.py, rewards.py
# ---------------------------------------------------------------------------


def test_frozen_reference_copies_or_takes_and_freezes(make_small_policy):
    policy, _ = make_small_policy(hidden_size=16, num_layers=1, intermediate_size=32)
    policy.train()
    ref = frozen_reference(policy)
    assert ref is not policy and not ref.training and not any(p.requires_grad for p in ref.parameters())
    assert all(p.requires_grad for p in policy.parameters()) and policy.training  # the policy is left as it was
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), policy.parameters()))
    given = copy.deepcopy(policy)
    assert frozen_reference(policy, given) is given and not given.training


def test_check_unscorable_warns_with_the_count():
    said = []
    check_unscorable(torch.tensor([1.0, 0.0, 0.5]), lambda kind, message: said.append((kind, message)))
    assert said == []
    check_unscorable(torch.tensor([1.0, math.nan, math.nan, 0.5]), lambda kind, message: said.append((kind, message)))
    assert [kind for kind, _ in said] == ["unscorable"] and said[0][1].startswith("2 of 4 completions could not be scored")


# ---------------------------------------------------------------------------
# run/state.py, run/checkpoint.py
# ---------------------------------------------------------------------------


def test_the_run_is_tied_to_one_dataset():
    state = RunState()
    state.use_dataset("abc", "nowhere")
    assert state.dataset_fingerprint == "abc"
    state.use_dataset("abc", "nowhere")
    with pytest.raises(ValueError, match="differs from the one the checkpoint in 'x' trained on"):
        state.use_dataset("def", "the checkpoint in 'x'")
    check_same_dataset("def", None, "anywhere")  # nothing known: anything goes


@pytest.fixture
def parts(make_small_policy):
    """``parts(seed, beta=0.0)``: a fresh model, its optimizer and schedule, and (if ``beta``) a frozen reference."""

    def make(seed: int, beta: float = 0.0):
        model, _ = make_small_policy(seed=seed, hidden_size=16, num_layers=1, intermediate_size=32)
        optimizer, scheduler = make_optimizer(list(model.parameters()), GRPOConfig(learning_rate=0.1))
        return model, optimizer, scheduler, (frozen_reference(model) if beta else None)

    return make


def test_save_then_load_training_restores_the_objects_and_warns_about_changes(tmp_path, parts):
    model, optimizer, scheduler, _ = parts(0)
    rows = [{"step": 1, "loss": 0.5}, {"step": 2, "loss": math.nan}]
    meta = {**RunState(step=2).to_meta(), "config": {"seed": 0, "log_every": 1}}
    path = save_training(tmp_path, model, optimizer, scheduler, None, meta=meta, history=rows)
    assert path == find_checkpoint(tmp_path) and read_meta(path)["step"] == 2
    assert (tmp_path / "history.jsonl").read_text().count("\n") == 2

    other, other_opt, other_sched, ref = parts(1, beta=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_training(tmp_path, other, other_opt, other_sched, ref, config={"seed": 1, "log_every": 5},
                               defaults={"seed": 0, "log_every": 1})
    assert loaded["step"] == 2
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
    messages = [str(w.message) for w in caught if issubclass(w.category, GRPOWarning)]
    assert len(messages) == 2
    assert "different config (seed: 0 -> 1)" in messages[0]  # log_every may change: not reported
    assert "holds no reference model" in messages[1]
    assert load_training(tmp_path / "empty", other, other_opt, other_sched, None, config={}, defaults={}) is None


class _Writer:
    def __init__(self, output_dir):
        self.output_dir, self.synced = output_dir, 0

    def sync(self):
        self.synced += 1


def test_save_training_syncs_the_writers_appending_there_instead_of_rewriting(tmp_path, parts):
    model, optimizer, scheduler, _ = parts(0)
    (tmp_path / "history.jsonl").write_text("kept\n")
    writers = (_Writer(tmp_path), _Writer(tmp_path))
    save_training(tmp_path, model, optimizer, scheduler, None, meta=RunState().to_meta(), history=[], appending=writers)
    assert [w.synced for w in writers] == [1, 1] and (tmp_path / "history.jsonl").read_text() == "kept\n"
    elsewhere = tmp_path / "other"
    save_training(elsewhere, model, optimizer, scheduler, None, meta=RunState().to_meta(), history=[{"step": 1}],
                  appending=writers)
    assert [w.synced for w in writers] == [1, 1] and (elsewhere / "history.jsonl").read_text() == '{"step": 1}\n'


def test_resume_or_start(tmp_path, parts):
    loads = []

    def load(directory):
        loads.append(directory)
        return find_checkpoint(directory) is not None

    with pytest.raises(ValueError, match="needs GRPOConfig.output_dir"):
        resume_or_start(None, "abc", resume=True, fresh=True, load=load)
    with pytest.warns(GRPOWarning, match="no checkpoint in .*starting from step 0"):
        resume_or_start(str(tmp_path), "abc", resume=True, fresh=True, load=load)
    resume_or_start(None, "abc", resume=False, fresh=True, load=load)  # nothing to say, nothing loaded
    assert loads == [str(tmp_path)]

    model, optimizer, scheduler, _ = parts(0)
    meta = {**RunState(step=1, dataset_fingerprint="abc").to_meta(), "config": {}}
    save_training(tmp_path, model, optimizer, scheduler, None, meta=meta, history=[{"step": 1}])
    with pytest.raises(ValueError, match="dataset differs"):
        resume_or_start(str(tmp_path), "def", resume=True, fresh=True, load=load)
    assert loads == [str(tmp_path)]  # refused before loading anything
    resume_or_start(str(tmp_path), "abc", resume=True, fresh=True, load=load)
    assert loads == [str(tmp_path)] * 2
    with pytest.warns(GRPOWarning, match="already holds a checkpoint"):
        resume_or_start(str(tmp_path), "abc", resume=False, fresh=True, load=load)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resume_or_start(str(tmp_path), "abc", resume=False, fresh=False, load=load)  # a trainer mid-run: no warning

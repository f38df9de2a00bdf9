"""The trainer: what a step changes, old/reference log-probs, determinism, resume, guards."""

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import grpo_tutorial.step as step_module
from grpo_tutorial.tasks import make_arithmetic_dataset
from grpo_tutorial.trainer import (
    TIMING_KEYS,
    GRPOConfig,
    GRPOTrainer,
    GRPOWarning,
    find_checkpoint,
    read_history,
)
import grpo_tutorial.sampling.base as sampling_base
from grpo_tutorial.sampling import FunctionSampler
from grpo_tutorial.seeding import derive_seed, epoch_permutation

from conftest import SMALL_SHAPE
from helpers import length_reward, small_config, small_model


def data(n=16, seed=0):
    return make_arithmetic_dataset(n, seed, digits=1)


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def same_params(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def comparable(history):
    """History rows as JSON without the wall-clock fields (NaN == NaN as text)."""
    return [json.dumps({k: v for k, v in row.items() if k not in TIMING_KEYS}, sort_keys=True) for row in history]


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        return fn(*args, **kwargs)


# ---------------------------------------------------------------------------
# GRPOConfig validation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("group_size", 1, "group_size must be an int >= 2"),
        ("prompts_per_step", 0, "prompts_per_step"),
        ("max_new_tokens", 0, "max_new_tokens"),
        ("clip_eps", 0.0, r"clip_eps must be a number in \(0, 1\)"),
        ("clip_eps", 1.0, "clip_eps"),
        ("clip_eps_high", 1.5, "clip_eps_high"),
        ("beta", -0.1, "beta must be a number >= 0"),
        ("learning_rate", 0.0, "learning_rate must be a positive number"),
        ("learning_rate", -1e-4, "learning_rate"),
        ("temperature", 0.0, "temperature"),
        ("top_p", 0.0, "top_p"),
        ("loss_type", "ppo", r"loss_type must be one of \['grpo', 'bnpo', 'dapo', 'dr_grpo', 'cispo', 'sapo', 'luspo', 'vespo'\]"),
        ("scale_rewards", True, "scale_rewards"),
        ("scale_rewards", "std", "scale_rewards"),
        ("std", "unbiased", "std"),
        ("kl_kind", "k4", "kl_kind"),
        ("num_iterations", 0, "num_iterations"),
        ("max_grad_norm", 0.0, "max_grad_norm"),
        ("ref_sync_every", 0, "ref_sync_every"),
        ("seed", -1, "seed"),
        ("checkpoint_every", -1, "checkpoint_every"),
        ("reward_weights", [1.0, "a"], "reward_weights"),
    ],
)
def test_config_rejects_bad_values(field, value, match):
    with pytest.raises(ValueError, match=match) as info:
        GRPOConfig(**{field: value})
    assert f"GRPOConfig.{field}" in str(info.value) and repr(value) in str(info.value)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("group_size", 2.0, "group_size must be an int >= 2"),
        ("use_chat_template", "yes", "use_chat_template"),
    ],
)
def test_config_rejects_values_of_the_wrong_type_with_type_error(field, value, match):
    with pytest.raises(TypeError, match=match) as info:
        GRPOConfig(**{field: value})
    assert f"GRPOConfig.{field}" in str(info.value) and repr(value) in str(info.value)
    assert f"(type {type(value).__name__})" in str(info.value)


def test_config_minibatch_must_divide_the_batch():
    with pytest.raises(ValueError, match=r"minibatch_size must be a divisor of .* = 4\*3 = 12, got 5"):
        GRPOConfig(prompts_per_step=4, group_size=3, minibatch_size=5)
    cfg = GRPOConfig(prompts_per_step=4, group_size=3, minibatch_size=6, num_iterations=2)
    assert cfg.batch_completions == 12 and cfg.updates_per_step == 4


def test_trainer_rejects_bad_arguments(small_policy):
    model, tok = small_policy
    with pytest.raises(ValueError, match="reward_weights has 2 entries but there are 1 reward functions"):
        GRPOTrainer(model, tok, [length_reward], small_config(reward_weights=[1.0, 2.0]))
    with pytest.raises(TypeError, match="reward_fns"):
        GRPOTrainer(model, tok, "length", small_config())
    with pytest.raises(TypeError, match="config must be a GRPOConfig"):
        GRPOTrainer(model, tok, length_reward, {"group_size": 4})
    trainer = GRPOTrainer(model, tok, length_reward, small_config())
    with pytest.raises(ValueError, match="steps must be a positive int, got 0"):
        trainer.train(data(), 0, progress=False)
    with pytest.raises(ValueError, match="dataset is empty"):
        trainer.train([], 2, progress=False)
    with pytest.raises(ValueError, match="missing the key 'answer'"):
        trainer.train([{"prompt": "1+2="}], 2, progress=False)
    with pytest.raises(ValueError, match="needs GRPOConfig.output_dir"):
        trainer.train(data(), 2, resume=True, progress=False)


# ---------------------------------------------------------------------------
# What one step does
# ---------------------------------------------------------------------------


def test_equal_rewards_leave_parameters_exactly_unchanged(small_policy):
    model, tok = small_policy
    before = snapshot(model)
    trainer = GRPOTrainer(model, tok, constant_reward, small_config(beta=0.0, weight_decay=0.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        row = trainer.train_step(data()[:2])
    assert row["frac_zero_std"] == 1.0 and row["reward_std"] == 0.0
    # one step of all-equal groups is not yet a fault: the doctor asks for enough groups (tests/test_failure_warnings.py)
    assert not any("zero_variance" in str(w.message) for w in caught)
    assert row["loss"] == 0.0
    assert same_params(before, snapshot(model))


def test_varied_rewards_change_parameters(small_policy):
    model, tok = small_policy
    before = snapshot(model)
    trainer = GRPOTrainer(model, tok, length_reward, small_config())
    row = quiet(trainer.train_step, data()[:2])
    assert row["reward_std"] > 0 and row["frac_zero_std"] < 1.0
    assert row["grad_norm"] > 0
    assert not same_params(before, snapshot(model))


def test_history_row_fields_are_plain_json_numbers(small_policy):
    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, length_reward, small_config())
    row = quiet(trainer.train_step, data()[:2])
    expected = {
        "step", "reward_mean", "reward_std", "reward/length_reward", "accuracy", "kl",
        "clip_frac_low", "clip_frac_high", "clip_frac", "ratio_mean", "ratio_max", "entropy",
        "completion_len_mean", "completion_len_max", "frac_zero_std", "frac_truncated",
        "grad_norm", "loss", "lr", "step_seconds", "tokens_per_s", "skipped_updates",
    }
    assert expected <= set(row)
    assert all(type(v) in (int, float) for v in row.values())
    assert json.loads(json.dumps(row)).keys() == row.keys()
    assert row["step"] == 1 and trainer.step == 1 and trainer.history == [row]
    assert math.isnan(row["kl"])  # beta = 0: no reference model, KL not measured
    assert 1.0 <= row["completion_len_mean"] <= row["completion_len_max"] <= 3.0
    assert row["reward_mean"] == pytest.approx(row["reward/length_reward"])
    assert row["entropy"] > 0 and row["lr"] == 1e-4


def test_accuracy_counts_correct_completions(monkeypatch, small_policy):
    model, tok = small_policy
    rows = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "2+2=", "answer": "4"}]
    scripted = ["3", "3", "03", "x", "4", "5", "44", "4"]

    def fake_rollout(*args, **kwargs):
        from grpo_tutorial.rollout import generate_rollouts

        r = generate_rollouts(*args, **kwargs)
        r.completions = list(scripted)
        return r

    monkeypatch.setattr(sampling_base, "generate_rollouts", fake_rollout)
    trainer = GRPOTrainer(model, tok, step_module.compute_rewards.__globals__["correctness_reward"], small_config())
    row = quiet(trainer.train_step, rows)
    # prompt 0: "3","3","03" match 3; prompt 1: "4","4" match 4 -> 5 of 8
    assert row["accuracy"] == 5 / 8
    assert row["reward_mean"] == 5 / 8
    assert row["frac_zero_std"] == 0.0


def test_custom_accuracy_fn_sees_columns_and_defines_accuracy(small_policy):
    seen = {}

    def first_of_each_group(completions, answer, numbers, **kwargs):
        seen["numbers"] = numbers
        return [1.0 if i % 4 == 0 else 0.0 for i in range(len(completions))]

    model, tok = small_policy
    rows = [{"prompt": "1+2=", "answer": "3", "numbers": [1, 2]}, {"prompt": "2+2=", "answer": "4", "numbers": [2, 2]}]
    trainer = GRPOTrainer(model, tok, length_reward, small_config(), accuracy_fn=first_of_each_group)
    row = quiet(trainer.train_step, rows)
    assert row["accuracy"] == 0.25
    assert seen["numbers"] == [[1, 2]] * 4 + [[2, 2]] * 4  # extra dataset columns, one per completion
    assert trainer.evaluate(rows * 4, batch_size=4)["accuracy"] == 0.25  # rows 0 and 4 of 8, per batch
    with pytest.raises(TypeError, match="accuracy_fn must be None or a function"):
        GRPOTrainer(model, tok, length_reward, small_config(), accuracy_fn="exact")


def test_mu_2_second_pass_uses_the_stored_old_logprobs(monkeypatch, small_policy):
    calls = []
    real = step_module.grpo_loss

    def spy(logp, old_logp, advantages, mask, **kwargs):
        calls.append({"logp": logp.detach().clone(), "old": old_logp.clone(), "ratio": torch.exp(logp.detach() - old_logp)})
        return real(logp, old_logp, advantages, mask, **kwargs)

    monkeypatch.setattr(step_module, "grpo_loss", spy)
    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, length_reward, small_config(num_iterations=2, learning_rate=1e-2))
    quiet(trainer.train_step, data()[:2])
    assert len(calls) == 2
    first, second = calls
    # pass 1: the policy has not moved, so the ratio is 1 everywhere
    assert torch.allclose(first["ratio"], torch.ones_like(first["ratio"]), atol=1e-5)
    # pass 2: same stored old log-probs (up to the shuffle), new policy -> ratio != 1
    assert torch.equal(torch.sort(first["old"].flatten()).values, torch.sort(second["old"].flatten()).values)
    assert (second["ratio"] - 1).abs().max() > 1e-3


def test_minibatches_make_mu_times_n_over_m_updates(monkeypatch, small_policy):
    seen = []
    real = step_module.grpo_loss

    def spy(logp, *args, **kwargs):
        seen.append(logp.shape[0])
        return real(logp, *args, **kwargs)

    monkeypatch.setattr(step_module, "grpo_loss", spy)
    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, length_reward, small_config(num_iterations=2, minibatch_size=4))
    quiet(trainer.train_step, data()[:2])
    assert seen == [4, 4, 4, 4]  # 2 passes x 8 completions / 4
    state = trainer.optimizer.state_dict()["state"]
    assert all(int(s["step"]) == 4 for s in state.values())


def test_frozen_reference_stays_frozen_and_syncs(small_policy):
    model, tok = small_policy
    initial = snapshot(model)
    trainer = GRPOTrainer(model, tok, length_reward, small_config(beta=0.1, ref_sync_every=2, learning_rate=1e-2))
    ref = trainer.ref_model
    assert ref is not None and ref is not model
    assert all(not p.requires_grad for p in ref.parameters()) and not ref.training
    row = quiet(trainer.train_step, data()[:2])
    assert same_params(initial, snapshot(ref))  # the reference did not move
    assert not same_params(initial, snapshot(model))  # the policy did
    assert row["kl"] >= 0.0 and not math.isnan(row["kl"])
    quiet(trainer.train_step, data()[2:4])  # step 2: sync
    assert same_params(snapshot(model), snapshot(ref))
    assert all(not p.requires_grad for p in ref.parameters())
    quiet(trainer.train_step, data()[4:6])  # step 3: policy moves on, reference stays
    assert not same_params(snapshot(model), snapshot(ref))


def test_no_reference_model_when_beta_is_zero(make_small_policy):
    model, tok = make_small_policy()
    other, _ = make_small_policy(seed=1)
    assert GRPOTrainer(model, tok, length_reward, small_config(beta=0.0), ref_model=other).ref_model is None
    given = GRPOTrainer(model, tok, length_reward, small_config(beta=0.05), ref_model=other)
    assert given.ref_model is other and not any(p.requires_grad for p in other.parameters())
    with pytest.raises(ValueError, match="ref_model is the policy itself"):
        GRPOTrainer(model, tok, length_reward, small_config(beta=0.05), ref_model=model)
    assert all(p.requires_grad for p in model.parameters())  # the policy was not frozen


def test_generate_called_once_per_step(monkeypatch, small_policy):
    model, tok = small_policy
    rows = []
    real = model.generate

    def wrapper(*args, **kwargs):
        rows.append(kwargs["input_ids"].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "generate", wrapper)
    trainer = GRPOTrainer(model, tok, length_reward, small_config(prompts_per_step=3, group_size=4))
    quiet(trainer.train, data(), 3, progress=False)
    assert rows == [12, 12, 12]


def test_data_order_is_a_seeded_permutation_per_epoch(small_policy):
    seen = []

    def record(completions, prompts, **kwargs):
        seen.extend(prompts[::4])  # one entry per group
        return [float(len(c)) for c in completions]

    ds = data(n=6)
    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, record, small_config(prompts_per_step=4))
    quiet(trainer.train, ds, 3, progress=False)  # 12 prompts = 2 epochs of 6
    prompts = [row["prompt"] for row in ds]
    assert seen[:6] == [prompts[i] for i in epoch_permutation(6, 0, 0)]
    assert seen[6:] == [prompts[i] for i in epoch_permutation(6, 0, 1)]
    assert sorted(seen[:6]) == sorted(prompts) and sorted(seen[6:]) == sorted(prompts)
    assert epoch_permutation(6, 0, 0) != epoch_permutation(6, 0, 1)  # reshuffled each epoch
    assert derive_seed(0, 5) == derive_seed(0, 5) != derive_seed(0, 6)


# ---------------------------------------------------------------------------
# Warnings and numerical guards
# ---------------------------------------------------------------------------


def test_non_finite_loss_skips_the_update_counts_and_warns_once(monkeypatch, small_policy):
    real = step_module.grpo_loss
    bad_steps = {2, 3}
    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, length_reward, small_config())

    def poisoned(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        return (loss * float("nan") if trainer.step + 1 in bad_steps else loss), stats

    monkeypatch.setattr(step_module, "grpo_loss", poisoned)
    ds = data()
    quiet(trainer.train_step, ds[0:2])
    after_1 = snapshot(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        row2 = trainer.train_step(ds[2:4])
        row3 = trainer.train_step(ds[4:6])
    skipped = [w for w in caught if "skipped this optimizer update" in str(w.message)]
    assert len(skipped) == 1 and issubclass(skipped[0].category, GRPOWarning)
    assert same_params(after_1, snapshot(model))  # neither poisoned step moved the weights
    assert (row2["skipped_updates"], row3["skipped_updates"]) == (1.0, 2.0)
    assert math.isnan(row2["loss"])
    row4 = quiet(trainer.train_step, ds[6:8])  # training continues
    assert row4["skipped_updates"] == 2.0 and math.isfinite(row4["loss"])
    assert not same_params(after_1, snapshot(model))


def test_non_finite_gradient_skips_the_update(monkeypatch, small_policy):
    real = step_module.grpo_loss

    def inf_gradient(logp, *args, **kwargs):
        loss, stats = real(logp, *args, **kwargs)
        return loss + torch.sqrt((logp * 0).sum()), stats  # value unchanged, d sqrt(x)/dx = inf at 0

    monkeypatch.setattr(step_module, "grpo_loss", inf_gradient)
    model, tok = small_policy
    before = snapshot(model)
    trainer = GRPOTrainer(model, tok, length_reward, small_config())
    with pytest.warns(GRPOWarning, match="gradient norm is nan"):
        row = trainer.train_step(data()[:2])
    assert math.isfinite(row["loss"]) and math.isnan(row["grad_norm"])
    assert row["skipped_updates"] == 1.0
    assert same_params(before, snapshot(model))
    assert all(p.grad is None for p in model.parameters())


def test_truncation_warns_once_and_a_sparse_start_does_not(small_policy):
    """The doctor's live warnings (chapter 18): truncation once per run though both steps qualify; 7 of 8 groups
    all-equal in the first steps is how a hard task starts (chapter 16's healthy run began at 88%): no warning."""
    model, tok = small_policy
    ds = data(n=8)
    special = ds[0]["prompt"]

    def one_group_varies(completions, prompts, **kwargs):
        positions = [i for i, p in enumerate(prompts) if p == special]
        return [float(positions.index(i)) if i in positions else 0.0 for i in range(len(prompts))]

    trainer = GRPOTrainer(model, tok, one_group_varies, small_config(prompts_per_step=8, max_new_tokens=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        row = trainer.train_step(ds)
        trainer.train_step(ds)
    messages = [str(w.message) for w in caught]
    assert row["frac_zero_std"] == 7 / 8 and row["frac_truncated"] > 0.5
    assert not any("zero_variance" in m for m in messages), messages
    # this reward pays cut completions (it reads positions, not answers): the budget costs nothing, a note only
    assert not any("truncation" in m for m in messages), messages
    trainer = GRPOTrainer(model, tok, constant_reward, small_config(prompts_per_step=8, max_new_tokens=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(6):  # 8 groups a step, none mixed: found at step 3 (bound 0.117 < 1/8), said at step 5
            trainer.train_step(ds)
    messages = [str(w.message) for w in caught]
    assert sum("truncation (fault)" in m and "raise max_new_tokens" in m for m in messages) == 1, messages
    assert [m[:34] for m in messages if "zero_variance_too_hard (fault)" in m] == [
        "step 5: zero_variance_too_hard (fa"], messages  # every group all-equal, said once


def test_unscorable_completions_are_left_out_of_the_baseline(monkeypatch, small_policy):
    used = []
    real_loss = step_module.grpo_loss

    def spy_loss(logp, old, advantages, *args, **kwargs):
        used.append(advantages.clone())
        return real_loss(logp, old, advantages, *args, **kwargs)

    monkeypatch.setattr(step_module, "grpo_loss", spy_loss)

    def sometimes_none(completions, **kwargs):
        return [None if i % 4 == 0 else float(i) for i in range(len(completions))]

    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, sometimes_none, small_config(num_iterations=1))
    with pytest.warns(GRPOWarning, match="2 of 8 completions could not be scored"):
        row = trainer.train_step(data()[:2])
    # groups [None, 1, 2, 3] and [None, 5, 6, 7]: mean 2 (6) and std 1 over the scorable three
    a = 1 / (1 + 1e-4)
    expected = torch.tensor([0.0, -a, 0.0, a, 0.0, -a, 0.0, a])
    assert torch.allclose(torch.sort(used[0]).values, torch.sort(expected).values, atol=1e-7)  # rows are shuffled
    assert row["reward_mean"] == 4.0  # the mean of 1, 2, 3, 5, 6, 7
    assert row["frac_zero_std"] == 0.0


# ---------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------


def test_evaluate_is_greedy_batched_and_side_effect_free(small_policy):
    from grpo_tutorial.rewards import correctness_reward
    from grpo_tutorial.rollout import generate_rollouts

    model, tok = small_policy
    ds = data(n=10)
    trainer = GRPOTrainer(model, tok, correctness_reward, small_config())
    model.train()
    rng = torch.get_rng_state()
    result = trainer.evaluate(ds, batch_size=4, num_samples=2)
    assert model.training is True
    assert torch.equal(torch.get_rng_state(), rng)
    greedy = generate_rollouts(model, tok, [r["prompt"] for r in ds], group_size=1, max_new_tokens=3, do_sample=False)
    expected = sum(c.strip() == r["answer"] for c, r in zip(greedy.completions, ds)) / len(ds)
    assert result["n"] == 10 and result["accuracy"] == expected
    assert result["completion_len_mean"] == pytest.approx(float(greedy.completion_lengths.mean()))
    assert result["samples"] == [
        {"prompt": r["prompt"], "completion": c, "answer": r["answer"]} for r, c in zip(ds[:2], greedy.completions)
    ]
    assert trainer.evaluate(ds, batch_size=3)["accuracy"] == result["accuracy"]  # batching does not matter


# ---------------------------------------------------------------------------
# Determinism, checkpoints, resume, Ctrl-C
# ---------------------------------------------------------------------------


def run(steps, out=None, resume=False, seed=0, **cfg):
    model, tok = small_model(seed=seed)
    trainer = GRPOTrainer(model, tok, length_reward, small_config(seed=seed, output_dir=out, **cfg))
    history = quiet(trainer.train, data(), steps, resume=resume, progress=False)
    return trainer, history


def test_same_seed_same_history_in_process():
    _, a = run(3, beta=0.05)
    _, b = run(3, beta=0.05)
    _, c = run(3, seed=1, beta=0.05)
    assert comparable(a) == comparable(b)
    assert comparable(a) != comparable(c)


SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    import torch
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from grpo_tutorial.models import build_tiny_policy
    from grpo_tutorial.tasks import make_arithmetic_dataset
    from grpo_tutorial.trainer import GRPOConfig, GRPOTrainer, TIMING_KEYS

    def length_reward(completions, **kwargs):
        return [float(len(c)) for c in completions]

    model, tok = build_tiny_policy(**SMALL_SHAPE, seed=0)
    cfg = GRPOConfig(group_size=4, prompts_per_step=2, max_new_tokens=3, beta=0.05, num_iterations=2)
    history = GRPOTrainer(model, tok, length_reward, cfg).train(
        make_arithmetic_dataset(16, 0, digits=1), 3, progress=False)
    print(json.dumps([{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in history], sort_keys=True))
    """
)


@pytest.mark.slow
def test_same_seed_same_history_across_processes(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(f"SMALL_SHAPE = {SMALL_SHAPE!r}\n{SCRIPT}")
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="random")
    procs = [  # two independent processes, run side by side
        subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        outputs.append(out.strip().splitlines()[-1])
    assert outputs[0] == outputs[1]
    rows = json.loads(outputs[0])
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["reward_std"] > 0


def test_resume_continues_from_the_checkpoint_step(tmp_path, small_policy):
    _, full = run(6, num_iterations=2, beta=0.05)
    out = str(tmp_path / "run")
    first, _ = run(4, out=out, num_iterations=2, beta=0.05, checkpoint_every=2)
    assert find_checkpoint(out) == tmp_path / "run" / "checkpoint"
    meta = json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())
    assert meta["step"] == 4 and "history" not in meta  # the history lives in history.jsonl only
    # simulate a kill after step 5 was logged but before it was checkpointed,
    # with a half-written checkpoint left behind
    with open(tmp_path / "run" / "history.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 5, "reward_mean": -1.0}) + "\n" + '{"step": 6, "rew')
    (tmp_path / "run" / "checkpoint.tmp").mkdir()
    (tmp_path / "run" / "checkpoint.tmp" / "state.pt").write_bytes(b"garbage")

    steps_run = []

    model, tok = small_policy
    resumed = GRPOTrainer(model, tok, length_reward,
                          small_config(output_dir=out, num_iterations=2, beta=0.05, checkpoint_every=2))
    real_step = resumed.train_step

    def counting(batch):
        steps_run.append(resumed.step + 1)
        return real_step(batch)

    resumed.train_step = counting
    history = quiet(resumed.train, data(), 6, resume=True, progress=False)
    assert steps_run == [5, 6]  # continued from the checkpoint, nothing redone before it
    assert comparable(history) == comparable(full)
    on_disk = read_history(out)
    assert [r["step"] for r in on_disk] == [1, 2, 3, 4, 5, 6]
    assert comparable(on_disk) == comparable(full)
    assert not (tmp_path / "run" / "checkpoint.tmp").exists()


def test_resume_after_a_kill_between_the_two_renames(tmp_path, monkeypatch, small_policy):
    out = tmp_path / "run"
    _, full = run(4, beta=0.05)
    run(2, out=str(out), beta=0.05, checkpoint_every=2)

    # the next save dies right after moving the old checkpoint aside
    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, length_reward, small_config(output_dir=str(out), beta=0.05, checkpoint_every=2))
    quiet(trainer.train, data(), 2, resume=True, progress=False)
    quiet(trainer.train_step, data()[:2])
    real_replace = os.replace

    def dying_replace(src, dst):
        if str(src).endswith("checkpoint.tmp"):
            raise OSError("simulated kill")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", dying_replace)
    with pytest.raises(OSError, match="simulated kill"):
        trainer.save_checkpoint()
    monkeypatch.setattr(os, "replace", real_replace)
    assert not (out / "checkpoint").exists()
    assert find_checkpoint(out) == out / "checkpoint.old"

    _, history = run(4, out=str(out), resume=True, beta=0.05, checkpoint_every=2)
    assert comparable(history) == comparable(full)
    assert (out / "checkpoint").exists() and not (out / "checkpoint.old").exists()


def test_a_fresh_run_warns_before_replacing_a_checkpoint(tmp_path, small_policy):
    out = str(tmp_path / "run")
    run(2, out=out, checkpoint_every=2)
    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, length_reward, small_config(output_dir=out))
    with pytest.warns(GRPOWarning, match="already holds a checkpoint; starting a new run"):
        trainer.train(data(), 1, progress=False)
    assert len(read_history(out)) == 1  # the new run's history replaced the old one


def test_resume_refuses_a_different_dataset(tmp_path, small_policy):
    out = str(tmp_path / "run")
    run(2, out=out, checkpoint_every=2)
    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, length_reward, small_config(output_dir=out))
    before = snapshot(model)
    with pytest.raises(ValueError, match="the dataset differs"):
        trainer.train(data(seed=5), 4, resume=True, progress=False)
    assert trainer.step == 0 and same_params(before, snapshot(model))  # nothing was loaded


def test_train_accepts_a_hugging_face_dataset(small_policy):
    datasets = pytest.importorskip("datasets")
    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, length_reward, small_config())
    history = quiet(trainer.train, datasets.Dataset.from_list(data()), 1, progress=False)
    assert [row["step"] for row in history] == [1]


def test_resume_without_a_checkpoint_starts_fresh(tmp_path, make_small_policy):
    out = str(tmp_path / "run")
    _, full = run(2)
    with pytest.warns(GRPOWarning, match="no checkpoint"):
        model, tok = make_small_policy()
        trainer = GRPOTrainer(model, tok, length_reward, small_config(output_dir=out))
        history = trainer.train(data(), 2, resume=True, progress=False)
    assert comparable(history) == comparable(full)


def test_ctrl_c_finishes_the_step_saves_and_raises(tmp_path, small_policy):
    out = str(tmp_path / "run")
    _, full = run(4)

    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, length_reward, small_config(output_dir=out))

    def interrupting(completions, **kwargs):
        if trainer.step == 1:  # during step 2
            os.kill(os.getpid(), signal.SIGINT)
        return length_reward(completions)

    interrupting.__name__ = "length_reward"
    trainer.reward_fns = [interrupting]
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt, match="interrupted after step 2; checkpoint saved"):
        quiet(trainer.train, data(), 4, progress=False)
    assert signal.getsignal(signal.SIGINT) is handler  # our handler is removed again
    assert trainer.step == 2
    assert json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())["step"] == 2
    _, history = run(4, out=out, resume=True)
    assert comparable(history) == comparable(full)


def test_sixteen_bit_weights_warn_that_updates_may_vanish(make_small_policy):
    model, tok = make_small_policy()
    with pytest.warns(GRPOWarning, match="16-bit weights"):
        GRPOTrainer(model.to(torch.bfloat16), tok, length_reward, small_config())
    model, tok = make_small_policy()
    with warnings.catch_warnings():
        warnings.simplefilter("error", GRPOWarning)
        GRPOTrainer(model, tok, length_reward, small_config())  # float32: no warning


def test_logged_entropy_averages_only_the_rows_the_step_scored(monkeypatch, small_policy):
    """On-policy, the entropy comes from the gradient pass, micro-batch by micro-batch. A non-finite loss
    ends that pass early (the update is skipped); the rows it never reached must not count as entropy 0."""
    import copy

    from grpo_tutorial.logprobs import completion_logprobs
    from grpo_tutorial.rollout import generate_rollouts
    from grpo_tutorial.seeding import MINIBATCHES, SAMPLING, stream_generator, stream_seed

    cfg = small_config(micro_batch_size=4)  # 8 completions: two micro-batches, one update (on-policy)
    batch = data()[:2]
    model, tok = small_policy
    start = copy.deepcopy(model.state_dict())
    real = step_module.grpo_loss
    calls = []

    def nan_on_the_first_micro_batch(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        calls.append(1)
        return loss * float("nan"), stats

    monkeypatch.setattr(step_module, "grpo_loss", nan_on_the_first_micro_batch)
    trainer = GRPOTrainer(model, tok, length_reward, cfg)
    with pytest.warns(GRPOWarning, match="skipped this optimizer update"):
        row = trainer.train_step(batch)
    assert len(calls) == 1  # the second micro-batch was never scored

    # the same rollout, scored here: the entropy of the first micro-batch's rows only
    model.load_state_dict(start)  # unchanged anyway: the update was skipped
    rollout = generate_rollouts(
        model, tok, [r["prompt"] for r in batch], group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
        do_sample=True, generator_seed=stream_seed(cfg.seed, SAMPLING, 0), onednn=cfg.onednn_generation,
    )
    reached = torch.randperm(len(rollout), generator=stream_generator(cfg.seed, MINIBATCHES, 0))[:4]
    with torch.no_grad():
        _, entropy = completion_logprobs(
            model.eval(), rollout.input_ids[reached], rollout.attention_mask[reached],
            rollout.completion_ids.shape[1], return_entropy=True,
        )
    mask = rollout.completion_mask[reached]
    expected = float((entropy * mask).sum() / mask.sum())
    assert row["entropy"] == pytest.approx(expected, rel=1e-5)
    assert math.isfinite(row["entropy"]) and row["entropy"] > 0


# ---------------------------------------------------------------------------
# Extension points (grpo_tutorial.step): the policies, the sampler, the row listeners
# ---------------------------------------------------------------------------


def test_a_policies_subclass_supplies_the_reference_without_a_copy(small_policy):
    """What LoRA needs: the reference is the policy with something switched off, entered once per scoring pass."""
    from grpo_tutorial.run.state import RunState
    from grpo_tutorial.step import GRPOStep, Policies

    class PolicyAsReference(Policies):
        entered = 0

        @contextlib.contextmanager
        def reference(self):
            PolicyAsReference.entered += 1
            yield self.policy  # a LoRA model would yield the policy with its adapters off

    model, tok = small_policy
    step = GRPOStep(model, tok, length_reward, small_config(beta=0.1, ref_sync_every=1),
                    policies=PolicyAsReference(model))  # no reference model: no copy is made
    assert step.policies.reference_model is None
    row = quiet(step, data()[:2], RunState(), [])
    assert PolicyAsReference.entered == 1  # once per scoring pass of the reference
    assert row["kl"] == pytest.approx(0.0, abs=1e-6)  # before its update, the policy is its own reference


def test_a_sampler_writes_the_completions_and_row_listeners_get_every_row(tmp_path, make_small_policy):
    model, tok = make_small_policy()
    trainer = GRPOTrainer(model, tok, length_reward, small_config(output_dir=str(tmp_path)))
    calls, rows = [], []
    real = trainer.grpo_step.sampler  # the policy itself
    trainer.grpo_step.sampler = lambda prompts, seed: calls.append(seed) or real(prompts, seed)
    trainer.row_listeners.append(rows.append)
    history = quiet(trainer.train, data(), 3, progress=False)
    assert len(calls) == 3 and len(set(calls)) == 3  # one rollout a step, each with its own seed
    assert rows == history and len(rows) == 3
    assert [json.loads(line)["step"] for line in (tmp_path / "history.jsonl").read_text().splitlines()] == [1, 2, 3]
    mine = lambda p, s: real(p, s)  # noqa: E731
    trainer = GRPOTrainer(make_small_policy()[0], tok, length_reward, small_config(), sampler=mine)
    assert isinstance(trainer.grpo_step.sampler, FunctionSampler) and trainer.grpo_step.sampler.fn is mine
    with pytest.raises(TypeError, match="sampler must be None or a function"):
        GRPOTrainer(make_small_policy()[0], tok, length_reward, small_config(), sampler="vllm")

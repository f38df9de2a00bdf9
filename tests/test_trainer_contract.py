"""What building and running a trainer may and may not do (issue 16).

* Building a trainer touches no global RNG: all randomness comes from named seed
  streams (grpo_tutorial.seeding).
* Dropout: the policy is scored the same way in the old-policy pass and the
  gradient pass, so the first-pass ratio is exactly 1 even for a model with dropout.
* Evaluation is a free function; it returns one record per row.
* SFTConfig and GRPOConfig share one set of validators.
* A checkpoint's size does not grow with the number of steps taken.
"""

from __future__ import annotations

import json
import random
import warnings

import numpy as np
import pytest
import torch

from grpo_tutorial import GRPOConfig, GRPOTrainer, evaluate_policy, make_arithmetic_dataset
from grpo_tutorial.doctor import CAUSE_ORDER
from grpo_tutorial.rewards import correctness_reward, partial_credit_reward
from grpo_tutorial.sft import SFTConfig
from helpers import tiny_model


def _data(n=32):
    return make_arithmetic_dataset(n, seed=1, digits=1)


def _global_states():
    return torch.get_rng_state().clone(), random.getstate(), np.random.get_state()[1].copy()


def test_building_and_evaluating_leave_the_global_rngs_alone(make_tiny_policy):
    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    before = _global_states()
    model, tok = make_tiny_policy(seed=0)  # built here: building is part of what must leave them alone
    trainer = GRPOTrainer(model, tok, correctness_reward, GRPOConfig(seed=7, beta=0.1))
    trainer.evaluate(_data(8))
    evaluate_policy(model, tok, _data(8))
    after = _global_states()
    assert torch.equal(before[0], after[0])
    assert before[1] == after[1]
    assert np.array_equal(before[2], after[2])


def test_a_run_does_not_depend_on_the_global_rng_state(make_tiny_policy):
    rows = []
    for outside_seed in (1, 2):
        torch.manual_seed(outside_seed), random.seed(outside_seed), np.random.seed(outside_seed)
        model, tok = make_tiny_policy(seed=0)
        trainer = GRPOTrainer(model, tok, partial_credit_reward, GRPOConfig(prompts_per_step=2, group_size=4, seed=3))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows.append(trainer.train_step(_data()[:2]))
    assert rows[0]["reward_mean"] == rows[1]["reward_mean"] and rows[0]["loss"] == rows[1]["loss"]


def _with_attention_dropout(p: float):
    model, tok = tiny_model(seed=0)
    model.config.attention_dropout = p
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = p
    return model, tok


@pytest.mark.parametrize("disable", [True, False])
def test_first_pass_ratio_is_exactly_one_with_dropout_disabled(disable):
    model, tok = _with_attention_dropout(0.1)
    cfg = GRPOConfig(prompts_per_step=4, group_size=4, seed=0, disable_dropout=disable, learning_rate=1e-12)
    trainer = GRPOTrainer(model, tok, partial_credit_reward, cfg)
    trainer.grpo_step.reuse_on_policy_logprobs = False  # score old log-probs in a separate pass, as mu > 1 would
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = trainer.train_step(_data()[:4])
    if disable:
        assert row["ratio_mean"] == 1.0 and row["ratio_max"] == 1.0
        assert all(m.attention_dropout == 0.0 for m in model.modules() if hasattr(m, "attention_dropout"))
    else:  # the control: with dropout left on, the two passes disagree
        assert row["ratio_max"] > 1.0


def test_evaluate_policy_returns_one_record_per_row_and_matches_the_trainer(tiny_policy):
    model, tok = tiny_policy
    rows = _data(10)
    result = evaluate_policy(model, tok, rows, GRPOConfig(max_new_tokens=4), batch_size=3, num_samples=2)
    assert result["n"] == len(result["records"]) == 10
    assert [r["prompt"] for r in result["records"]] == [r["prompt"] for r in rows]
    assert {"completion", "correct", "reward", "length", "truncated", "answer"} <= set(result["records"][0])
    assert result["accuracy"] == pytest.approx(np.mean([r["correct"] for r in result["records"]]))
    assert len(result["samples"]) == 2
    trainer = GRPOTrainer(model, tok, correctness_reward, GRPOConfig(max_new_tokens=4))
    assert trainer.evaluate(rows, batch_size=3)["records"] == result["records"]


#: A wrong type raises TypeError, a wrong value ValueError: the package's one policy (grpo_tutorial._checks).
@pytest.mark.parametrize(
    "field, value, error",
    [("steps", True, TypeError), ("weight_decay", -1, ValueError), ("max_grad_norm", -1, ValueError),
     ("seed", -3, ValueError), ("learning_rate", 0, ValueError), ("batch_size", 1.5, TypeError),
     ("warmup_steps", -1, ValueError)],
)
def test_sft_config_rejects_what_grpo_config_rejects(field, value, error):
    with pytest.raises(error, match=rf"SFTConfig\.{field} must be"):
        SFTConfig(**{field: value})


@pytest.mark.parametrize(
    "field, value, error",
    [("seed", -3, ValueError), ("weight_decay", -1, ValueError), ("max_grad_norm", -1, ValueError),
     ("warmup_steps", True, TypeError)],
)
def test_both_configs_word_the_same_error_the_same_way(field, value, error):
    messages = []
    for cls in (SFTConfig, GRPOConfig):
        with pytest.raises(error) as err:
            cls(**{field: value})
        messages.append(str(err.value).split(".", 1)[1])
    assert messages[0] == messages[1]


def test_micro_batch_size_must_divide_the_update():
    with pytest.raises(ValueError, match="micro_batch_size must be a divisor of the update size 16"):
        GRPOConfig(prompts_per_step=4, group_size=4, micro_batch_size=3)
    assert GRPOConfig(prompts_per_step=4, group_size=8, micro_batch_size=8).updates_per_step == 1


def test_micro_batches_make_one_update_per_generation_batch(monkeypatch, tiny_policy):
    model, tok = tiny_policy
    cfg = GRPOConfig(prompts_per_step=4, group_size=4, seed=0, micro_batch_size=4)
    trainer = GRPOTrainer(model, tok, partial_credit_reward, cfg)
    steps = []
    real = trainer.optimizer.step
    monkeypatch.setattr(trainer.optimizer, "step", lambda *a, **k: (steps.append(1), real(*a, **k))[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train_step(_data()[:4])
    assert len(steps) == 1


def test_checkpoint_size_does_not_grow_with_the_run(tmp_path, make_small_policy):
    model, tok = make_small_policy(num_layers=1)
    cfg = GRPOConfig(prompts_per_step=2, group_size=2, max_new_tokens=2, checkpoint_every=2, output_dir=str(tmp_path))
    trainer = GRPOTrainer(model, tok, partial_credit_reward, cfg)
    sizes, warned = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for steps in (2, 20):
            trainer.train(_data(), steps, progress=False)
            state = json.loads((tmp_path / "checkpoint" / "trainer_state.json").read_text())
            warned.append(state.pop("warned"))
            sizes.append(len(json.dumps(state)))
    assert abs(sizes[1] - sizes[0]) < 16  # a few digits of the step counter, not 18 more history rows
    # what grows besides: the names of the doctor's findings already warned about, at most one each
    assert set(warned[0]) <= set(warned[1]) <= set(CAUSE_ORDER) and len(warned[1]) == len(set(warned[1]))
    assert len((tmp_path / "history.jsonl").read_text().splitlines()) == 20

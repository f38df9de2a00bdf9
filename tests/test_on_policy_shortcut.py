"""Stage 4 is skipped when a step is exactly on-policy, and that changes no number (issue 10).

With one optimizer update per step (mu = 1, one minibatch), the policy that
sampled is the policy being updated, so the old log-probs are the gradient
pass's own, detached. The trainer then skips the separate no-grad scoring pass.
These tests run the same steps both ways and demand identical bits where the
machine's kernels give the no-grad pass the gradient pass's bits (elsewhere equal to
rounding, and the test says which it checked); and they
check that the explicit pass still runs whenever the step is not on-policy.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import grpo_tutorial.step as step_module
from grpo_tutorial import GRPOConfig, GRPOTrainer, TIMING_KEYS, make_arithmetic_dataset
from grpo_tutorial.rewards import partial_credit_reward
from allowances import planted_bound
from helpers import tiny_model


def _run(reuse: bool, steps: int = 3, **overrides):
    model, tok = tiny_model(seed=4)
    cfg = GRPOConfig(prompts_per_step=4, group_size=4, seed=9, learning_rate=3e-3, **overrides)
    trainer = GRPOTrainer(model, tok, partial_credit_reward, cfg)
    trainer.grpo_step.reuse_on_policy_logprobs = reuse
    data = make_arithmetic_dataset(32, seed=2, digits=1)
    grads = []
    real_step = trainer.optimizer.step

    def recording_step(*args, **kwargs):  # the gradient each update applies
        grads.append([p.grad.clone() for p in trainer.grpo_step.params])
        return real_step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        history = trainer.train(data, steps, progress=False)
    rows = [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in history]
    return rows, grads, model.state_dict()


@pytest.mark.parametrize(
    "overrides",
    [{}, {"beta": 0.04}, {"share_prompt_cache": False}, {"micro_batch_size": 4, "loss_type": "dapo", "share_prompt_cache": False}],
)
def test_shortcut_and_explicit_path_are_bit_identical(overrides):
    """Bit for bit where this machine's no-grad scoring pass gives the gradient pass's own bits.

    That is a property of the kernels, not of the code: on an Intel Xeon under
    ``ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2`` a pass in eval mode without
    gradient picks other kernels than the training pass, and the explicit path's first
    ratio is 1 only up to rounding. There the two paths must agree to rounding instead.
    """
    rows_fast, grads_fast, weights_fast = _run(True, **overrides)
    rows_slow, grads_slow, weights_slow = _run(False, **overrides)
    assert rows_fast[0]["ratio_max"] == 1.0 and rows_fast[0]["grad_norm"] > 0.0  # a real update
    assert len(grads_fast) == len(grads_slow) == 3
    if not all(row["ratio_max"] == row["ratio_mean"] == 1.0 for row in rows_slow):  # the passes round differently here
        assert all(row["ratio_max"] == pytest.approx(1.0, abs=1e-5) for row in rows_slow)
        _assert_agree_to_rounding(rows_fast, grads_fast, weights_fast, rows_slow, grads_slow, weights_slow)
        return
    assert rows_fast == rows_slow  # loss, entropy, clip fractions, ratios: every logged number
    for step_fast, step_slow in zip(grads_fast, grads_slow):
        assert all(torch.equal(a, b) for a, b in zip(step_fast, step_slow))
    assert all(torch.equal(weights_fast[k], weights_slow[k]) for k in weights_fast)


def _assert_agree_to_rounding(rows_fast, grads_fast, weights_fast, rows_slow, grads_slow, weights_slow):
    for fast, slow in zip(rows_fast, rows_slow, strict=True):
        assert sorted(fast) == sorted(slow)
        for key, value in fast.items():
            assert value == pytest.approx(slow[key], rel=1e-4, abs=1e-6, nan_ok=True), key
    # The gradients as a whole, each update's against the other path's, in norm: element by element a gradient near
    # 0 shows the rounding of the ratio (1 + 5e-7 on the explicit path) at any relative size (0.16 under
    # ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=SSE4_2 on an Intel Xeon, where the whole gradient moved by
    # 1.3e-5). Honest: 0 in exact arithmetic. The planted bug, by construction: a shortcut that gives no policy
    # gradient (beta = 0: the zero gradient, a relative difference of exactly 1). Planted in step.py's shortcut, old
    # log-probs of other rows (rolled by one) gave 0.79 to 1.2 here, and this test failed.
    for update, (step_fast, step_slow) in enumerate(zip(grads_fast, grads_slow, strict=True), start=1):
        fast = torch.cat([g.flatten() for g in step_fast])
        slow = torch.cat([g.flatten() for g in step_slow])
        planted_bound(f"update {update}: the gradient's relative difference, shortcut against explicit",
                      float((fast - slow).norm() / slow.norm()), honest=0.0, planted=1.0,
                      bug="a shortcut with no policy gradient")
    for k in weights_fast:  # AdamW moves a weight by about lr * g / |g|: near g = 0, rounding shows
        torch.testing.assert_close(weights_fast[k], weights_slow[k], rtol=1e-4, atol=0.05 * 3e-3)


def test_shortcut_and_explicit_path_agree_to_rounding_with_shared_prompts_and_micro_batches():
    """With the shared-prompt pass, a micro-batch of shuffled rows holds other prompts than the
    scoring pass's contiguous chunk, so the prompt pass has another shape and its last float
    bits may differ: the explicit path's first ratio is 1 up to rounding, not exactly."""
    overrides = {"micro_batch_size": 4, "loss_type": "dapo"}
    rows_fast, grads_fast, weights_fast = _run(True, **overrides)
    rows_slow, grads_slow, weights_slow = _run(False, **overrides)
    assert rows_fast[0]["ratio_max"] == 1.0 and rows_fast[0]["grad_norm"] > 0.0
    _assert_agree_to_rounding(rows_fast, grads_fast, weights_fast, rows_slow, grads_slow, weights_slow)


class _CountScoring:
    """Counts the no-grad scoring passes of the policy (stage 4)."""

    def __init__(self, trainer: GRPOTrainer):
        self.policy_passes = 0
        real = trainer.grpo_step.logprobs

        def counting(model, rollout, *, entropy):
            if model is trainer.model:
                self.policy_passes += 1
            return real(model, rollout, entropy=entropy)

        trainer.grpo_step.logprobs = counting


@pytest.mark.parametrize(
    "overrides, explicit",
    [({}, False), ({"micro_batch_size": 4}, False), ({"num_iterations": 2}, True), ({"minibatch_size": 8}, True)],
)
def test_old_logprobs_are_scored_exactly_when_the_step_is_not_on_policy(overrides, explicit, make_tiny_policy):
    model, tok = make_tiny_policy(seed=4)
    trainer = GRPOTrainer(model, tok, partial_credit_reward, GRPOConfig(prompts_per_step=4, group_size=4, **overrides))
    counter = _CountScoring(trainer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = trainer.train_step(make_arithmetic_dataset(8, seed=2, digits=1)[:4])
    assert counter.policy_passes == (1 if explicit else 0)
    # no scoring pass is booked on-policy: stage 4 then only checks that there is no sampler copy and no reference
    # (relative to the update, so that a loaded machine's scheduling jitter does not decide it)
    assert (row["score_seconds"] > 0) if explicit else (row["score_seconds"] < 0.1 * row["update_seconds"])


def test_the_shortcut_is_what_makes_the_ratio_one(monkeypatch):
    """A wrong shortcut (old log-probs that are not the gradient pass's) shows in the ratio at once."""
    real = step_module.grpo_loss

    def shifted(logp, old_logp, *args, **kwargs):
        return real(logp, old_logp + 1e-3, *args, **kwargs)

    monkeypatch.setattr(step_module, "grpo_loss", shifted)
    rows, _, _ = _run(True, steps=1)
    assert rows[0]["ratio_max"] != 1.0

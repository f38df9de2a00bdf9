"""Tools with every sampler that can pause, and the GPU's defaults forced on the CPU (issue 54, items 1 and 4).

On a CUDA model ``static_cache=None`` and ``merge_adapters_for_sampling=None`` resolve to on, so the step builds a
:class:`~grpo_tutorial.sampling.fast.FastSampler`; ``tools=`` used to refuse it ("tools= needs the policy as its
sampler"), blaming a sampler the user never chose. Each setting that resolves differently on CUDA is forced here on
the CPU, with tools and without, and so is each of chapter 15's sampler copies: every combination takes a training
step, the tool's tokens are masked, and a copy's own log-probs of the tool's tokens are 0.0, as TRL stores them,
so that the correction and its diagnostics read the sampled tokens only (checked against TRL's own code in
``tests/test_mismatch.py``).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from grpo_tutorial import GRPOConfig, GRPOTrainer
from grpo_tutorial.tools.calculator import calculator
from grpo_tutorial.sampling.fast import FastSampler
from grpo_tutorial.mismatch import mismatch_diagnostics
from grpo_tutorial.sampling import SamplerCopy
from grpo_tutorial.models import TINY_TOOL_CHARS
from grpo_tutorial.trainer import GRPOWarning

from test_tools import Script

TARGETS = {"12*34=": "<<12*34=408>>408", "5*6=": "30", "7*8=": "<<7*8=56>>56", "9*9=": "81"}


def tool_rows():
    return [{"prompt": p, "answer": t.split(">>")[-1]} for p, t in TARGETS.items()]


def right(completions, answer, **kwargs):
    return [float(c.split(">>")[-1] == a) for c, a in zip(completions, answer)]


@pytest.fixture
def tool_policy(make_small_policy):
    return make_small_policy(seed=0, vocab=TINY_TOOL_CHARS)


def one_step(model, tok, monkeypatch, *, tools=True, **settings):
    """One training step with the script's rollouts; the trainer, its row and the step's rollout."""
    import grpo_tutorial.rollout as rollout_module

    script = Script(tok, TARGETS)
    real = rollout_module.sampling_kwargs

    def scripted(config, **overrides):  # every sampler's kwargs carry the script (sampling_kwargs is the one door)
        kwargs = real(config, **overrides)
        kwargs["logits_processor"] = (*kwargs.get("logits_processor", ()), script)
        return kwargs

    for module in ("grpo_tutorial.sampling.base", "grpo_tutorial.sampling.fast"):
        monkeypatch.setattr(f"{module}.sampling_kwargs", scripted)
    config = GRPOConfig(group_size=2, prompts_per_step=4, max_new_tokens=24, learning_rate=1e-3, seed=0, **settings)
    trainer = GRPOTrainer(model, tok, right, config, tools=[calculator] if tools else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        row = trainer.train_step(tool_rows())
    return trainer, row


CUDA_DEFAULTS = [dict(static_cache=True), dict(static_cache=False), dict(sampler="float16"),
                 dict(sampler="float16", static_cache=True), dict(sampler="bfloat16"),
                 dict(sampler="stale", sampler_staleness=2), dict(sampler="top_p", top_p=0.9),
                 dict(sampler="bfloat16", vllm_importance_sampling_correction=True)]


@pytest.mark.parametrize("settings", CUDA_DEFAULTS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("tools", [True, False], ids=["tools", "no-tools"])
def test_every_sampler_takes_a_step_with_tools_and_without(tool_policy, monkeypatch, settings, tools):
    model, tok = tool_policy
    trainer, row = one_step(model, tok, monkeypatch, tools=tools, **settings)
    sampler = trainer.grpo_step.sampler
    expected = FastSampler if settings.get("static_cache") and "sampler" not in settings else SamplerCopy
    if "sampler" in settings or settings.get("static_cache"):
        assert isinstance(sampler, expected)
        assert (sampler.toolbox is not None) == tools  # the step handed the sampler its tools
    assert row["step"] == 1 and torch.isfinite(torch.tensor(row["loss"]))
    if tools:
        assert row["tool_call_count"] == 4.0 and row["tool_failure_count"] == 0.0  # 2 rows x 2 calling prompts
        prompts, completions = trainer.grpo_step.last_batch[:2]
        assert completions == [TARGETS[p] for p in prompts]  # the calculator's answers, written by the tool
    else:
        assert "tool_call_count" not in row


def test_a_sampler_copys_log_probs_of_the_tools_tokens_are_zero_and_the_correction_skips_them(tool_policy,
                                                                                              monkeypatch):
    """TRL stores a sampling log-prob of 0.0 for a tool's tokens and masks them out of the correction; so do ours."""
    import grpo_tutorial.step as step_module

    model, tok = tool_policy
    seen = {}
    real = step_module.sampler_correction

    def keep(old_logp, rollout, config):
        seen["rollout"], seen["old"] = rollout, old_logp
        return real(old_logp, rollout, config)

    monkeypatch.setattr(step_module, "sampler_correction", keep)
    trainer, row = one_step(model, tok, monkeypatch, sampler="top_p", top_p=0.5,
                            vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_mask")
    rollout = seen["rollout"]
    tool = (rollout.tool_mask == 0) & (rollout.completion_mask == 1)
    assert int(tool.sum()) > 0
    assert (rollout.sampler_logprobs[tool] == 0).all()  # 0.0, as TRL's: not -inf (outside the nucleus), not NaN
    assert torch.isfinite(rollout.sampler_logprobs).all()
    # the diagnostics are over the sampled tokens; the planted bug, the completion mask, reads the tool's too
    cfg = trainer.config
    bounds = (cfg.vllm_importance_sampling_clip_min, cfg.vllm_importance_sampling_clip_max)
    sampled = mismatch_diagnostics(seen["old"], rollout.sampler_logprobs.to(seen["old"].dtype), rollout.loss_mask,
                                   *bounds)
    planted = mismatch_diagnostics(seen["old"], rollout.sampler_logprobs.to(seen["old"].dtype),
                                   rollout.completion_mask, *bounds)
    assert row["mismatch/kl"] == sampled["mismatch/kl"] != planted["mismatch/kl"]
    assert torch.isfinite(torch.tensor(row["loss"]))


def test_a_sampler_function_is_still_refused_with_tools_and_says_why(tool_policy):
    model, tok = tool_policy

    def my_sampler(prompts, seed):
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="cannot be used with a sampler= function.*continues from the token ids"):
        GRPOTrainer(model, tok, right, GRPOConfig(group_size=2), sampler=my_sampler, tools=[calculator])


def test_the_float16_copys_fallback_runs_no_tool_twice(tool_policy, monkeypatch):
    """A planted float16 overflow: the rollout is made again by the float32 policy, and the calls the float16
    copy already answered are not run again."""
    from grpo_tutorial.sampling.fast import NonFiniteGuard

    model, tok = tool_policy
    runs = []

    def counted(expression: str) -> str:
        runs.append(expression)
        return calculator(expression)

    counted.__name__ = "calculator"
    monkeypatch.setattr(NonFiniteGuard, "tripped", lambda self: True)  # every float16 rollout falls back
    trainer, row = one_step(model, tok, monkeypatch, sampler="float16")
    assert row["sampler/fallbacks"] == 1.0
    trainer.grpo_step.sampler.toolbox.tools = {"calculator": counted}
    runs.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        row = trainer.train_step(tool_rows())
    assert row["sampler/fallbacks"] == 1.0 and row["tool_call_count"] == 4.0
    assert sorted(runs) == sorted(["12*34", "12*34", "7*8", "7*8"])  # once per row, not again in the fallback

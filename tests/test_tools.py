"""Rollouts with tools (grpo_tutorial/tools/loop.py): the loop, the tool mask, TRL's rules, the step's loss mask.

A scripted logits processor makes the tiny model write exactly the text a test
asks for (one target per prompt), whatever its weights: the model's turns are the
script's, and every token the script did not write came from the tool. So the
tool mask, the counts and each rule of TRL's loop can be checked exactly.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo_tutorial import GRPOConfig
from grpo_tutorial.tools.calculator import calculator
from grpo_tutorial.metrics import tool_metrics
from grpo_tutorial.models import TINY_CHARS, TINY_TOOL_CHARS
from grpo_tutorial.sampling import PolicySampler
from grpo_tutorial.step import GRPOStep
from grpo_tutorial.tools import InlineCalls, ToolBox, generate_tool_rollouts
from helpers import StepState


@pytest.fixture
def tool_policy(make_small_policy):
    """The small tiny Qwen2 with chapter 16's vocabulary."""
    return make_small_policy(seed=0, vocab=TINY_TOOL_CHARS)


class Script:
    """A logits processor that writes ``targets[prompt]`` character by character, then EOS.

    At each step it reads the row's text after the prompt; if that text is a prefix of
    the target, it forces the target's next character, else (the tool wrote something
    the script did not expect) it forces EOS at once.
    """

    def __init__(self, tokenizer, targets: dict[str, str]) -> None:
        self.tokenizer, self.targets = tokenizer, targets

    def __call__(self, input_ids, scores):
        out = torch.full_like(scores, -1e9)
        for r in range(input_ids.shape[0]):
            text = self.tokenizer.decode(input_ids[r].tolist(), skip_special_tokens=True)
            cut = text.index("=") + 1  # the prompts are "a*b="
            target, done = self.targets[text[:cut]], text[cut:]
            if done == target or not target.startswith(done):
                out[r, self.tokenizer.eos_token_id] = 0.0
            else:
                out[r, self.tokenizer.convert_tokens_to_ids(target[len(done)])] = 0.0
        return out


def scripted(model, tokenizer, targets, tools=(calculator,), *, max_new_tokens=30, group_size=2, **box):
    toolbox = ToolBox.build(list(tools), tokenizer, chat=False, **box)
    return generate_tool_rollouts(model, tokenizer, list(targets), toolbox, group_size=group_size,
                                  max_new_tokens=max_new_tokens, generator_seed=1,
                                  logits_processor=[Script(tokenizer, targets)])


def written(rollout, tokenizer, row: int) -> str:
    """The row's kept tokens, each tool token shown as ``_``."""
    ids, tool = rollout.completion_ids[row].tolist(), rollout.tool_mask[row].tolist()
    n = int(rollout.completion_mask[row].sum())
    return "".join(tokenizer.decode([t]) if m else "_" for t, m in zip(ids[:n], tool[:n]))


def test_the_tool_writes_its_answer_and_only_its_tokens_are_masked(tool_policy):
    model, tok = tool_policy
    targets = {"12*34=": "<<12*34=408>>408", "5*6=": "30", "7*8=": "<<7*8=56>><<(1=?>>56"}
    rollout = scripted(model, tok, targets)
    assert rollout.completions == ["<<12*34=408>>408"] * 2 + ["30"] * 2 + ["<<7*8=56>><<(1=?>>56"] * 2
    assert [written(rollout, tok, i) for i in (0, 2, 4)] == [
        "<<12*34=_____408<eos>", "30<eos>", "<<7*8=____<<(1=___56<eos>"]
    assert rollout.tool_calls.tolist() == [1, 1, 0, 0, 2, 2]
    assert rollout.tool_failures.tolist() == [0, 0, 0, 0, 1, 1]  # "(1" is no expression: an error result, "?"
    assert not rollout.truncated.any()
    assert torch.equal(rollout.loss_mask, rollout.completion_mask * rollout.tool_mask)
    assert int((rollout.completion_mask - rollout.loss_mask).sum()) == 2 * (5 + 0 + 7)  # the tool's tokens
    metrics = tool_metrics(rollout)
    assert metrics == {"tool_call_count": 6.0, "tool_failure_count": 2.0, "tool_call_share": 4 / 6,
                       "tool_call_frequency": 1.0, "tool_failure_frequency": 2 / 6}


def test_the_first_turn_is_one_batched_call_and_each_round_one_more(tool_policy, monkeypatch):
    import grpo_tutorial.rollout as rollout_module

    model, tok = tool_policy
    calls = []
    real = rollout_module._generate

    def counting(model, prompt_ids, *args, **kwargs):
        calls.append(prompt_ids.shape[0])
        return real(model, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(rollout_module, "_generate", counting)
    scripted(model, tok, {"12*34=": "<<12*34=408>>408", "5*6=": "30", "7*8=": "<<7*8=56>><<(1=?>>56"},
             group_size=3)
    assert calls == [9, 6, 3]  # all B*G rows; the 6 rows the tool answered; the 3 that called again


def test_at_the_iteration_limit_the_last_call_stays_unanswered(tool_policy):
    model, tok = tool_policy
    rollout = scripted(model, tok, {"7*8=": "<<7*8=56>><<(1=?>>56"}, max_tool_calling_iterations=1)
    assert rollout.completions == ["<<7*8=56>><<(1="] * 2  # TRL: the loop stops with the call unanswered
    assert rollout.tool_calls.tolist() == [1, 1]
    assert rollout.truncated.all()  # TRL's rule: the completion does not end with EOS
    zero = scripted(model, tok, {"7*8=": "<<7*8=56>>56"}, max_tool_calling_iterations=0)
    assert zero.completions == ["<<7*8="] * 2 and zero.tool_calls.tolist() == [0, 0]


def test_a_result_past_the_budget_is_rolled_back(tool_policy):
    model, tok = tool_policy
    # "<<12*34=" is 8 tokens, the answer "408>>" 5 more: 13 > 12, so it is rolled back (TRL: the call is counted)
    rollout = scripted(model, tok, {"12*34=": "<<12*34=408>>408"}, max_new_tokens=12)
    assert rollout.completions == ["<<12*34="] * 2
    assert rollout.tool_calls.tolist() == [1, 1] and (rollout.tool_mask == 1).all()
    fits = scripted(model, tok, {"12*34=": "<<12*34=408>>408"}, max_new_tokens=13)
    assert fits.completions == ["<<12*34=408>>"] * 2 and fits.truncated.all()  # no room left to write after it


def test_a_tool_that_raises_or_hangs_gives_an_error_result_not_an_exception(tool_policy):
    import time

    model, tok = tool_policy

    def broken(expression: str) -> str:
        raise RuntimeError("boom")

    def slow(expression: str) -> str:
        time.sleep(1.0)
        return "1"

    for tool, box in ((broken, {}), (slow, {"time_limit": 0.05})):
        rollout = scripted(model, tok, {"3*4=": "<<3*4=?>>12"}, tools=[tool], **box)
        assert rollout.completions == ["<<3*4=?>>12"] * 2
        assert rollout.tool_failures.tolist() == [1, 1]


def test_inline_calls_read_the_pending_expression():
    syntax = InlineCalls()
    assert syntax.pending("<<12*34=") == "12*34"
    assert syntax.pending("1<<2+3=") == "2+3"
    assert syntax.pending("<<1=2>>=") is None  # the call was answered already
    assert syntax.pending("12=") is None and syntax.pending("<<12") is None


def test_toolbox_refuses_bad_tools(tool_policy):
    _, tok = tool_policy
    with pytest.raises(TypeError, match="list of functions"):
        ToolBox.build(calculator, tok, chat=False)
    with pytest.raises(ValueError, match="one tool"):
        ToolBox.build([calculator, abs], tok, chat=False)
    with pytest.raises(ValueError, match="max_tool_calling_iterations"):
        ToolBox.build([calculator], tok, chat=False, max_tool_calling_iterations=-1)
    with pytest.raises(ValueError, match="time_limit"):
        ToolBox.build([calculator], tok, chat=False, time_limit=0)
    with pytest.raises(ValueError, match="max_tool_calling_iterations"):
        GRPOConfig(max_tool_calling_iterations=-1)
    with pytest.raises(ValueError, match="tool_time_limit"):
        GRPOConfig(tool_time_limit=float("inf"))


def test_the_tool_vocabulary_keeps_every_earlier_id(make_small_policy):
    _, plain = make_small_policy(seed=0)
    _, tools = make_small_policy(seed=0, vocab=TINY_TOOL_CHARS)
    assert TINY_CHARS == "0123456789+-*=() " and TINY_TOOL_CHARS.startswith(TINY_CHARS)
    assert all(plain.convert_tokens_to_ids(c) == tools.convert_tokens_to_ids(c) for c in TINY_CHARS)
    assert len(tools) == len(plain) + 3


def _step_with_script(model, tok, config, targets):
    """A GRPO step whose sampler writes the script's completions (with the real tool loop)."""
    step = GRPOStep(model, tok, [lambda completions, **kw: [float(len(c) % 3) for c in completions]], config,
                    tools=[calculator])

    class Scripted(PolicySampler):  # the policy, its logits overruled by the script; the step hands it the tools
        def __call__(self, prompts, seed):
            return self.generate(self.model, prompts, seed, logits_processor=[Script(tok, targets)])

    step.sampler = Scripted(step.model, tok, config)
    return step


@pytest.mark.parametrize("mask_tool_tokens", [True, False])
def test_the_step_trains_on_the_policys_tokens_only(tool_policy, monkeypatch, mask_tool_tokens):
    model, tok = tool_policy
    targets = {"12*34=": "<<12*34=408>>408", "5*6=": "30"}
    config = GRPOConfig(group_size=2, prompts_per_step=2, max_new_tokens=24, mask_tool_tokens=mask_tool_tokens)
    step = _step_with_script(model, tok, config, targets)
    seen = []
    real_loss = step.loss

    def loss(logp, old_logp, advantages, mask, **inputs):
        seen.append((mask.clone(), inputs["num_items_in_batch"]))
        return real_loss(logp, old_logp, advantages, mask, **inputs)

    monkeypatch.setattr(step, "loss", loss)
    row = step([{"prompt": p, "answer": "0"} for p in targets], StepState(), [])
    rollout_mask, items = seen[0]
    tool_tokens = 2 * 5  # "408>>" in the two rows that called
    kept = 2 * len("<<12*34=408>>408<") + 2 * len("30<") - (tool_tokens if mask_tool_tokens else 0)
    assert float(rollout_mask.sum()) == kept and float(items) == kept  # the loss and its normaliser
    assert row["tool_call_count"] == 2.0 and row["tool_call_share"] == 0.5 and row["tool_failure_count"] == 0
    # the history's lengths count the policy's tokens, with or without the control
    assert row["completion_len_mean"] == (2 * 12 + 2 * 3) / 4


def test_grpo_loss_gives_no_gradient_to_the_tools_tokens(tool_policy):
    from grpo_tutorial.loss import grpo_loss

    model, tok = tool_policy
    rollout = scripted(model, tok, {"12*34=": "<<12*34=408>>408", "5*6=": "30"})
    logp = torch.randn(rollout.completion_mask.shape, requires_grad=True)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    loss, _ = grpo_loss(logp, logp.detach(), advantages, rollout.loss_mask)
    loss.backward()
    tool = (rollout.tool_mask == 0) & (rollout.completion_mask == 1)
    assert int(tool.sum()) == 10 and (logp.grad[tool] == 0).all()
    assert (logp.grad[rollout.loss_mask.bool()] != 0).all()  # and every token the policy wrote has one
    assert math.isfinite(float(loss.detach()))


def test_a_prompt_may_open_the_call(tool_policy):
    model, tok = tool_policy
    targets = {"12*34=": "<<12*34=408>>408"}
    toolbox = ToolBox.build([calculator], tok, chat=False)
    # the prompt holds "<<", the script writes the rest of the target: the call is read across the two
    rollout = generate_tool_rollouts(model, tok, ["12*34=<<"], toolbox, group_size=2, max_new_tokens=30,
                                     generator_seed=1, logits_processor=[Script(tok, targets)])
    assert rollout.completions == ["12*34=408>>408"] * 2 and rollout.tool_calls.tolist() == [1, 1]

"""Stage 1's one home (issue 56, item 1): every sampler is a :class:`~grpo_tutorial.sampling.Sampler`, and the step
and the trainer ask a sampler nothing but that protocol.

The protocol (``grpo_tutorial/sampling/base.py``): a call ``(prompts, seed) -> Rollout``, the step's ``toolbox``,
``is_learner``, ``evaluation_model``, ``sync()`` and ``reset()``. Before it, the step found a sampler's optional
methods with ``hasattr`` and ``getattr``, a user's object with a ``sync`` but no ``reset`` was half obeyed, and the
default sampler was ``None``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import grpo_tutorial
from grpo_tutorial import GRPOConfig, GRPOTrainer
from grpo_tutorial.tools.calculator import calculator
from grpo_tutorial.models import TINY_TOOL_CHARS
from grpo_tutorial.sampling import (
    FastSampler, FunctionSampler, PolicySampler, Sampler, SamplerCopy, as_sampler, build_sampler,
)
from grpo_tutorial.sampling.base import MEMBERS
from grpo_tutorial.step import GRPOStep
from grpo_tutorial.tools import NO_TOOLS_FOR_A_FUNCTION

from helpers import length_reward, small_config
from test_tools import Script

PACKAGE = Path(grpo_tutorial.__file__).parent

#: Each setting that builds a different sampler, what it builds, and whether it is the learner.
BUILT = [
    ({}, PolicySampler, True),
    ({"static_cache": True}, FastSampler, True),
    ({"sampler": "bfloat16"}, SamplerCopy, False),
    ({"sampler": "stale", "sampler_staleness": 2}, SamplerCopy, False),
    ({"sampler": "top_p", "top_p": 0.9}, SamplerCopy, False),
    ({"sampler": "float16"}, SamplerCopy, False),
]


@pytest.mark.parametrize("settings, kind, learner", BUILT, ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_every_sampler_the_package_builds_has_the_whole_protocol(small_policy, settings, kind, learner):
    model, tok = small_policy
    sampler = build_sampler(None, model, tok, small_config(**settings))
    assert type(sampler) is kind and isinstance(sampler, Sampler)
    assert sampler.is_learner is learner and sampler.toolbox is None
    # an evaluation generates with the learner, or with the fast sampler's model (here the policy: nothing merged)
    assert sampler.evaluation_model is model
    sampler.sync()
    sampler.reset()
    rollout = sampler(["1+2=", "3+4="], 0)
    assert len(rollout) == 2 * small_config().group_size
    assert (rollout.sampler_logprobs is None) is learner  # only a sampler that is not the learner reports its own


def test_a_function_is_wrapped_and_a_whole_sampler_is_used_as_it_is(small_policy):
    model, tok = small_policy
    policy = PolicySampler(model, tok, small_config())

    def mine(prompts, seed):
        return policy(prompts, seed)

    wrapped = as_sampler(mine, model)
    assert isinstance(wrapped, FunctionSampler) and isinstance(wrapped, Sampler) and wrapped.fn is mine
    assert not wrapped.is_learner and wrapped.toolbox is None and wrapped.evaluation_model is model
    assert as_sampler(policy, model) is policy
    trainer = GRPOTrainer(model, tok, length_reward, small_config(), sampler=policy)
    assert trainer.grpo_step.sampler is policy


def test_part_of_the_protocol_is_refused_and_says_what_is_missing(small_policy):
    model, tok = small_policy

    class Half:  # synced after an update, but nothing would reset it after a load
        def __call__(self, prompts, seed):
            raise AssertionError("never called")

        def sync(self):
            pass

    with pytest.raises(TypeError, match=r"has \['sync'\] but not \['toolbox', 'is_learner', 'evaluation_model', "
                                        r"'reset'\]"):
        GRPOTrainer(model, tok, length_reward, small_config(), sampler=Half())
    with pytest.raises(TypeError, match="sampler must be None or a function, got str"):
        GRPOTrainer(model, tok, length_reward, small_config(), sampler="vllm")
    assert set(MEMBERS) == {"toolbox", "is_learner", "evaluation_model", "sync", "reset"}


@pytest.fixture
def tool_policy(make_small_policy):
    return make_small_policy(seed=0, vocab=TINY_TOOL_CHARS)


def test_a_sampler_of_ones_own_takes_the_steps_tools_and_a_function_does_not(tool_policy):
    model, tok = tool_policy
    config = GRPOConfig(group_size=2, prompts_per_step=2, max_new_tokens=24)

    script = {"12*34=": "<<12*34=408>>408"}

    class Scripted(PolicySampler):  # the policy, its logits overruled by a script that calls the calculator
        def __call__(self, prompts, seed):
            return self.generate(self.model, prompts, seed, logits_processor=[Script(tok, script)])

    mine = Scripted(model, tok, config)
    step = GRPOStep(model, tok, [length_reward], config, sampler=mine, tools=[calculator])
    assert step.sampler is mine and mine.toolbox is step.toolbox is not None
    rollout = mine(["12*34="], 0)
    assert rollout.tool_calls.tolist() == [1, 1]  # the calculator answered both rows
    assert rollout.completions[0].endswith("<<12*34=408>>408")
    with pytest.raises(ValueError, match="cannot be used with a sampler= function"):
        step.sampler = lambda prompts, seed: mine(prompts, seed)
    assert step.sampler is mine  # the refused function did not replace it
    with pytest.raises(ValueError, match="cannot be used with a sampler= function"):
        GRPOStep(model, tok, [length_reward], config, sampler=lambda p, s: None, tools=[calculator])
    assert "pass a grpo_tutorial.sampling.Sampler" in NO_TOOLS_FOR_A_FUNCTION


# ---------------------------------------------------------------------------
# Nobody asks a sampler what it can do
# ---------------------------------------------------------------------------

#: The modules that use the step's sampler.
USERS = ["step.py", "trainer.py", "evaluation.py", "chapters/mismatch_lab.py", "chapters/gsm8k.py"]


def questions_to_a_sampler(source: str) -> list[str]:
    """Where ``source`` asks a sampler what it has (``hasattr``/``getattr`` on anything named ``sampler``) or uses a
    member of ``<...>.sampler`` outside the protocol."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr"):
            if node.args and "sampler" in ast.unparse(node.args[0]).split(".")[-1]:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "sampler":
            if node.attr not in MEMBERS:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_step_and_the_trainer_ask_a_sampler_nothing_but_the_protocol():
    found = {name: questions_to_a_sampler((PACKAGE / name).read_text()) for name in USERS}
    assert {name: hits for name, hits in found.items() if hits} == {}


def test_the_question_detector_finds_each_kind():
    assert questions_to_a_sampler("if hasattr(self.sampler, 'sync'):\n    self.sampler.sync()\n") == [
        "1: hasattr(self.sampler, 'sync')"]
    assert questions_to_a_sampler("m = getattr(step.sampler, 'evaluation_model', None)\n") == [
        "1: getattr(step.sampler, 'evaluation_model', None)"]
    assert questions_to_a_sampler("x = self.grpo_step.sampler.engine\n") == ["1: self.grpo_step.sampler.engine"]
    assert questions_to_a_sampler("self.sampler.sync()\nm = trainer.grpo_step.sampler.evaluation_model\n") == []


def test_none_brings_back_the_default_and_a_step_without_tools_takes_them_away(tool_policy):
    model, tok = tool_policy
    config = GRPOConfig(group_size=2, prompts_per_step=2, max_new_tokens=8)
    with_tools = GRPOStep(model, tok, [length_reward], config, tools=[calculator])
    given = with_tools.sampler
    assert given.toolbox is with_tools.toolbox is not None
    without = GRPOStep(model, tok, [length_reward], config, sampler=given)
    assert without.sampler is given and given.toolbox is None  # no tools here: it no longer calls any
    without.sampler = None
    assert type(without.sampler) is PolicySampler and without.sampler is not given
    with_tools.sampler = None  # the default again, and it has the step's tools
    assert with_tools.sampler.toolbox is with_tools.toolbox


def test_the_trainers_config_and_tokenizer_cannot_be_replaced_under_its_sampler(small_policy):
    model, tok = small_policy
    trainer = GRPOTrainer(model, tok, length_reward, small_config())
    for name in ("config", "tokenizer"):
        with pytest.raises(AttributeError, match=f"GRPOTrainer.{name} cannot be replaced: the step's sampler"):
            setattr(trainer, name, getattr(trainer, name))
    assert trainer.grpo_step.sampler.config is trainer.config  # one config, built once
    trainer.reuse_on_policy_logprobs = False  # the step's other settings are still the trainer's to set
    assert trainer.grpo_step.reuse_on_policy_logprobs is False

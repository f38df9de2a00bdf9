"""Typed stage results (issue 56, item 2): the stages of a step hand each other small dataclasses
(:mod:`grpo_tutorial.stage_results`), and a step that changes a stage overrides that stage only.

Before them, PPO's step kept stage 3's values and returns in ``self._critic`` for stage 5 and cached stage 4's pass
in ``self._scores``; PPO's, the Monte Carlo and the measured steps each overrode ``__call__`` to patch the history row
and ``last_batch``; the stages handed each other dicts.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest
import torch

import grpo_tutorial
from grpo_tutorial import GRPOTrainer
from grpo_tutorial.advantages import zero_std_groups
from grpo_tutorial.ppo import PPOSettings
from grpo_tutorial.ppo.step import CriticAdvantages, PPOStep
from grpo_tutorial.stage_results import Advantages, Rewards, Scores, Updates
from grpo_tutorial.step import GRPOStep

from helpers import StepState, length_reward, small_config

PACKAGE = Path(grpo_tutorial.__file__).parent
ROWS = [{"prompt": "12+34=", "answer": "46"}, {"prompt": "7+58=", "answer": "65"}]

#: The stage each method of a step belongs to (its helpers with it): an attribute written in one stage's method and
#: read in another's is data handed between stages on the step object, which the typed results replace. A method not
#: named here (a helper of one's own, a property) is a place of its own; ``__init__`` only sets the step up.
STAGE_OF = {
    "sample": 1, "again": 1, "reward": 2, "advantages": 3, "value_pass": 3, "score": 4, "logprobs": 4,
    "update": 5, "accumulate": 5, "policy_logprobs": 5, "loss": 5, "train_value_model": 5, "hold_policy": 5,
}
#: Calls that change a container in place: ``self.cache.append(x)`` writes ``self.cache`` as ``self.cache = ...`` does.
MUTATORS = {"append", "extend", "insert", "update", "setdefault", "add", "pop", "popitem", "clear", "remove"}


def test_per_completion_is_the_value_or_its_mean_over_the_mask():
    """One advantage per completion, what the run logs beside each: ``[N]`` as it is; ``[N, T]``, the mean over
    the mask (by hand: (1 + 2) / 2 and 4 / 1), 0 for a completion with no token in it."""
    flat = torch.tensor([0.5, -0.5])
    assert Advantages(flat).per_completion() is flat
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert Advantages(values, mask).per_completion().tolist() == [1.5, 4.0, 0.0]
    moved = Advantages(values, mask, {"advantage_var": 1.0}).to("cpu")
    assert moved.mask is mask and moved.row == {"advantage_var": 1.0}


def test_an_update_result_starts_empty_and_each_gets_its_own_lists():
    a, b = Updates(lr=0.1), Updates(lr=0.2)
    a.losses.append(1.0)
    a.row["x"] = 1.0
    assert b.losses == [] and b.row == {} and a.stats == [] and a.entropy is None
    assert set(a.seconds) == {"forward_seconds", "backward_seconds", "optimizer_seconds"}


def _step_classes() -> list[type]:
    """Every step class of the package: GRPOStep and its subclasses, chapters' included."""
    import grpo_tutorial.chapters.no_critic  # noqa: F401  (each module that defines a step)
    import grpo_tutorial.chapters.pitfalls  # noqa: F401
    import grpo_tutorial.ppo.vine  # noqa: F401

    found, todo = [], [GRPOStep]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [cls for cls in found if cls.__module__.startswith("grpo_tutorial")]


def _attributes(cls: type) -> dict[str, tuple[set, set]]:
    """Per ``self.<name>`` in the methods of ``cls`` and the package's classes it inherits from (``__init__`` aside):
    the places (stage numbers, or a method's own name) that write it, by assignment or in place, and those that
    read it."""
    seen: dict[str, tuple[set, set]] = {}
    for klass in [k for k in cls.__mro__ if k.__module__.startswith("grpo_tutorial")]:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for method in [n for n in tree.body[0].body if isinstance(n, ast.FunctionDef) and n.name != "__init__"]:
            place = STAGE_OF.get(method.name, method.name)
            for node in ast.walk(method):
                name = _self_attribute(node)
                if name is None:
                    continue
                writes, reads = seen.setdefault(name, (set(), set()))
                (writes if _writes(node, method) else reads).add(place)
    return seen


def _self_attribute(node: ast.AST) -> str | None:
    """``x`` for ``self.x``; None for anything else."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _writes(node: ast.Attribute, method: ast.FunctionDef) -> bool:
    """Whether ``self.x`` is written here: assigned, assigned into (``self.x[k] = v``), or changed by a mutator."""
    if isinstance(node.ctx, ast.Store):
        return True
    for parent in ast.walk(method):
        if isinstance(parent, ast.Subscript) and parent.value is node and isinstance(parent.ctx, (ast.Store, ast.Del)):
            return True
        if (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and parent.func.value is node
                and parent.func.attr in MUTATORS):
            return True
    return False


def _handed(cls: type) -> dict[str, tuple[set, set]]:
    """The attributes one place writes and another reads."""
    return {name: (w, r) for name, (w, r) in _attributes(cls).items() if any(a != b for a in w for b in r)}


def test_the_steps_are_found():
    names = {cls.__name__ for cls in _step_classes()}
    assert {"GRPOStep", "PPOStep", "MonteCarloStep", "MeasuredStep", "GalleryStep", "RefAsOld"} <= names


@pytest.mark.parametrize("cls", _step_classes(), ids=lambda cls: cls.__name__)
def test_a_step_overrides_stages_only(cls):
    """No step but GRPOStep defines ``__call__``; no attribute is written by one stage and read by another."""
    if cls is not GRPOStep:
        assert "__call__" not in vars(cls), f"{cls.__name__} overrides __call__: override a stage instead"
    handed = _handed(cls)
    assert handed == {}, f"{cls.__name__} hands data between stages on self (stages written, read): {handed}"


def test_the_scan_finds_data_handed_on_self_however_it_is_written(monkeypatch):
    """Assigned in stage 3 and read in 5; filled in place in stage 3 (a dict set up in ``__init__``) and read in 5;
    written by a helper of one's own and read in a stage; and, not handed, written and read within stage 5."""
    import types

    cases = {
        "assigned": "def advantages(self, r):\n    self.kept = r\ndef update(self, *a):\n    return self.kept",
        "also written where read": "def advantages(self, r):\n    self.kept = r\n"
                                   "def update(self, *a):\n    self.kept = self.kept",
        "in place": "def __init__(self):\n    self.cache = {}\ndef advantages(self, r):\n    self.cache['v'] = r\n"
                    "def update(self, *a):\n    return self.cache['v']",
        "by a mutator": "def advantages(self, r):\n    self.seen.append(r)\n"
                        "def update(self, *a):\n    return self.seen",
        "a helper of its own": "def remember(self, r):\n    self.kept = r\ndef score(self, r):\n    return self.kept",
        "within stage 5": "def update(self, *a):\n    self.passes = []\n"
                          "def policy_logprobs(self, *a):\n    self.passes.append(a)",
    }
    found, sources = {}, {}
    monkeypatch.setattr(inspect, "getsource", lambda obj: sources[obj])  # the planted classes' source, as written
    for label, body in cases.items():
        module = types.ModuleType("grpo_tutorial._planted")
        source = "class Planted:\n" + textwrap.indent(body, "    ") + "\n"
        exec(compile(source, "<planted>", "exec"), module.__dict__)  # noqa: S102 - the test's own source
        cls = module.Planted
        cls.__module__ = "grpo_tutorial._planted"
        sources[cls] = source
        found[label] = sorted(_handed(cls))
    assert found == {"assigned": ["kept"], "also written where read": ["kept"], "in place": ["cache"],
                     "by a mutator": ["seen"], "a helper of its own": ["kept"], "within stage 5": []}


class Counted(PPOStep):
    """PPO's step, counting its stage 4 passes and keeping stage 3's result."""

    calls = 0

    def score(self, rollout) -> Scores:
        self.calls += 1
        return super().score(rollout)

    def advantages(self, rewards: Rewards) -> CriticAdvantages:
        self.kept = super().advantages(rewards)
        return self.kept


@pytest.mark.parametrize("kl_in_reward", [False, True])
def test_ppos_stage_4_runs_once_even_when_stage_3_needs_it(small_policy, kl_in_reward):
    """With the KL in the reward, stage 3 runs stage 4's pass and hands it on in its result: one pass a step."""
    model, tok = small_policy
    config = small_config(beta=0.1 if kl_in_reward else 0.0)
    step = Counted(model, tok, length_reward, config, settings=PPOSettings(kl_in_reward=kl_in_reward))
    row = step(ROWS, StepState(), [])
    assert step.calls == 1
    assert (step.kept.scores is not None) == kl_in_reward
    assert step.kept.values.shape == step.kept.returns.shape == step.kept.old_values.shape
    assert row["advantage_var"] == step.kept.row["advantage_var"]  # stage 3's fields reach the row
    assert list(row)[-6:] == ["explained_variance", "advantage_var", "value_mean",  # stage 3's, then stage 5's
                              "value_loss", "value_clipfrac", "value_grad_norm"]
    assert step.last_batch[4].tolist() == step.kept.per_completion().tolist()


def test_a_stage_of_ones_own_adds_row_fields_through_its_result(small_policy):
    """The extension pattern: override one stage, put its fields in the result's ``row``."""

    class Measured(GRPOStep):
        def advantages(self, rewards: Rewards) -> Advantages:
            out = super().advantages(rewards)
            out.row["advantage_abs_max"] = float(out.values.abs().max())
            return out

        def update(self, rollout, scores, advantages, state) -> Updates:
            out = super().update(rollout, scores, advantages, state)
            out.row["updates_made"] = float(len(out.losses))
            return out

    model, tok = small_policy
    row = Measured(model, tok, length_reward, small_config())(ROWS, StepState(), [])
    assert row["updates_made"] == 1.0 and row["advantage_abs_max"] > 0
    assert list(row)[-2:] == ["advantage_abs_max", "updates_made"]


def test_dynamic_samplings_kept_groups_carry_their_own_columns_and_flags(make_small_policy):
    """The rounds' kept groups: answers, extra columns and zero-std flags follow their groups, as the rewards do; a
    column some round's batch lacks (a batch keeps a column only if every row has it) is left out, not an error."""

    class Kept(GRPOStep):
        def advantages(self, rewards: Rewards) -> Advantages:
            self.kept.append(rewards)
            return super().advantages(rewards)

    model, tok = make_small_policy(seed=0)
    config = small_config(dynamic_sampling=True, max_sampling_rounds=4, seed=1)
    step = Kept(model, tok, lambda completions, **kw: [float(len(c) % 2) for c in completions], config)
    step.kept = []
    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a), **({"tag": f"t{a}"} if a % 5 else {})} for a in range(1, 40)]
    trainer = GRPOTrainer(model, tok, step.reward_fns, config, step=step)
    trainer.train(rows, 6, progress=False)
    G = config.group_size
    merged = [(row, kept) for row, kept in zip(trainer.history, step.kept)
              if row["groups_drawn"] > config.prompts_per_step]
    assert len(merged) >= 2  # steps that drew more rounds (and kept groups of several)
    for row, kept in merged:
        assert row["groups_drawn"] == kept.groups_drawn and kept.step == row["step"] - 1
        assert kept.zero_std.tolist() == zero_std_groups(kept.rewards, G).tolist()
        assert len(kept.answers) == len(kept.rollout.prompts) == G * config.prompts_per_step
        for i, answer in enumerate(kept.answers):
            assert kept.rollout.prompts[i] == f"{int(answer) // 2}+{int(answer) // 2}="  # each row's own answer
            if "tag" in kept.columns:
                assert kept.columns["tag"][i] == f"t{int(answer) // 2}"  # and its own column
    assert any("tag" not in kept.columns for _, kept in merged)  # a round drew a row without the column
    assert any("tag" in kept.columns for _, kept in merged)


def test_the_kept_groups_columns_are_those_every_round_has(small_policy):
    """Round 0's batch has a column a later round's lacks; a group of each is kept: the column is left out (it
    raised a KeyError), the column both have follows the kept groups, as the answers and the flags do."""
    import dataclasses

    from grpo_tutorial.dynamic_sampling import keep_signal_groups
    from grpo_tutorial.rollout import pad_token_id

    model, tok = small_policy
    config = small_config(dynamic_sampling=True, seed=1)
    step, state, G = GRPOStep(model, tok, length_reward, config), StepState(), config.group_size
    first = [{"prompt": "12+34=", "answer": "46", "tag": "a", "level": 1},
             {"prompt": "7+5=", "answer": "12", "tag": "b", "level": 2}]
    later = [{"prompt": "3+3=", "answer": "6", "level": 3}, {"prompt": "9+1=", "answer": "10", "level": 4}]
    rounds = [step.reward(first, step.sample(first, 0), state), step.reward(later, step.sample(later, 0, 1), state)]
    rounds = [dataclasses.replace(rounds[0], zero_std=torch.tensor([True, False])),  # round 0's second group has a
              dataclasses.replace(rounds[1], zero_std=torch.tensor([False, True]))]  # signal, round 1's first
    kept = keep_signal_groups(rounds, G, 2, pad_token_id(tok))
    assert set(kept.columns) == {"level"}
    assert kept.columns["level"] == [2] * G + [3] * G and kept.answers == ["12"] * G + ["6"] * G
    assert kept.zero_std.tolist() == [False, False] and kept.groups_drawn == 4 and kept.step == 0
    assert kept.rollout.prompts == ["7+5="] * G + ["3+3="] * G

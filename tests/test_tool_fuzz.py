"""Fuzzers for the tool path (issue 54): nothing the model writes or a tool does raises out of the loop.

Three fuzzers, each with a fixed budget of cases (``hypothesis``, derandomized so that CI draws the same cases):

* the inline route end to end: the small tiny model, scripted to write text rich in the call syntax (``<<``, ``=``,
  ``>>``, digits, the error mark), with the calculator or a hostile tool (one that raises, hangs past a short limit,
  answers ten megabytes, text the vocabulary cannot write, an object whose ``str()`` raises, an error result of its
  own). Every rollout keeps its invariants: each completion within its budget, the tool's tokens exactly where
  the tool wrote, failures never more than calls, the loss mask ``completion_mask * tool_mask``.
* the chat route's parser: token streams rich in TRL's call syntax (``<tool_call>``, braces, brackets, quotes,
  backslash escapes, surrogate escapes), read by TRL's own parser through ``ChatCalls``.
* the tools' answers: every kind of result (any text, surrogates included; huge; unprintable; lists; error dicts)
  and exception, turned into the tokens that answer a call on both routes.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_tutorial.tools.calculator import calculator
from grpo_tutorial.models import TINY_TOOL_CHARS
from grpo_tutorial.tools import ToolBox, generate_tool_rollouts
from grpo_tutorial.tools.loop import _answer

from test_tools import Script

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
BUDGET = 24

#: Text the inline model writes: pieces of the call syntax and of numbers, in any order.
PIECES = st.sampled_from(["<<", "=", ">>", "<", ">", "?", "*", "+", "-", "(", ")", " ", "1", "23", "456", "0"])
INLINE_TEXT = st.lists(PIECES, max_size=14).map("".join)

_release = threading.Event()


def _hangs(expression: str) -> str:
    _release.wait(2)
    return "1"


class _Unprintable:
    def __str__(self):
        raise RuntimeError("no text")

    __repr__ = __str__


def _tool(kind: str):
    """A one-argument tool of each behaviour, named ``calculator`` (the inline route's one tool)."""
    behaviours = {
        "calculator": calculator,
        "raises": lambda expression: (_ for _ in ()).throw(RuntimeError("boom")),
        "hangs": _hangs,
        "huge": lambda expression: "9" * 10_000_000,
        "unwritable": lambda expression: "2.5\u0663<eos>",
        "unprintable": lambda expression: _Unprintable(),
        "error": lambda expression: {"error": "no"},
        "none": lambda expression: None,
    }
    fn = behaviours[kind]

    def calculator_(expression: str):
        return fn(expression)
    calculator_.__name__ = "calculator"
    return calculator_


@pytest.fixture(scope="module")
def tool_model(make_small_policy):
    return make_small_policy(seed=0, vocab=TINY_TOOL_CHARS)


@FUZZ
@given(targets=st.lists(INLINE_TEXT, min_size=1, max_size=3), kind=st.sampled_from(
    ["calculator", "calculator", "raises", "hangs", "huge", "unwritable", "unprintable", "error", "none"]))
def test_the_inline_route_keeps_its_invariants_whatever_is_written(tool_model, targets, kind):
    model, tok = tool_model
    prompts = [f"{k + 1}*{k + 2}=" for k in range(len(targets))]
    script = dict(zip(prompts, targets))
    box = ToolBox.build([_tool(kind)], tok, chat=False, time_limit=0.02, rollout_time_limit=0.2)
    start = time.perf_counter()
    rollout = generate_tool_rollouts(model, tok, prompts, box, group_size=1, max_new_tokens=BUDGET, generator_seed=1,
                                     logits_processor=[Script(tok, script)])
    assert time.perf_counter() - start < 10
    kept = rollout.completion_mask.sum(dim=1)
    assert (kept <= BUDGET).all()
    assert torch.equal(rollout.loss_mask, rollout.completion_mask * rollout.tool_mask)
    assert (rollout.tool_failures <= rollout.tool_calls).all()
    assert ((rollout.tool_mask == 0) <= (rollout.completion_mask == 1)).all()  # the tool writes only kept tokens
    for i, (prompt, target) in enumerate(zip(prompts, targets)):
        n = int(kept[i])
        ids, tool = rollout.completion_ids[i, :n].tolist(), rollout.tool_mask[i, :n].tolist()
        policy = tok.decode([t for t, m in zip(ids, tool) if m], skip_special_tokens=True)
        assert target.startswith(policy) or policy.startswith(target[: len(policy)])  # the script's, and only it
        if kind != "calculator":  # a hostile tool's answer is the error mark or nothing
            written = tok.decode([t for t, m in zip(ids, tool) if not m])
            assert written in ("", "?>>") or set(written) <= set("?>") or kind in ("none",), (kind, written)


#: Pieces of TRL's call syntax for the Qwen2.5 template, and of JSON, for the chat route's parser.
CHAT_PIECES = st.sampled_from([
    "<tool_call>", "</tool_call>", "\n", "{", "}", "[", "]", '"', ":", ",", " ", "name", "arguments", "calculator",
    "expression", "1+1", "\\", "\\u", "d800", "\\ud800", "null", "true", "0", "9" * 20, "[" * 300, "]" * 300,
])


@pytest.fixture(scope="module")
def chat_box():
    pytest.importorskip("trl")
    from trl.chat_template_utils import qwen2_5_chat_template

    from test_gsm8k_run import smollm2_tokenizer

    tok = smollm2_tokenizer()
    tok.chat_template = qwen2_5_chat_template
    box = ToolBox.build([calculator], tok, chat=True, time_limit=0.05)
    prefix = tok.apply_chat_template([{"role": "user", "content": "What is 1+1?"}], tools=[calculator],
                                     add_generation_prompt=True, tokenize=False)
    return tok, box, tok(prefix, add_special_tokens=False)["input_ids"]


#: A call in the template's syntax whose name and argument are anything JSON can spell (escapes, nesting, numbers).
JSON_VALUES = st.recursive(st.one_of(st.integers(), st.text(max_size=8).map(lambda t: t.replace('"', "")), st.none()),
                           lambda inner: st.lists(inner, max_size=3), max_leaves=8)
NAMES = st.sampled_from(["calculator", "weather", "\\ud800", "", "\\u0000", "calc\\nulator"])
WELL_FORMED = st.builds(
    lambda name, value, copies: ('<tool_call>\n{"name": "' + name + '", "arguments": {"expression": '
                                 + __import__("json").dumps(value) + '}}\n</tool_call>\n') * copies,
    NAMES, JSON_VALUES, st.integers(1, 3))
CHAT_TEXT = st.one_of(st.lists(CHAT_PIECES, max_size=40).map("".join), WELL_FORMED)


@FUZZ
@given(text=CHAT_TEXT, ended=st.booleans())
def test_the_chat_parser_never_raises_and_its_calls_are_answered(chat_box, text, ended):
    tok, box, prefix = chat_box
    turn = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if ended else [])
    calls = box.syntax.calls(tok, prefix, turn, ended, box.tools)
    assert calls is None or (isinstance(calls, list) and all(isinstance(c, dict) for c in calls))
    if calls:
        made, failed = [0], [0]
        suffixes = _answer(box, tok, {0: calls}, {}, time.monotonic() + 5, made, failed, {0: 400})
        assert made == [len(calls)] and failed[0] <= made[0]
        assert set(suffixes) <= {0} and all(isinstance(t, int) for t in suffixes.get(0, []))


#: Anything a tool may answer: text of any kind (surrogates included), numbers, containers, nothing, an error.
RESULTS = st.one_of(
    st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=30),
    st.integers(), st.floats(allow_nan=True), st.none(), st.binary(max_size=10),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.builds(lambda s: {"error": s}, st.text(max_size=10)), st.just(_Unprintable()),
    st.just("7" * 2_000_000),
)


@FUZZ
@given(result=RESULTS, raises=st.booleans())
def test_any_answer_or_exception_becomes_tokens_or_a_rollback(tool_model, chat_box, result, raises):
    for tok, box, room in ((tool_model[1], ToolBox.build([_tool("calculator")], tool_model[1], chat=False), 20),
                           (chat_box[0], chat_box[1], 200)):
        name = next(iter(box.tools))

        def tool(**arguments):
            if raises:
                raise RuntimeError(result)
            return result

        box.tools = {name: tool}
        call = {"type": "function", "function": {"name": name, "arguments": {"expression": "1"}}}
        made, failed = [0], [0]
        suffixes = _answer(box, tok, {0: [call]}, {}, None, made, failed, {0: room})
        assert made == [1] and failed[0] <= 1
        assert len(suffixes.get(0, [])) <= room
        if raises:
            assert failed == [1]

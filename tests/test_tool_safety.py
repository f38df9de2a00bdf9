"""The tool path under hostile model output and careless tools (issue 54): nothing raises out of the loop, and no
call costs more than its bounds.

Each test here failed on the code before issue 54 (the item it names is the issue's). The model's turns are
scripted (``tests/test_tools.py``'s ``Script``), so each test writes exactly the text it means to; the chat route's
cases are in ``tests/test_chat_tools.py`` (they need TRL's parser and a chat template), and the fuzzers in
``tests/test_tool_fuzz.py``.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from grpo_tutorial import GRPOConfig
from grpo_tutorial.tools.calculator import (
    MAX_ABANDONED, ToolTimeout, abandoned_calls, calculator, call_with_time_limit, run_tool_call, safe_text,
)
from grpo_tutorial.models import TINY_TOOL_CHARS
from grpo_tutorial.tools import ToolBox, generate_tool_rollouts, writable

from test_tools import Script, scripted


@pytest.fixture
def tool_policy(make_small_policy):
    """The small tiny Qwen2 with chapter 16's vocabulary."""
    return make_small_policy(seed=0, vocab=TINY_TOOL_CHARS)


def answering(text):
    """A one-argument tool that answers ``text`` (or what ``text()`` returns), whatever it is asked."""
    def calculator(expression: str):
        return text() if callable(text) else text
    return calculator


# ---------------------------------------------------------------------------------------------------- item 3


def test_a_time_limit_past_what_a_thread_can_wait_is_refused_everywhere(tool_policy):
    _, tok = tool_policy
    too_long = threading.TIMEOUT_MAX * 2
    for build in (lambda: GRPOConfig(tool_time_limit=too_long), lambda: GRPOConfig(tool_rollout_time_limit=too_long),
                  lambda: ToolBox.build([calculator], tok, chat=False, time_limit=too_long),
                  lambda: call_with_time_limit(calculator, {"expression": "1"}, too_long),
                  lambda: run_tool_call({"calculator": calculator}, "calculator", {"expression": "1"}, too_long)):
        with pytest.raises(ValueError, match="TIMEOUT_MAX"):
            build()
    assert GRPOConfig(tool_time_limit=threading.TIMEOUT_MAX).tool_time_limit == threading.TIMEOUT_MAX


# ---------------------------------------------------------------------------------------------------- item 4


def test_an_inline_tools_signature_is_checked_when_the_box_is_built(tool_policy):
    _, tok = tool_policy

    def two(a: str, b: str) -> str:
        return a + b

    def none() -> str:
        return "1"

    for tool, why in ((two, "one required argument by name"), (none, "one required argument by name"),
                      (max, "no signature Python can read")):
        with pytest.raises(ValueError, match=why):
            ToolBox.build([tool], tok, chat=False)

    def defaulted(expression: str, places: int = 2) -> str:  # one required argument: taken
        return expression

    assert ToolBox.build([defaulted], tok, chat=False).tools == {"defaulted": defaulted}


# ---------------------------------------------------------------------------------------------------- item 5


def test_a_huge_result_is_rolled_back_without_being_tokenized(tool_policy, monkeypatch):
    """Ten megabytes of digits cannot fit in a 30-token budget: rolled back before the tokenizer reads it."""
    model, tok = tool_policy
    read = []
    real = type(tok).__call__

    def counting(self, text, *args, **kwargs):
        read.append(len(text) if isinstance(text, str) else sum(len(t) for t in text))
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tok), "__call__", counting)
    start = time.perf_counter()
    rollout = scripted(model, tok, {"3*4=": "<<3*4=12>>12"}, tools=[answering("7" * 10_000_000)])
    assert time.perf_counter() - start < 20  # it took 32 s before: tokenizing 10 MB
    assert max(read) < 1000  # only the prompts and the script's short texts were tokenized
    assert rollout.completions == ["<<3*4="] * 2 and rollout.tool_calls.tolist() == [1, 1]  # rolled back


def test_a_result_that_fits_is_still_written(tool_policy):
    model, tok = tool_policy
    rollout = scripted(model, tok, {"3*4=": "<<3*4=12>>12"}, tools=[answering("12")])
    assert rollout.completions == ["<<3*4=12>>12"] * 2 and rollout.tool_failures.tolist() == [0, 0]


# ---------------------------------------------------------------------------------------------------- item 6


@pytest.mark.parametrize("result", ["2.5", "12<eos>3", "\u0663", "ab"])
def test_a_result_the_vocabulary_cannot_write_becomes_a_counted_error(tool_policy, result):
    """'2.5' used to reach the completion as '25' (the '.' lost to <unk>), a literal '<eos>' as a real EOS: now the
    model reads the error result ('?') and the call counts as a failure."""
    model, tok = tool_policy
    assert not writable(tok, result) and writable(tok, "25")
    rollout = scripted(model, tok, {"3*4=": "<<3*4=?>>12"}, tools=[answering(result)])
    assert rollout.completions == ["<<3*4=?>>12"] * 2
    assert rollout.tool_failures.tolist() == [1, 1] and rollout.tool_calls.tolist() == [1, 1]


# ---------------------------------------------------------------------------------------------------- item 7


class Unprintable:
    def __str__(self):
        raise RuntimeError("no text")

    def __repr__(self):
        raise RuntimeError("no repr either")


class Unsayable(Exception):
    def __str__(self):
        raise RuntimeError("an exception whose message raises")


def test_a_result_or_an_exception_whose_str_raises_gives_an_error_result(tool_policy):
    model, tok = tool_policy

    def raises_unsayable(expression: str):
        raise Unsayable()

    for tool in (answering(Unprintable), raises_unsayable):
        rollout = scripted(model, tok, {"3*4=": "<<3*4=?>>12"}, tools=[tool])
        assert rollout.completions == ["<<3*4=?>>12"] * 2 and rollout.tool_failures.tolist() == [1, 1]
    assert safe_text(Unprintable()) == "<an unprintable Unprintable>"
    assert safe_text("a\ud800b") == "a\\ud800b"  # a lone surrogate: escaped, so the tokenizer takes it


# ---------------------------------------------------------------------------------------------------- item 8


def test_a_rollouts_calls_share_one_deadline(tool_policy):
    """Two rows that each call a tool that hangs: at a 1 s limit per call the old loop waited 2 s per round; with
    the rollout's deadline at 0.5 s the calls after it are answered at once, as errors."""
    model, tok = tool_policy
    release = threading.Event()

    def hangs(expression: str) -> str:
        release.wait(10)
        return "12"

    start = time.perf_counter()
    try:
        rollout = scripted(model, tok, {"3*4=": "<<3*4=?>>12", "5*6=": "<<5*6=?>>30"}, tools=[hangs], time_limit=1.0,
                           rollout_time_limit=0.5)
    finally:
        release.set()
    assert time.perf_counter() - start < 3.0  # four calls at 1 s each would be over 4 s
    assert rollout.tool_failures.tolist() == [1, 1, 1, 1]


def test_calls_left_running_are_capped(monkeypatch):
    """A thread cannot be killed: a call past its limit runs on. Past MAX_ABANDONED of them, no call is started."""
    import grpo_tutorial.tools.calculator as calc

    release = threading.Event()
    started = []

    def hangs(expression: str) -> str:
        started.append(1)
        release.wait(10)
        return "1"

    monkeypatch.setattr(calc, "MAX_ABANDONED", 3)
    try:
        for _ in range(3):
            assert run_tool_call({"hangs": hangs}, "hangs", {"expression": "1"}, 0.01)[1]
        assert abandoned_calls() >= 3
        result, failed = run_tool_call({"hangs": hangs}, "hangs", {"expression": "1"}, 0.01)
        assert failed and "still running" in result["error"] and len(started) == 3  # not started
    finally:
        release.set()
    for _ in range(100):  # the abandoned calls end once released, and the cap frees up
        if abandoned_calls() == 0:
            break
        time.sleep(0.05)
    assert abandoned_calls() == 0 and MAX_ABANDONED == 16
    with pytest.raises(ToolTimeout):
        call_with_time_limit(lambda expression: time.sleep(0.5), {"expression": "1"}, 0.01)


# ---------------------------------------------------------------------------------------------------- item 9


def test_a_continuation_round_never_generates_past_the_models_context(make_small_policy, monkeypatch):
    """Rows of different lengths in one continuation round: each row's positions advance with the longest row's
    budget; the round stops at the model's context and the rows still writing go on in another call."""
    import grpo_tutorial.tools.loop as tools_module

    model, tok = make_small_policy(seed=0, vocab=TINY_TOOL_CHARS)
    context = model.config.max_position_embeddings
    reached = []
    real = tools_module.generate_from_ids

    def watching(model, tokenizer, rows, *, max_new_tokens, **kwargs):
        reached.append(max(len(row) for row in rows) + max_new_tokens)
        return real(model, tokenizer, rows, max_new_tokens=max_new_tokens, **kwargs)

    monkeypatch.setattr(tools_module, "generate_from_ids", watching)
    budget = 22
    long_prompt = "1" * (context - budget - len(tok("*2=")["input_ids"])) + "*2="  # prompt + budget = the context
    assert len(tok(long_prompt)["input_ids"]) + budget == context
    # after the tool: the short row has used 7 tokens of its budget, the long one 13; a round generating to the
    # short row's remaining budget would take the long row 6 positions past the context
    targets = {"3*4=": "<<3=3>>" + "1" * 12, long_prompt: "<<111*2=222>>2"}
    rollout = scripted(model, tok, targets, max_new_tokens=budget)
    assert reached and max(reached) <= context  # the old loop reached the context + 6 here
    assert rollout.completions == ["<<3=3>>" + "1" * 12] * 2 + ["<<111*2=222>>2"] * 2  # all written, over two calls
    assert len(reached) == 2  # the round, in two calls: the second for the short rows alone
    assert not rollout.truncated.any()


# ---------------------------------------------------------------------------------------------------- item 10


def test_a_tool_that_answers_with_an_error_result_counts_a_failure(tool_policy):
    model, tok = tool_policy
    rollout = scripted(model, tok, {"3*4=": "<<3*4=?>>12"}, tools=[answering({"error": "bad input"})])
    assert rollout.completions == ["<<3*4=?>>12"] * 2 and rollout.tool_failures.tolist() == [1, 1]


# ---------------------------------------------------------------------------------------------------- the guard


def test_a_call_already_answered_is_not_run_again(tool_policy):
    """A sampler that makes a rollout again (the float16 copy's float32 fallback) passes the calls it answered:
    the same call of the same row is not run twice."""
    model, tok = tool_policy
    runs = []

    def counted(expression: str) -> str:
        runs.append(expression)
        return calculator(expression)

    answered = {}
    toolbox = ToolBox.build([counted], tok, chat=False)
    targets = {"3*4=": "<<3*4=12>>12"}
    for _ in range(2):
        rollout = generate_tool_rollouts(model, tok, list(targets), toolbox, group_size=2, max_new_tokens=30,
                                         generator_seed=1, logits_processor=[Script(tok, targets)], answered=answered)
        assert rollout.completions == ["<<3*4=12>>12"] * 2
    assert runs == ["3*4", "3*4"]  # one per row, once
    assert torch.equal(rollout.tool_calls, torch.tensor([1, 1]))

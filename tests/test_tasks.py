"""The step's input (before stage 1): generated datasets, the Countdown verifier, GSM8K offline, dataset validation."""

from __future__ import annotations

import builtins
import operator
import os
import re
import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import grpo_tutorial.pretrained as pretrained
import grpo_tutorial.tasks as tasks
from grpo_tutorial.models import build_char_tokenizer
from grpo_tutorial.tasks import (
    DatasetUnavailableError,
    countdown_expression,
    countdown_reward,
    evaluate_expression,
    gsm8k_final_answer,
    load_gsm8k,
    make_arithmetic_dataset,
    make_countdown_dataset,
    train_test_split_arithmetic,
    validate_dataset,
)

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
PLAIN_RE = re.compile(r"(\d+)([-+*])(\d+)=")
QUESTION_RE = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")

# ---------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------


def _recompute(row: dict, style: str) -> tuple[int, str, int, str]:
    """Parse the prompt text alone and redo the sum: an independent check."""
    m = (PLAIN_RE if style == "plain" else QUESTION_RE).fullmatch(row["prompt"])
    assert m, row["prompt"]
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return a, op, b, str(OPS[op](a, b))


def test_arithmetic_rows_are_correct_and_plain():
    rows = make_arithmetic_dataset(200, seed=0)
    assert len(rows) == 200
    for row in rows:
        a, op, b, answer = _recompute(row, "plain")
        assert (row["a"], row["op"], row["b"], row["answer"]) == (a, op, b, answer)
        assert op == "+" and 0 <= a <= 99 and 0 <= b <= 99
        assert set(row["prompt"]) <= set("0123456789+-*=() ")


def test_arithmetic_question_style():
    rows = make_arithmetic_dataset(20, seed=1, op="*", style="question")
    for row in rows:
        a, op, b, answer = _recompute(row, "question")
        assert op == "*" and row["answer"] == answer == str(a * b)


def test_arithmetic_is_deterministic_per_seed():
    assert make_arithmetic_dataset(50, seed=7) == make_arithmetic_dataset(50, seed=7)
    assert make_arithmetic_dataset(50, seed=7) != make_arithmetic_dataset(50, seed=8)
    # the larger-space (rejection sampling) path too
    kw = dict(digits=3, op=["+", "-"], unique=True)
    assert make_arithmetic_dataset(30, seed=3, **kw) == make_arithmetic_dataset(30, seed=3, **kw)


def test_arithmetic_digits_one_means_zero_to_nine():
    rows = make_arithmetic_dataset(500, seed=0, digits=1)
    operands = {row["a"] for row in rows} | {row["b"] for row in rows}
    assert operands == set(range(10))


def test_arithmetic_subtraction_sign_control():
    rows = make_arithmetic_dataset(300, seed=0, op="-")
    assert any(row["answer"].startswith("-") for row in rows)  # negatives allowed by default
    rows = make_arithmetic_dataset(300, seed=0, op="-", allow_negative=False)
    assert all(int(row["answer"]) >= 0 for row in rows)
    big = make_arithmetic_dataset(300, seed=0, op="-", digits=3, allow_negative=False)
    assert all(int(row["answer"]) >= 0 for row in big)


def test_arithmetic_mixed_ops():
    rows = make_arithmetic_dataset(200, seed=0, op=["+", "-", "*"], digits=1)
    assert {row["op"] for row in rows} == {"+", "-", "*"}
    for row in rows:
        assert _recompute(row, "plain")[3] == row["answer"]


def test_arithmetic_unique_and_exclude():
    rows = make_arithmetic_dataset(100, seed=0, digits=1, unique=True)
    assert len({row["prompt"] for row in rows}) == 100  # all 10 x 10 problems, once each
    with pytest.raises(ValueError, match="n=101 unique problems requested but only 100 exist"):
        make_arithmetic_dataset(101, seed=0, digits=1, unique=True)
    banned = {f"{a}+{b}=" for a in range(10) for b in range(10) if a != 3}
    rows = make_arithmetic_dataset(50, seed=0, digits=1, exclude=banned)
    assert {row["a"] for row in rows} == {3}
    with pytest.raises(ValueError, match="exclude removes every possible problem"):
        make_arithmetic_dataset(5, seed=0, digits=1, exclude=banned | {f"3+{b}=" for b in range(10)})


def test_train_test_split_is_disjoint_and_deterministic():
    train, test = train_test_split_arithmetic(2000, 90, seed=0, digits=1)
    assert len(train) == 2000 and len(test) == 90
    test_prompts = {row["prompt"] for row in test}
    assert len(test_prompts) == 90
    assert not test_prompts & {row["prompt"] for row in train}
    assert {row["prompt"] for row in train} == {f"{a}+{b}=" for a in range(10) for b in range(10)} - test_prompts
    assert train_test_split_arithmetic(2000, 90, seed=0, digits=1) == (train, test)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(n=0, seed=0), ValueError, "n must be an int >= 1, got 0"),
        (dict(n=True, seed=0), TypeError, r"n must be an int >= 1, got True \(type bool\)"),
        (dict(n=2.0, seed=0), TypeError, r"n must be an int >= 1, got 2.0 \(type float\)"),
        (dict(n=2, seed=0, digits=0), ValueError, "digits must be an int >= 1, got 0"),
        (dict(n=2, seed=0, op="/"), ValueError, r"op must be one of \['\*', '\+', '-'\] or a list of them, got '/'"),
        (dict(n=2, seed=0, op=[]), ValueError, "op must be one of"),
        (dict(n=2, seed=0, style="latex"), ValueError, r"style must be one of \['plain', 'question'\], got 'latex'"),
        (dict(n=2, seed=0, exclude="1+1="), TypeError, "exclude must be a set or list of prompt strings, got str"),
        (dict(n=2, seed="0"), TypeError, r"seed must be an int, got '0' \(type str\)"),
    ],
)
def test_arithmetic_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        make_arithmetic_dataset(**kwargs)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32),
    op=st.sampled_from(["+", "-", "*"]),
    digits=st.integers(min_value=1, max_value=4),
    style=st.sampled_from(["plain", "question"]),
)
def test_arithmetic_answers_are_always_correct(seed, op, digits, style):
    for row in make_arithmetic_dataset(5, seed, op=op, digits=digits, style=style):
        a, parsed_op, b, answer = _recompute(row, style)
        assert parsed_op == op and a < 10**digits and b < 10**digits
        assert row["answer"] == answer


# ---------------------------------------------------------------------------
# Countdown: the safe evaluator
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr, value, used",
    [
        ("(3 + 5) * 2 / 4", Fraction(4), [3, 5, 2, 4]),
        ("7 / 2", Fraction(7, 2), [7, 2]),
        ("10 - 2 - 3", Fraction(5), [10, 2, 3]),  # left-associative
        ("10 - (2 - 3)", Fraction(11), [10, 2, 3]),
        ("2 + 3 * 4", Fraction(14), [2, 3, 4]),  # precedence
        ("6 \u00d7 7", Fraction(42), [6, 7]),  # the times sign
        ("8 \u00f7 2", Fraction(4), [8, 2]),  # the division sign
        ("((((5))))", Fraction(5), [5]),
    ],
)
def test_evaluate_expression_exact(expr, value, used):
    assert evaluate_expression(expr) == (value, used)


@pytest.mark.parametrize(
    "expr, message",
    [
        ("__import__('os').system('x')", "contains"),
        ("open('/etc/passwd').read()", "contains"),
        ("2 ** 3", "uses the operator Pow"),
        ("7 // 2", "uses the operator FloorDiv"),
        ("-3 + 5", "uses UnaryOp"),
        ("1_000", r"contains \['_'\]"),
        ("1.5 * 2", r"contains \['.'\]"),
        ("1 / (2 - 2)", "divides by zero"),
        ("(1 + 2", "is not a valid expression"),
        ("1 2", "is not a valid expression"),
        ("", "expr is empty"),
        ("1+" * 150 + "1", "at most 200 are allowed"),
        ("(" * 150 + "1" + ")" * 150, "at most 200 are allowed"),
    ],
)
def test_evaluate_expression_rejects(expr, message):
    with pytest.raises(ValueError, match=message):
        evaluate_expression(expr)


def test_malicious_expression_is_never_executed(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a))
    monkeypatch.setattr(builtins, "eval", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(builtins, "exec", lambda *a, **k: calls.append(a))
    completions = ["<answer>__import__('os').system('x')</answer>", "__import__('os').system('x')"]
    assert countdown_reward(completions, numbers=[[1, 2], [1, 2]], target=[3, 3]) == [0.0, 0.0]
    assert calls == []


def test_ast_whitelist_holds_even_without_the_character_filter(monkeypatch):
    # defence in depth: with the character filter switched off, the AST walk alone rejects code
    monkeypatch.setattr(tasks, "_EXPRESSION_CHARS", frozenset(map(chr, range(32, 127))))
    for expr, node in [
        ("__import__('os').system('x')", "Call"),
        ("x + 1", "Name"),
        ("(1).real", "Attribute"),
        ("'a' + 'b'", "Constant"),
        ("True + 1", "Constant"),
        ("1.5 + 1", "Constant"),
        ("[1, 2]", "List"),
    ]:
        with pytest.raises(ValueError, match=f"uses {node}, which is not allowed"):
            evaluate_expression(expr)


# ---------------------------------------------------------------------------
# Countdown: the reward and the generator
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, score",
    [
        ("<answer>(7 - 3) * 2</answer>", 1.0),
        ("<think>try</think><answer>2 * (7 - 3)</answer>", 1.0),
        ("I think it is\n(7 - 3) * 2 = 8", 1.0),  # last line, trailing "= 8" dropped
        ("<answer>(7 - 3) * 2 = 8</answer>", 1.0),
        ("<answer>7 * 2 - 3 * 2</answer>", 0.0),  # reuses 2
        ("<answer>7 - 3 + 2</answer>", 0.0),  # right numbers, wrong value (8 is the goal)
        ("<answer>(7 - 3) * 2 + 0</answer>", 0.0),  # an extra number
        ("<answer>7 + 1</answer>", 0.0),  # 1 is not given, 3 and 2 unused
        ("<answer>8</answer>", 0.0),
        ("<answer>(7 - 3) * 2</answer> then <answer>8</answer>", 0.0),  # the last tag counts
        ("", 0.0),
        ("<answer>2 ** 3</answer>", 0.0),
    ],
)
def test_countdown_reward_cases(completion, score):
    assert countdown_reward([completion], numbers=[[7, 3, 2]], target=[8]) == [score]


def test_countdown_reward_division_and_exact_fractions():
    # 3 / 2 * 4 = 6 exactly: the verifier uses fractions, so 3/2 is not rounded
    assert countdown_reward(["<answer>3 / 2 * 4</answer>"], numbers=[[3, 2, 4]], target=[6]) == [1.0]
    assert countdown_reward(["<answer>(8 / 2) * 3</answer>"], numbers=[[8, 2, 3]], answer=["12"]) == [1.0]
    assert countdown_reward(["<answer>7 / 2 + 1</answer>"], numbers=[[7, 2, 1]], target=[4]) == [0.0]  # 4.5


def test_countdown_reward_repeated_numbers_must_each_be_used():
    assert countdown_reward(["<answer>5 + 5</answer>"], numbers=[[5, 5]], target=[10]) == [1.0]
    assert countdown_reward(["<answer>5 * 2</answer>"], numbers=[[5, 5]], target=[10]) == [0.0]
    assert countdown_reward(["<answer>5 + 5 + 5</answer>"], numbers=[[5, 5]], target=[15]) == [0.0]


def test_countdown_reward_chat_format_and_bad_arguments():
    chat = [[{"role": "assistant", "content": "<answer>1 + 2</answer>"}]]
    assert countdown_reward(chat, numbers=[[1, 2]], answer=["3"], prompts=["p"]) == [1.0]
    with pytest.raises(TypeError, match="countdown_reward needs target="):
        countdown_reward(["1+2"], numbers=[[1, 2]])
    with pytest.raises(ValueError, match="numbers has 1 items but there are 2 completions"):
        countdown_reward(["1+2", "1+2"], numbers=[[1, 2]], target=[3, 3])
    with pytest.raises(ValueError, match="target has 2 items but there are 1 completions"):
        countdown_reward(["1+2"], numbers=[[1, 2]], target=[3, 3])
    with pytest.raises(ValueError, match=r"target\[0\] must be a number, got 'three'"):
        countdown_reward(["1+2"], numbers=[[1, 2]], target=["three"])


def test_countdown_expression_extraction():
    assert countdown_expression("<answer> 1 + 2 </answer>") == "1 + 2"
    assert countdown_expression("work\n\n(1 + 2) * 3 = 9\n\n") == "(1 + 2) * 3"
    assert countdown_expression("   \n") is None
    assert countdown_expression("<answer>= 9</answer>") is None


def test_countdown_dataset_rows():
    rows = make_countdown_dataset(50, seed=0, num_numbers=4, max_number=12, ops=("+", "-", "*", "/"))
    assert rows == make_countdown_dataset(50, seed=0, num_numbers=4, max_number=12, ops=("+", "-", "*", "/"))
    for row in rows:
        assert len(row["numbers"]) == 4 and all(1 <= x <= 12 for x in row["numbers"])
        assert row["answer"] == str(row["target"]) and row["target"] >= 1
        assert str(row["numbers"]) in row["prompt"] and str(row["target"]) in row["prompt"]
        value, used = evaluate_expression(row["solution"])
        assert value == row["target"] and sorted(used) == sorted(row["numbers"])
    completions = [f"<answer>{row['solution']}</answer>" for row in rows]
    assert countdown_reward(
        completions, numbers=[r["numbers"] for r in rows], target=[r["target"] for r in rows]
    ) == [1.0] * 50


def test_countdown_max_target():
    rows = make_countdown_dataset(100, seed=0, num_numbers=4, ops="*", max_target=100)
    assert all(row["target"] <= 100 for row in rows)
    assert max(r["target"] for r in make_countdown_dataset(100, seed=0, num_numbers=4, ops="*")) > 100
    with pytest.raises(ValueError, match="could not build a puzzle of 3 numbers up to 10"):
        make_countdown_dataset(1, seed=0, ops="+", max_target=2)  # three numbers >= 1 sum to >= 3


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32),
    k=st.integers(min_value=2, max_value=5),
    ops=st.sampled_from(["+", "+-", "+-*", "+-*/", "*/", "/"]),
)
def test_countdown_puzzles_are_always_solvable(seed, k, ops):
    for row in make_countdown_dataset(3, seed, num_numbers=k, ops=ops):
        assert countdown_reward(
            [row["solution"]], numbers=[row["numbers"]], answer=[row["answer"]]
        ) == [1.0]


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(n=0, seed=0), ValueError, "n must be an int >= 1, got 0"),
        (dict(n=1, seed=0, num_numbers=1), ValueError, "num_numbers must be an int >= 2, got 1"),
        (dict(n=1, seed=0, max_number=0), ValueError, "max_number must be an int >= 1, got 0"),
        (dict(n=1, seed=0, ops=("^",)), ValueError, "ops must be a non-empty list from"),
        (dict(n=1, seed=0, ops=()), ValueError, "ops must be a non-empty list from"),
        (dict(n=1, seed=0, max_target=0), ValueError, "max_target must be an int >= 1, got 0"),
    ],
)
def test_countdown_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        make_countdown_dataset(**kwargs)


# ---------------------------------------------------------------------------
# GSM8K: online only, a fast clear error offline
# ---------------------------------------------------------------------------


@pytest.fixture
def hub_flags_cleared(monkeypatch):
    for flag in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(flag, raising=False)


@pytest.fixture
def no_download(monkeypatch):
    """Make sure no test here ever reaches datasets.load_dataset for real."""
    datasets = pytest.importorskip("datasets")

    def refuse(*args, **kwargs):
        raise AssertionError("load_dataset must not be called")

    monkeypatch.setattr(datasets, "load_dataset", refuse)


@pytest.mark.parametrize("flag", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_load_gsm8k_offline_flag_fails_at_once(monkeypatch, hub_flags_cleared, no_download, flag):
    monkeypatch.setenv(flag, "1")
    start = time.perf_counter()
    with pytest.raises(DatasetUnavailableError, match=rf"{flag}='1' is set.*make_arithmetic_dataset"):
        load_gsm8k("train")
    assert time.perf_counter() - start < 1.0
    assert issubclass(DatasetUnavailableError, ConnectionError)


def test_load_gsm8k_unreachable_hub_fails_within_seconds(monkeypatch, hub_flags_cleared, no_download):
    # a real probe against a closed local port: refused at once, whatever the network
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    start = time.perf_counter()
    with pytest.raises(DatasetUnavailableError, match="could not reach the Hugging Face hub within 1 s.*make_arithmetic_dataset"):
        load_gsm8k("test", timeout=1.0)
    assert time.perf_counter() - start < 5.0


def test_load_gsm8k_maps_rows_when_online(monkeypatch, hub_flags_cleared):
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return [{"question": "Tom has 1,000 apples and eats 1. How many?", "answer": "1000-1=999\n#### 999"}]

    monkeypatch.setattr(pretrained, "hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    rows = load_gsm8k("test")
    assert calls == [(("openai/gsm8k", "main"), {"split": "test"})]
    assert rows == [
        {
            "prompt": "Tom has 1,000 apples and eats 1. How many?",
            "answer": "999",
            "solution": "1000-1=999\n#### 999",
        }
    ]


def test_load_gsm8k_bad_arguments():
    with pytest.raises(TypeError, match="split must be a str"):
        load_gsm8k(3)
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds, got 0"):
        load_gsm8k("train", timeout=0)


def test_gsm8k_final_answer():
    assert gsm8k_final_answer("2 + 3 = 5\n#### 5") == "5"
    assert gsm8k_final_answer("... \n#### 1,250") == "1250"
    assert gsm8k_final_answer("#### -3") == "-3"
    with pytest.raises(ValueError, match="must be a GSM8K answer text ending in '#### <number>'"):
        gsm8k_final_answer("no marker 5")
    with pytest.raises(ValueError, match="no number after '####'"):
        gsm8k_final_answer("#### lots")


# ---------------------------------------------------------------------------
# validate_dataset
# ---------------------------------------------------------------------------


class ChatTokenizer:
    """A stand-in with a chat template: one token per character, 3 per message of overhead."""

    model_max_length = int(1e30)  # transformers' "no limit" placeholder

    def __call__(self, text):
        return {"input_ids": list(range(len(text)))}

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and tokenize
        n = sum(len(m["content"]) + 3 for m in messages) + 2
        return {"input_ids": list(range(n))}


def test_validate_dataset_accepts_good_rows():
    assert validate_dataset(make_arithmetic_dataset(5, seed=0)) is None
    assert validate_dataset([{"prompt": [{"role": "user", "content": "hi"}], "answer": 3}]) is None


def test_validate_dataset_structure_errors():
    with pytest.raises(ValueError, match="the dataset is empty"):
        validate_dataset([])
    with pytest.raises(ValueError, match=r"dataset row 1 is missing the key 'answer' \(it has \['prompt'\]\)"):
        validate_dataset([{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2="}])
    with pytest.raises(ValueError, match=r"dataset row 0 is missing the key 'prompt' \(it has \['answer', 'question'\]\)"):
        validate_dataset([{"question": "1+1=", "answer": "2"}])
    with pytest.raises(TypeError, match="dataset row 0 must be a dict, got str"):
        validate_dataset(["1+1="])
    with pytest.raises(TypeError, match="dataset row 0: 'prompt' must be a str or a list of chat messages, got int"):
        validate_dataset([{"prompt": 5, "answer": "5"}])
    with pytest.raises(ValueError, match="dataset row 0: 'answer' is None"):
        validate_dataset([{"prompt": "1+1=", "answer": None}])
    with pytest.raises(TypeError, match="rows must be a list of dicts"):
        validate_dataset({"prompt": "1+1=", "answer": "2"})


def test_validate_dataset_prompt_length_with_real_char_tokenizer():
    tok = build_char_tokenizer(model_max_length=7)  # "12+34=" is 6 chars + <bos> = 7 tokens
    rows = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "12+34=", "answer": "46"}]
    validate_dataset(rows, tokenizer=tok)  # 7 <= 7: fits exactly
    with pytest.raises(ValueError, match=r"dataset row 1: the prompt is 7 tokens, longer than the limit of 6"):
        validate_dataset(rows, tokenizer=tok, max_prompt_tokens=6)
    tok_short = build_char_tokenizer(model_max_length=5)
    with pytest.raises(ValueError, match="dataset row 1: the prompt is 7 tokens, longer than the limit of 5"):
        validate_dataset(rows, tokenizer=tok_short)  # the model's own limit is the default


def test_validate_dataset_chat_prompts_and_placeholder_limit():
    tok = ChatTokenizer()
    rows = [{"prompt": [{"role": "user", "content": "abcd"}], "answer": "x"}]  # 4 + 3 + 2 = 9 tokens
    validate_dataset(rows, tokenizer=tok)  # the 1e30 placeholder means "no limit"
    validate_dataset(rows, tokenizer=tok, max_prompt_tokens=9)
    with pytest.raises(ValueError, match="the prompt is 9 tokens, longer than the limit of 8"):
        validate_dataset(rows, tokenizer=tok, max_prompt_tokens=8)


def test_validate_dataset_limit_needs_tokenizer():
    with pytest.raises(ValueError, match="max_prompt_tokens needs a tokenizer"):
        validate_dataset([{"prompt": "1+1=", "answer": "2"}], max_prompt_tokens=10)
    with pytest.raises(ValueError, match="max_prompt_tokens must be an int >= 1, got 0"):
        validate_dataset([{"prompt": "1+1=", "answer": "2"}], max_prompt_tokens=0)


def test_validate_dataset_accepts_a_hf_dataset():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(make_arithmetic_dataset(4, seed=0))
    assert validate_dataset(ds) is None
    with pytest.raises(ValueError, match="dataset row 0 is missing the key 'answer'"):
        validate_dataset(ds.remove_columns("answer"))

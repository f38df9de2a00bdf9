"""grpo_tutorial/answers.py: reading one number, writing it one way, and the completion and reference checks.

``tests/test_rewards.py`` holds the big table of :func:`extract_answer` and
:func:`answers_match` cases (the reward functions are built on them); this file
tests the pieces underneath: :func:`canonical_number`, :func:`parse_number`,
:func:`last_number`, :func:`last_boxed`, and the error messages of the input checks.
"""

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tutorial.answers import (
    answers_match,
    canonical_number,
    completion_texts,
    completion_to_text,
    extract_answer,
    last_boxed,
    last_number,
    parse_number,
    references_for,
)

# ---------------------------------------------------------------------------
# canonical_number: one way to write each rational
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, text",
    [
        (Fraction(12), "12"),
        (Fraction(-7), "-7"),
        (Fraction(0), "0"),
        (Fraction(7, 2), "3.5"),
        (Fraction(-7, 2), "-3.5"),
        (Fraction(1, 8), "0.125"),  # 2^3: three places
        (Fraction(-1, 20), "-0.05"),  # 2^2 * 5: two places, the leading zero kept
        (Fraction(3, 40), "0.075"),
        (Fraction(1, 1024), "0.0009765625"),  # 2^10: ten places, exact
        (Fraction(123456789, 1000), "123456.789"),
        (Fraction(1, 3), "1/3"),  # no finite decimal: a reduced fraction
        (Fraction(-1, 3), "-1/3"),
        (Fraction(2, 12), "1/6"),
    ],
)
def test_canonical_number_exact_forms(value, text):
    assert canonical_number(value) == text


@settings(max_examples=300, deadline=None)
@given(num=st.integers(min_value=-10**9, max_value=10**9), den=st.integers(min_value=1, max_value=10**4))
def test_canonical_number_reads_back_exactly_and_has_no_trailing_zero(num, den):
    value = Fraction(num, den)
    text = canonical_number(value)
    assert parse_number(text) == value
    assert extract_answer(f"<answer>{text}</answer>") == text  # and extract_answer gives it back as written
    if "." in text:
        assert not text.endswith("0") and "/" not in text


# ---------------------------------------------------------------------------
# parse_number: a string that is exactly one number
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("1,234", Fraction(1234)),
        ("-7", Fraction(-7)),
        ("+3", Fraction(3)),
        ("-0", Fraction(0)),
        ("3.50", Fraction(7, 2)),
        (".5", Fraction(1, 2)),
        (" 42. ", Fraction(42)),  # spaces and a full stop are decoration
        ("$5", Fraction(5)),
        ("50%", Fraction(50)),
        (r"\$18.50", Fraction(37, 2)),  # LaTeX's escaped dollar
        ("1{,}000", Fraction(1000)),  # LaTeX's thousands comma
        ("\u22125", Fraction(-5)),  # the unicode minus
        ("3/4", Fraction(3, 4)),
        ("3 / 4", Fraction(3, 4)),
        (r"\frac{3}{4}", Fraction(3, 4)),
        (r"\dfrac{6}{8}", Fraction(3, 4)),
        (r"-\frac{1}{2}", Fraction(-1, 2)),
    ],
)
def test_parse_number_reads_one_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", "abc", "12 apples", "2+2", "1,23", "1/0", r"\frac{1}{0}", "1.2.3"])
def test_parse_number_refuses_anything_but_one_number(text):
    assert parse_number(text) is None


# ---------------------------------------------------------------------------
# last_number, last_boxed, and what extract_answer does with them
# ---------------------------------------------------------------------------


def test_last_number_skips_a_fraction_over_zero_and_reads_latex_fractions():
    assert last_number(r"3 and \frac{1}{0}") == 3
    assert last_number(r"\frac{1}{0}") is None
    assert last_number(r"half is \frac{1}{2}") == Fraction(1, 2)
    assert last_number("-\u22124") == -4  # the unicode minus is a sign too


def test_last_boxed_allows_a_space_before_the_brace_and_keeps_the_content_as_written():
    assert last_boxed(r"\boxed {5}") == "5"
    assert last_boxed(r"\boxed{ 1,000 }") == " 1,000 "
    assert last_boxed("no box") is None


def test_extract_answer_takes_the_last_gsm8k_line_that_is_a_number():
    assert extract_answer("#### 12\n#### abc") == "12"


def test_extract_answer_reads_only_closed_tags_and_never_across_an_opening_tag():
    assert extract_answer("<answer>1</answer><answer>2") == "1"  # the unclosed second tag is not an answer
    assert extract_answer("<answer>a<answer>3</answer>") == "3"  # the innermost pair, not "a<answer>3"


# ---------------------------------------------------------------------------
# answers_match beyond test_rewards' table
# ---------------------------------------------------------------------------


def test_answers_match_exact_rationals_and_text():
    assert answers_match("3/4", r"\frac{3}{4}") is True
    assert answers_match("0.75", 0.75) is True
    assert answers_match(0.1 + 0.2, 0.3) is False  # 0.30000000000000004 is another decimal: exact, not close
    assert answers_match("1e3", 1000) is False  # no scientific notation: "1e3" is text, and text never equals a number
    assert answers_match("Paris", 1) is False


@pytest.mark.parametrize(
    "pred, ref, error, message",
    [
        (True, "1", TypeError, "pred must be a str or a number, got bool: True"),
        ("1", None, TypeError, "ref must be a str or a number, got NoneType: None"),
        (float("nan"), "1", ValueError, "pred must be a finite number, got nan"),
        ("1", float("inf"), ValueError, "ref must be a finite number, got inf"),
    ],
)
def test_answers_match_refuses_what_is_not_an_answer(pred, ref, error, message):
    with pytest.raises(error) as caught:
        answers_match(pred, ref)
    assert str(caught.value) == message


# ---------------------------------------------------------------------------
# completions in TRL's two formats, and the reference column
# ---------------------------------------------------------------------------


def test_completion_to_text_edge_cases():
    assert completion_to_text({"role": "assistant", "content": "x"}) == "x"  # one message, not in a list
    # no assistant message: the last message, whatever its role
    assert completion_to_text([{"role": "user", "content": "q"}, {"role": "tool", "content": "7"}]) == "7"
    assert completion_to_text([{"role": "assistant", "content": None}]) == ""
    blocks = [{"role": "assistant", "content": ["a", {"type": "text", "text": "b"}, {"type": "image"}]}]
    assert completion_to_text(blocks) == "ab"  # a plain item is itself, a block without text adds nothing


@pytest.mark.parametrize("bad, shown", [([], "list: []"), ([{"role": "assistant"}], "list: [{'role': 'assistant'}]"),
                                        (None, "NoneType: None")])
def test_completion_to_text_refuses_what_is_no_completion(bad, shown):
    with pytest.raises(TypeError) as caught:
        completion_to_text(bad)
    assert str(caught.value) == (
        "a completion must be a str or a list of chat messages like "
        f"[{{'role': 'assistant', 'content': '...'}}], got {shown}"
    )


def test_completion_texts_of_both_formats_and_its_errors():
    assert completion_texts(("a", [{"role": "assistant", "content": "b"}])) == ["a", "b"]
    assert completion_texts([]) == []
    for bad, name in [("abc", "str"), ({"a": 1}, "dict"), (3, "int")]:
        with pytest.raises(TypeError) as caught:
            completion_texts(bad)
        assert str(caught.value) == f"completions must be a list (one item per completion), got {name}"
    with pytest.raises(TypeError, match=r"^completions\[1\]: a completion must be a str .* got NoneType: None$"):
        completion_texts(["a", None])


def test_references_for_checks_the_answer_column(tiny_batch):
    answers = [row["answer"] for row in tiny_batch]
    got = references_for(answers, 4)
    assert got == ["46", "65", "49", "100"] and got is not answers  # a new list
    assert references_for(("1",), 1) == ["1"]
    with pytest.raises(TypeError) as caught:
        references_for("12", 2)
    assert str(caught.value) == "answer must be a list with one reference per completion, got str: '12'"
    with pytest.raises(ValueError) as caught:
        references_for(answers, 8, name="solution")
    assert str(caught.value) == "solution has 4 items but there are 8 completions; expected one per completion"


def test_each_tiny_batch_answer_is_found_and_matched(tiny_batch):
    for row in tiny_batch:
        for completion in (row["answer"], f"<answer>{row['answer']}</answer>", f"{row['prompt']}{row['answer']}"):
            assert answers_match(extract_answer(completion), row["answer"])
        assert not answers_match(extract_answer(row["prompt"]), row["answer"])  # the prompt's last number is b

"""Chapter 13's task (grpo_tutorial.long_addition): the worked-out form, its parser, the dataset."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tutorial.long_addition import make_long_addition_dataset, parse_worked, worked_addition


# ---------------------------------------------------------------------------
# Long addition: guessed or worked out (chapter 13)
# ---------------------------------------------------------------------------


def test_worked_addition_exact_examples():
    assert worked_addition(347, 285) == "(7+5=12)(4+8+1=13)(3+2+1=6)632"
    assert worked_addition(9999, 1) == "(9+1=10)(9+0+1=10)(9+0+1=10)(9+0+1=10)10000"
    assert worked_addition(5, 7) == "(5+7=12)12"
    assert worked_addition(0, 0) == "(0+0=0)0"
    with pytest.raises(ValueError, match="a must be an int >= 0"):
        worked_addition(-1, 3)
    with pytest.raises(TypeError, match=r"b must be an int >= 0, got True \(type bool\)"):  # a wrong type: TypeError
        worked_addition(1, True)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**7), st.integers(0, 10**7))
def test_worked_addition_parses_back_consistent(a, b):
    parsed = parse_worked(worked_addition(a, b))
    assert parsed.style == "worked" and parsed.worked
    assert parsed.well_formed and parsed.consistent
    assert parsed.answer == str(a + b)
    assert len(parsed.steps) == max(len(str(a)), len(str(b)))
    # the steps read the operands' digits from the right
    assert [s[0] for s in parsed.steps] == [int(c) for c in str(a).zfill(len(parsed.steps))[::-1]]


@pytest.mark.parametrize(
    "text, style, answer, well_formed, consistent",
    [
        ("632", "guess", "632", True, True),
        (" 632 ", "guess", "632", True, True),
        ("(7+5=12)(4+8+1=13)(3+2+1=6)632", "worked", "632", True, True),
        ("(7+5=12)(4+8+1=13)(3+2+1=6)633", "worked", "633", True, False),  # answer not what the steps spell
        ("(7+5=12)(4+8=12)(3+2+1=6)622", "worked", "622", True, False),  # a carry went missing
        ("(7+5=13)(4+8+1=13)(3+2+1=6)632", "worked", "632", True, False),  # a column added wrong
        ("(7+5=12)(4+8+1=13)(3+2+1=6)", "worked", None, False, False),  # cut off before the answer
        ("(7+5=12)(4+8+1=1", "worked", None, False, False),
        ("(7+5=12)632 7", "worked", "632", False, False),  # something after the answer
        ("(", "worked", None, False, False),
        ("()632", "worked", None, False, False),
        ("63(", "other", None, False, False),
        ("", "other", None, False, False),
        ("=632", "other", None, False, False),
    ],
)
def test_parse_worked_reads_every_kind_of_completion(text, style, answer, well_formed, consistent):
    parsed = parse_worked(text)
    assert (parsed.style, parsed.answer, parsed.well_formed, parsed.consistent) == (style, answer, well_formed, consistent)


def test_parse_worked_rejects_non_text():
    with pytest.raises(TypeError, match="text must be a str"):
        parse_worked(["632"])


def test_long_addition_dataset():
    rows = make_long_addition_dataset(500, seed=3, digits=[3, 5])
    assert rows == make_long_addition_dataset(500, seed=3, digits=[3, 5])
    assert {r["digits"] for r in rows} == {3, 5}
    for r in rows:
        a, b = (int(x) for x in r["prompt"].rstrip("=").split("+"))
        assert (a, b) == (r["a"], r["b"]) and r["answer"] == str(a + b)
        assert len(str(a)) == len(str(b)) == r["digits"]
    one = make_long_addition_dataset(100, seed=0, digits=1, unique=True)
    assert len({r["prompt"] for r in one}) == 100  # exactly the 10 x 10 one-digit sums
    held = {r["prompt"] for r in make_long_addition_dataset(50, seed=1, digits=2, unique=True)}
    assert not held & {r["prompt"] for r in make_long_addition_dataset(2000, seed=2, digits=2, exclude=held)}
    with pytest.raises(ValueError, match="101 unique problems requested"):
        make_long_addition_dataset(101, seed=0, digits=1, unique=True)
    with pytest.raises(ValueError, match="digits must be an int >= 1"):
        make_long_addition_dataset(3, seed=0, digits=0)
    with pytest.raises(TypeError, match="digits must be an int >= 1 or a list"):
        make_long_addition_dataset(3, seed=0, digits="4")

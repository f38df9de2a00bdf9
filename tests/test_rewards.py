"""Stage 2 tests: answer extraction, the reward functions, and compute_rewards' checks."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tutorial.answers import completion_texts, last_boxed, last_number, references_for
from grpo_tutorial.rewards import (
    RewardFunctionError,
    answers_match,
    combined_reward,
    completion_to_text,
    compute_rewards,
    correctness_reward,
    extract_answer,
    format_reward,
    partial_credit_reward,
    reward_function_means,
    reward_function_name,
)

# ---------------------------------------------------------------------------
# extract_answer
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        # <answer> tags: the last pair wins, numbers are normalised
        ("<think>2+2</think><answer>4</answer>", "4"),
        ("<answer>3</answer> no wait <answer> 5 </answer>", "5"),
        ("<answer>1,234</answer>", "1234"),
        ("<answer>2 + 2 = 4</answer>", "4"),
        ("<answer> Paris </answer>", "Paris"),
        ("<answer>New   York</answer>", "New York"),
        ("<ANSWER>7</ANSWER>", "7"),
        ("<answer>7</answer> then 99 after the tag", "7"),
        # \boxed, nested braces, last box wins
        (r"so \boxed{42}.", "42"),
        (r"\boxed{1} and then \boxed{2}", "2"),
        (r"\boxed{\frac{1}{2}}", "0.5"),
        (r"\boxed{\dfrac{3}{4}}", "0.75"),
        (r"\boxed{\frac{1}{3}}", "1/3"),
        (r"\boxed{{12}}", "12"),
        (r"\boxed{x^{2}}", "2"),
        (r"\boxed{\text{yes}}", r"\text{yes}"),
        (r"\boxed{1,000} but 5 later", "1000"),
        # GSM8K marker
        ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
        ("#### 1,000\n", "1000"),
        ("#### $18.50", "18.5"),
        ("work 5\n#### -3", "-3"),
        # last number in plain text
        ("The total is 1,234,567 dollars.", "1234567"),
        ("It costs $3.50.", "3.5"),
        ("It costs 12.0", "12"),
        ("growth of 50%", "50"),
        ("x = -7", "-7"),
        ("12-5=7", "7"),
        ("12-5", "5"),  # the "-" between digits is an operator, not a sign
        ("(3+4)-2", "2"),  # ... and after a closing bracket
        ("[7]-1", "1"),
        ("(-3)", "-3"),  # after an opening bracket it is a sign
        ("answer:-3", "-3"),
        ("a list 1,2,3", "3"),
        ("pairs 1,2345", "2345"),  # not a thousands group: two numbers
        ("value .5", "0.5"),
        ("-0.0", "0"),
        ("\u22124", "-4"),  # unicode minus
        ("46", "46"),
    ],
)
def test_extract_answer_formats(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "no digits here", "<answer></answer> 5", "<answer>   </answer>", r"\boxed{} 3"],
)
def test_extract_answer_nothing_found_is_none(text):
    # an empty tag or box is an answer of nothing: no fallback to later numbers
    assert extract_answer(text) is None


def test_extract_answer_priority_order():
    # tags beat boxed, boxed beats ####, #### beats the last number
    assert extract_answer(r"<answer>1</answer> \boxed{2} " + "\n#### 3\n 4") == "1"
    assert extract_answer(r"\boxed{2}" + "\n#### 3\n 4") == "2"
    assert extract_answer("#### 3\nthen 4") == "3"


def test_extract_answer_markdown_heading_is_not_a_gsm8k_marker():
    # "#### Step 1" is a heading, not an answer line, so the last number wins
    assert extract_answer("#### Step 1\nthe answer is 42") == "42"


def test_extract_answer_unbalanced_boxed_is_skipped():
    assert extract_answer(r"\boxed{5} then \boxed{6") == "5"
    assert extract_answer(r"truncated \boxed{6") == "6"  # last number fallback


def test_extract_answer_rejects_non_str():
    with pytest.raises(TypeError, match="text must be a str, got int"):
        extract_answer(42)


_WORDS = st.text(alphabet="abcdefghij XYZ,.:;!?()", max_size=30)


@settings(max_examples=200, deadline=None)
@given(prefix=_WORDS, value=st.integers(min_value=-10**12, max_value=10**12), suffix=_WORDS)
def test_extract_answer_recovers_any_integer_with_commas(prefix, value, suffix):
    text = f"{prefix} {value:,} {suffix}"
    assert extract_answer(text) == str(value)


@settings(max_examples=200, deadline=None)
@given(cents=st.integers(min_value=-10**8, max_value=10**8), pad=st.integers(min_value=0, max_value=3))
def test_extract_answer_decimals_are_canonical(cents, pad):
    # 12.30, 12.3 and 12.300 all come back as the same string, and it parses back exactly
    text = f"{'-' if cents < 0 else ''}{abs(cents) // 100}.{abs(cents) % 100:02d}{'0' * pad}"
    got = extract_answer(f"total: {text}")
    assert float(got) == pytest.approx(cents / 100, abs=0)
    assert not (("." in got) and got.endswith("0"))
    assert extract_answer(got) == got  # idempotent


# ---------------------------------------------------------------------------
# answers_match
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pred, ref, expected",
    [
        ("3.5", "3.50", True),
        ("12", 12.0, True),
        ("12", 12, True),
        ("1234", "1,234", True),
        ("0.5", "1/2", True),
        ("1/3", "2/6", True),
        ("-7", -7, True),
        ("0.1", 0.1, True),
        ("5", "$5", True),
        ("Paris", " paris ", True),
        ("42", "43", False),
        ("42", "forty-two", False),
        ("12.01", 12, False),
        (None, "1", False),
    ],
)
def test_answers_match(pred, ref, expected):
    assert answers_match(pred, ref) is expected


def test_answers_match_bad_reference():
    with pytest.raises(TypeError, match="ref must be a str or a number, got list"):
        answers_match("1", [1])
    with pytest.raises(ValueError, match="ref must be a finite number, got nan"):
        answers_match("1", float("nan"))


# ---------------------------------------------------------------------------
# completions in both formats
# ---------------------------------------------------------------------------


def test_the_shared_answer_helpers_are_public():
    """What rewards, tasks and the chapter tools share from answers.py, by its public name."""
    from fractions import Fraction

    assert last_number("12 apples, then 1,234.5 pears") == Fraction(2469, 2)
    assert last_number("12-5") == 5 and last_number("x = -5") == -5 and last_number("none") is None
    assert last_boxed(r"so \boxed{3} or rather \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{3") is None
    assert completion_texts(["a", [{"role": "assistant", "content": "b"}]]) == ["a", "b"]
    with pytest.raises(TypeError, match=r"completions\[1\]: a completion must be a str"):
        completion_texts(["a", 3])
    assert references_for(("1", "2"), 2) == ["1", "2"]
    with pytest.raises(ValueError, match="answer has 1 items but there are 2 completions"):
        references_for(["1"], 2)


def test_completion_to_text_formats():
    assert completion_to_text("hi") == "hi"
    assert completion_to_text([{"role": "assistant", "content": "42"}]) == "42"
    msgs = [
        {"role": "assistant", "content": "call tool"},
        {"role": "tool", "content": "7"},
        {"role": "assistant", "content": "final 8"},
    ]
    assert completion_to_text(msgs) == "final 8"
    blocks = [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert completion_to_text(blocks) == "ab"
    with pytest.raises(TypeError, match="a completion must be a str or a list of chat messages"):
        completion_to_text(3)


def test_correctness_reward_strings_and_messages_agree():
    texts = ["<answer>46</answer>", "the sum is 46.", "45", "no idea", r"\boxed{4,6}"]
    answers = ["46"] * 5
    expected = [1.0, 1.0, 0.0, 0.0, 0.0]  # "4,6" is not a thousands group: last number is 6
    assert correctness_reward(texts, answer=answers) == expected
    chats = [[{"role": "assistant", "content": t}] for t in texts]
    assert correctness_reward(chats, answer=answers) == expected


def test_correctness_reward_ignores_trl_extras():
    out = correctness_reward(
        ["7"], answer=[7], prompts=["3+4="], completion_ids=[[1, 2]], trainer_state=object(), other=[1]
    )
    assert out == [1.0]


def test_correctness_reward_bad_inputs():
    with pytest.raises(ValueError, match="answer has 1 items but there are 2 completions"):
        correctness_reward(["1", "2"], answer=["1"])
    with pytest.raises(TypeError, match="answer must be a list with one reference per completion, got str"):
        correctness_reward(["1"], answer="1")
    with pytest.raises(TypeError, match="completions must be a list"):
        correctness_reward("1", answer=["1"])
    with pytest.raises(TypeError, match=r"completions\[1\]: a completion must be"):
        correctness_reward(["1", 5], answer=["1", "5"])


# ---------------------------------------------------------------------------
# format_reward
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "<think>2+2 is 4</think><answer>4</answer>",
        "  <think>\nmulti\nline\n</think>\n\n<answer> 4 </answer>\n",
    ],
)
def test_format_reward_accepts_exact_layout(text):
    assert format_reward([text]) == [1.0]


@pytest.mark.parametrize(
    "text",
    [
        "<answer>4</answer>",  # no think
        "<think>x</think>",  # no answer
        "<answer>4</answer><think>x</think>",  # wrong order
        "Sure! <think>x</think><answer>4</answer>",  # text before
        "<think>x</think><answer>4</answer> done",  # text after
        "<think>x</think><answer>4</answer><answer>5</answer>",  # a second answer
        "<think>x</think><think>y</think><answer>4</answer>",  # a second think
        "<think> </think><answer>4</answer>",  # blank think
        "<think>x</think><answer></answer>",  # blank answer
        "<think>x</think><answer>4",  # unclosed
        "4",
    ],
)
def test_format_reward_rejects_everything_else(text):
    assert format_reward([text]) == [0.0]


def test_format_reward_messages_and_no_answer_needed():
    chat = [[{"role": "assistant", "content": "<think>a</think><answer>b</answer>"}]]
    assert format_reward(chat) == [1.0]
    assert format_reward(chat, answer=["anything"], prompts=["p"]) == [1.0]


# ---------------------------------------------------------------------------
# partial_credit_reward (the deliberately hackable one)
# ---------------------------------------------------------------------------


def test_partial_credit_reward_is_hackable_by_design():
    completions = ["7", "1+1", "3*4", "x = 2", "8", "no"]
    assert partial_credit_reward(completions, answer=["7"] * 6) == [1.0, 0.3, 0.3, 0.3, 0.0, 0.0]
    # the hack: a meaningless equation always beats an honest wrong answer
    assert partial_credit_reward(["0+0"], answer=["7"]) > partial_credit_reward(["6"], answer=["7"])


# ---------------------------------------------------------------------------
# combined_reward
# ---------------------------------------------------------------------------


def test_combined_reward_weights_exactly():
    reward = combined_reward({"correctness": 1.0, format_reward: 0.5})
    completions = [
        "<think>t</think><answer>4</answer>",  # right and well formed
        "<think>t</think><answer>5</answer>",  # wrong, well formed
        "4",  # right, no format
        "5",  # neither
    ]
    assert reward(completions, answer=["4"] * 4) == [1.5, 0.5, 1.0, 0.0]
    assert reward.__name__ == "1*correctness_reward+0.5*format_reward"


def test_combined_reward_list_form_and_negative_weight():
    reward = combined_reward([(correctness_reward, 2.0), ("format", -1.0)])
    assert reward(["<think>t</think><answer>4</answer>", "4"], answer=[4, 4]) == [1.0, 2.0]
    assert reward.__name__ == "2*correctness_reward+-1*format_reward"


def test_combined_reward_none_is_skipped_and_all_none_stays_none():
    def only_first(completions, **kwargs):
        return [3.0] + [None] * (len(completions) - 1)

    def never(completions, **kwargs):
        return [None] * len(completions)

    reward = combined_reward([(only_first, 2.0), (correctness_reward, 1.0)])
    assert reward(["1", "1", "2"], answer=["1", "1", "1"]) == [7.0, 1.0, 0.0]
    assert combined_reward([(never, 1.0)])(["a", "b"]) == [None, None]


def test_combined_reward_bad_weights():
    with pytest.raises(ValueError, match="weights is empty"):
        combined_reward({})
    with pytest.raises(ValueError, match="unknown reward name 'length'"):
        combined_reward({"length": 1.0})
    with pytest.raises(TypeError, match=r"weights\[0\] weight must be a finite number, got str"):
        combined_reward({"format": "1"})
    with pytest.raises(TypeError, match=r"weights\[0\] weight must be a finite number, got float: nan"):
        combined_reward({"format": float("nan")})
    with pytest.raises(TypeError, match=r"weights\[0\] function must be a reward function or its name, got int"):
        combined_reward([(3, 1.0)])
    with pytest.raises(TypeError, match=r"weights\[0\] must be a \(reward function, weight\) pair"):
        combined_reward([correctness_reward])
    with pytest.raises(TypeError, match="weights must be a dict"):
        combined_reward(correctness_reward)


def test_reward_function_name_unwraps_partial():
    assert reward_function_name(functools.partial(correctness_reward)) == "correctness_reward"


# ---------------------------------------------------------------------------
# compute_rewards: the trainer's checked call
# ---------------------------------------------------------------------------

PROMPTS = ["1+1=", "2+2=", "3+3="]
COMPLETIONS = ["2", "<think>t</think><answer>4</answer>", "7"]
ANSWERS = ["2", "4", "6"]


def test_compute_rewards_weighted_total_and_per_function():
    total, per_fn = compute_rewards(
        [correctness_reward, format_reward], [1.0, 0.25], PROMPTS, COMPLETIONS, ANSWERS
    )
    assert total.shape == (3,)
    assert total.tolist() == [1.0, 1.25, 0.0]
    assert list(per_fn) == ["correctness_reward", "format_reward"]
    assert per_fn["correctness_reward"].tolist() == [1.0, 1.0, 0.0]
    assert per_fn["format_reward"].tolist() == [0.0, 1.0, 0.0]


def test_compute_rewards_default_weights_and_single_function():
    total, per_fn = compute_rewards(correctness_reward, None, PROMPTS, COMPLETIONS, ANSWERS)
    assert total.tolist() == [1.0, 1.0, 0.0]
    assert list(per_fn) == ["correctness_reward"]


def test_compute_rewards_passes_columns_and_prompts():
    seen = {}

    def spy(prompts, completions, answer, numbers, **kwargs):
        seen.update(prompts=prompts, answer=answer, numbers=numbers)
        return [0.0] * len(completions)

    compute_rewards([spy], None, PROMPTS, COMPLETIONS, ANSWERS, numbers=[[1], [2], [3]])
    assert seen == {"prompts": PROMPTS, "answer": ANSWERS, "numbers": [[1], [2], [3]]}


def test_compute_rewards_none_rule():
    # None = "not applicable": left out of the weighted sum (nansum, as TRL);
    # all None -> total NaN; the per-function mean skips Nones.
    def sometimes(completions, **kwargs):
        return [None, 2.0, None]

    def rarely(completions, **kwargs):
        return [1.0, None, None]

    total, per_fn = compute_rewards([sometimes, rarely], [10.0, 1.0], PROMPTS, COMPLETIONS, ANSWERS)
    assert total[:2].tolist() == [1.0, 20.0]
    assert math.isnan(total[2].item())
    assert torch.isnan(per_fn["sometimes"]).tolist() == [True, False, True]
    assert reward_function_means(per_fn) == {"sometimes": 2.0, "rarely": 1.0}


def test_reward_function_means_all_none_is_nan():
    means = reward_function_means({"f": torch.tensor([math.nan, math.nan])})
    assert math.isnan(means["f"])


def test_compute_rewards_duplicate_names_get_suffixes():
    total, per_fn = compute_rewards(
        [correctness_reward, correctness_reward], [1.0, 2.0], PROMPTS, COMPLETIONS, ANSWERS
    )
    assert list(per_fn) == ["correctness_reward", "correctness_reward_2"]
    assert total.tolist() == [3.0, 3.0, 0.0]


def test_compute_rewards_accepts_tuples_tensors_and_ints():
    def as_tensor(completions, **kwargs):
        return torch.tensor([1.0, 0.0, 0.5])

    def as_tuple_of_ints(completions, **kwargs):
        return (1, 0, True)

    total, _ = compute_rewards([as_tensor, as_tuple_of_ints], None, PROMPTS, COMPLETIONS, ANSWERS)
    assert total.tolist() == [2.0, 0.0, 1.5]


def test_compute_rewards_reraises_with_function_name_and_index():
    def fragile(completions, **kwargs):
        return [1.0 / len(c) for c in completions]  # ZeroDivisionError on an empty completion

    with pytest.raises(RewardFunctionError, match=r"reward function 'fragile' raised ZeroDivisionError on completion 1") as info:
        compute_rewards([fragile], None, ["a", "b", "c"], ["xy", "", "z"], ["1", "2", "3"])
    assert info.value.function == "fragile"
    assert info.value.index == 1
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert isinstance(info.value, RuntimeError)


def test_compute_rewards_batch_only_failure_has_no_index():
    def one_at_a_time(completions, **kwargs):
        if len(completions) > 1:
            raise ValueError("one completion per call only")
        return [0.0]

    with pytest.raises(RewardFunctionError, match="reward function 'one_at_a_time' raised ValueError on the whole batch") as info:
        compute_rewards([one_at_a_time], None, PROMPTS, COMPLETIONS, ANSWERS)
    assert info.value.index is None


def test_compute_rewards_wrong_length():
    def short(completions, **kwargs):
        return [1.0]

    with pytest.raises(ValueError, match="reward function 'short' returned 1 rewards but got 3 completions"):
        compute_rewards([short], None, PROMPTS, COMPLETIONS, ANSWERS)


def test_compute_rewards_non_numeric():
    def stringy(completions, **kwargs):
        return [1.0, "0.5", 0.0]

    with pytest.raises(TypeError, match=r"reward function 'stringy' returned a non-numeric value '0.5' \(str\) at index 1"):
        compute_rewards([stringy], None, PROMPTS, COMPLETIONS, ANSWERS)

    def scalar(completions, **kwargs):
        return 1.0

    with pytest.raises(TypeError, match="reward function 'scalar' returned float 1.0; expected a list of 3 floats"):
        compute_rewards([scalar], None, PROMPTS, COMPLETIONS, ANSWERS)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_compute_rewards_non_finite(bad):
    def broken(completions, **kwargs):
        return [0.0, 0.0, bad]

    with pytest.raises(ValueError, match=rf"reward function 'broken' returned {bad} at index 2; rewards must be finite"):
        compute_rewards([broken], None, PROMPTS, COMPLETIONS, ANSWERS)


def test_compute_rewards_bad_arguments():
    with pytest.raises(ValueError, match="weights has 1 entries but there are 2 reward functions"):
        compute_rewards([correctness_reward, format_reward], [1.0], PROMPTS, COMPLETIONS, ANSWERS)
    with pytest.raises(ValueError, match="got 2, 3 and 3"):
        compute_rewards([correctness_reward], None, PROMPTS[:2], COMPLETIONS, ANSWERS)
    with pytest.raises(ValueError, match="completions is empty"):
        compute_rewards([correctness_reward], None, [], [], [])
    with pytest.raises(TypeError, match=r"reward_fns\[1\] must be callable, got str"):
        compute_rewards([correctness_reward, "format"], None, PROMPTS, COMPLETIONS, ANSWERS)
    with pytest.raises(TypeError, match="reward_fns must be a reward function or a non-empty list"):
        compute_rewards([], None, PROMPTS, COMPLETIONS, ANSWERS)
    with pytest.raises(TypeError, match=r"weights\[0\] must be a finite number"):
        compute_rewards([correctness_reward], [math.inf], PROMPTS, COMPLETIONS, ANSWERS)
    with pytest.raises(ValueError, match="pass the references as answers="):
        compute_rewards([correctness_reward], None, PROMPTS, COMPLETIONS, ANSWERS, answer=ANSWERS)


def test_rewards_plug_into_trl_signature():
    # exactly how TRL's GRPOTrainer calls a reward function: keywords only,
    # with every dataset column passed along
    kwargs = dict(
        prompts=[[{"role": "user", "content": "2+2?"}]] * 2,
        completions=[[{"role": "assistant", "content": "<think>t</think><answer>4</answer>"}],
                     [{"role": "assistant", "content": "5"}]],
        completion_ids=[[1], [2]],
        answer=["4", "4"],
        trainer_state=None,
    )
    assert correctness_reward(**kwargs) == [1.0, 0.0]
    assert format_reward(**kwargs) == [1.0, 0.0]
    assert combined_reward({"correctness": 1.0, "format": 0.5})(**kwargs) == [1.5, 0.0]


# ---------------------------------------------------------------------------
# DAPO's soft overlong punishment, against TRL's own function
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("budget, cache", [(100, 20), (40, 10), (64, 0), (8, 8), (1, 1)])
def test_soft_overlong_punishment_matches_trl(budget, cache):
    from trl.rewards import get_soft_overlong_punishment

    from grpo_tutorial.rewards import soft_overlong_punishment

    theirs = get_soft_overlong_punishment(max_completion_len=budget, soft_punish_cache=cache)
    ours = soft_overlong_punishment(max_completion_len=budget, soft_punish_cache=cache)
    ids = [[7] * n for n in range(0, budget + 6)]  # every length from 0 to past the budget
    texts = ["x" * len(row) for row in ids]
    assert ours(texts, completion_ids=ids) == theirs(ids)
    assert ours.__name__ == theirs.__name__ == "soft_overlong_punishment_reward"


def test_soft_overlong_punishment_exact_values_and_errors():
    from grpo_tutorial.rewards import soft_overlong_punishment

    reward = soft_overlong_punishment(max_completion_len=40, soft_punish_cache=10)
    # no penalty up to 30 tokens, then -1/10 per token, -1 at the budget and past it
    assert reward(None, completion_ids=[[1] * n for n in (1, 30, 31, 35, 40, 41)]) == [0.0, 0.0, -0.1, -0.5, -1.0, -1.0]
    with pytest.raises(TypeError, match="needs completion_ids"):
        reward(["12"])
    with pytest.raises(ValueError, match="2 completions but 1 completion_ids"):
        reward(["1", "2"], completion_ids=[[1]])
    with pytest.raises(ValueError, match="soft_punish_cache=50 must not exceed max_completion_len=40"):
        soft_overlong_punishment(40, 50)
    with pytest.raises(ValueError, match="max_completion_len must be an int >= 1"):
        soft_overlong_punishment(0, 0)
    import pickle

    assert pickle.loads(pickle.dumps(reward)).penalty(35) == -0.5  # picklable, as TRL's is


def test_compute_rewards_passes_completion_ids_to_every_function():
    from grpo_tutorial.rewards import soft_overlong_punishment

    seen = {}

    def spy(completions, *, completion_ids, **kwargs):
        seen["ids"] = completion_ids
        return [float(len(ids)) for ids in completion_ids]

    ids = [[5, 6, 2], [5] * 10]
    total, per_fn = compute_rewards(
        [spy, soft_overlong_punishment(10, 4)], [1.0, 1.0], ["p", "p"], ["56", "5555555555"], ["1", "1"],
        completion_ids=ids,
    )
    assert seen["ids"] == ids
    assert per_fn["soft_overlong_punishment_reward"].tolist() == [0.0, -1.0]
    assert total.tolist() == [3.0, 9.0]
    with pytest.raises(ValueError, match="completion_ids must be a list of 2"):
        compute_rewards(spy, None, ["p", "p"], ["a", "b"], ["1", "1"], completion_ids=[[1]])


def test_trainer_and_evaluation_pass_each_completions_tokens(make_small_policy):
    """The trainer and evaluate_policy hand reward functions TRL's completion_ids: up to and including EOS."""
    from grpo_tutorial import GRPOConfig, GRPOTrainer, evaluate_policy, make_arithmetic_dataset

    model, tokenizer = make_small_policy(seed=3, num_layers=1)
    calls = []

    def spy(completions, *, completion_ids, **kwargs):
        calls.append((list(completions), completion_ids))
        return [0.0] * len(completions)

    config = GRPOConfig(group_size=4, prompts_per_step=2, max_new_tokens=6, seed=0)
    trainer = GRPOTrainer(model, tokenizer, spy, config)
    row = trainer.train_step(make_arithmetic_dataset(2, seed=0))
    texts, ids = calls[-1]
    assert len(ids) == 8
    assert sum(map(len, ids)) / 8 == pytest.approx(row["completion_len_mean"])
    eos = tokenizer.eos_token_id
    for text, one in zip(texts, ids):
        ended = eos in one
        assert len(one) == (one.index(eos) + 1 if ended else config.max_new_tokens)
        assert tokenizer.decode(one, skip_special_tokens=True) == text
    assert any(eos not in one for one in ids), "the untrained model should run out of budget somewhere"
    result = evaluate_policy(model, tokenizer, make_arithmetic_dataset(3, seed=1), config, reward_fns=spy)
    assert [len(one) for one in calls[-1][1]] == [r["length"] for r in result["records"]]

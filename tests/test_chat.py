"""One answer to "is this a chat prompt?" (issue 26, item 6): ``grpo_tutorial.chat.is_chat_messages``.

Before, the rollout, the dataset checks and the completions log each had a test of
their own, and they disagreed: a list of dicts without ``role`` passed
``validate_dataset`` and then failed in ``generate_rollouts``; a tuple of messages
passed the rollout and failed the trainer's batch check. Now every place asks the
same function, so a prompt is accepted everywhere or nowhere.
"""

from __future__ import annotations

import pytest

from grpo_tutorial.answers import completion_to_text
from grpo_tutorial.chat import is_chat_messages
from grpo_tutorial.rollout import generate_rollouts
from grpo_tutorial.run.completions import format_completions
from grpo_tutorial.tasks import check_rows, validate_dataset

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+3="}]

CASES = [
    # (value, is it a list of chat messages?)
    (CHAT, True),
    (tuple(CHAT), True),
    ([{"role": "assistant", "content": None}], True),  # content may be empty; the key is what counts
    ("2+3=", False),
    ([], False),
    ([{"content": "2+3="}], False),  # no role
    ([{"role": "user"}], False),  # no content
    ([{"role": "user", "content": "2+3="}, "and more"], False),
    ({"role": "user", "content": "2+3="}, False),  # one message is not a list of them
    (b"2+3=", False),
    (None, False),
]


@pytest.mark.parametrize("value, expected", CASES, ids=[repr(v)[:40] for v, _ in CASES])
def test_is_chat_messages(value, expected):
    assert is_chat_messages(value) is expected


def _rollout_accepts(prompt, policy) -> bool:
    """generate_rollouts's own argument check (it runs before the tokenizer is touched)."""
    model, tok = policy
    try:
        generate_rollouts(model, tok, [prompt], group_size=2, max_new_tokens=1)
    except TypeError as err:
        if "must be a str or a list of chat messages" in str(err):
            return False
        raise
    except ValueError:  # past the type check: the tiny model has no chat template
        return True
    return True


def _accepts(check, prompt) -> bool:
    try:
        check([{"prompt": prompt, "answer": "5"}])
    except (TypeError, ValueError) as err:
        assert "chat messages" in str(err), err
        return False
    return True


@pytest.mark.parametrize(
    "prompt", [CHAT, tuple(CHAT), [{"content": "2+3="}], [{"role": "user"}], [], [{"role": "user", "content": "x"}, 3]],
    ids=["chat", "tuple", "no-role", "no-content", "empty", "mixed"],
)
def test_the_rollout_and_the_dataset_checks_agree(prompt, make_small_policy):
    verdicts = {
        "is_chat_messages": is_chat_messages(prompt),
        "validate_dataset": _accepts(validate_dataset, prompt),
        "check_rows": _accepts(lambda rows: check_rows(rows, "batch"), prompt),
        "generate_rollouts": _rollout_accepts(prompt, make_small_policy(hidden_size=16, num_layers=1,
                                                                        intermediate_size=32)),
    }
    assert len(set(verdicts.values())) == 1, verdicts


def test_the_completions_log_and_the_rewards_read_chat_messages_the_same_way():
    row = {"step": 1, "prompt": CHAT, "completion": [{"role": "assistant", "content": "5"}], "reward": 1.0,
           "rewards": {"correctness_reward": 1.0}, "advantage": 0.5}
    text = format_completions([row])
    assert "2+3= -> '5'" in text  # the last message of the prompt, the completion's content
    assert completion_to_text(row["completion"]) == "5"
    not_chat = dict(row, prompt=[{"content": "2+3="}])  # no role: shown as it is, not as a message
    assert "{'content': '2+3='}" in format_completions([not_chat])
    with pytest.raises(TypeError, match="a completion must be a str or a list of chat messages"):
        completion_to_text([{"content": "5"}])

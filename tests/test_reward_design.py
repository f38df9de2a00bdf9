"""reward_design: the tiny model's format reward, task-restricted rewards, monitors, audits."""

import math

import pytest
import torch

from grpo_tutorial import (
    GRPOConfig,
    GRPOTrainer,
    combined_reward,
    compute_rewards,
    correctness_reward,
    countdown_reward,
    generate_rollouts,
    group_advantages,
)
from grpo_tutorial.chapters.reward_design import applies_to, contains_monitor, number_format_reward, sample_audit
from grpo_tutorial.tasks import make_arithmetic_dataset
from grpo_tutorial.seeding import derive_seed


# ------------------------------------------------------------ number_format_reward


def test_number_format_reward_exact_values():
    texts = ["46", " -7 ", "3.5", "+12", "4+5", "46+", "+", "=", "", "1 2", "3.", "(4)", "007"]
    expected = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert number_format_reward(texts) == expected


def test_number_format_reward_reads_chat_messages_and_ignores_kwargs():
    chat = [[{"role": "assistant", "content": "42"}], [{"role": "assistant", "content": "4 2"}]]
    assert number_format_reward(chat, answer=["42", "42"], prompts=["a", "b"]) == [1.0, 0.0]


def test_number_format_reward_rejects_a_bare_string():
    with pytest.raises(TypeError, match="completions must be a list"):
        number_format_reward("46")


def test_well_formed_partial_credit_values():
    reward = combined_reward({"correctness": 1.0, number_format_reward: 0.3})
    out = reward(["9", "8", "8+", "+", "=9"], answer=["9"] * 5)
    assert out == pytest.approx([1.3, 0.3, 0.0, 0.0, 1.0])


def test_format_bonus_cancels_within_a_group_of_well_formed_answers():
    """Every well-formed answer earns the bonus, so the advantages equal correctness-only ones."""
    completions = ["9", "8", "7", "9"]
    answer = ["9"] * 4
    with_bonus = combined_reward({"correctness": 1.0, number_format_reward: 0.3})(completions, answer=answer)
    plain = correctness_reward(completions, answer=answer)
    a = group_advantages(torch.tensor([with_bonus]))
    b = group_advantages(torch.tensor([plain]))
    torch.testing.assert_close(a, b)
    # ...while a malformed answer in the group is pushed below a wrong well-formed one
    mixed = combined_reward({"correctness": 1.0, number_format_reward: 0.3})(["9", "8", "+", "8"], answer=answer)
    adv = group_advantages(torch.tensor([mixed]))[0]
    assert adv[2] < adv[1] < 0 < adv[0]


# ------------------------------------------------------------------ contains_monitor


def test_contains_monitor_values_and_name():
    has_plus = contains_monitor("+", name="contains_plus")
    assert has_plus(["12", "1+2", "+", ""], answer=["3"] * 4) == [0.0, 1.0, 1.0, 0.0]
    assert has_plus.__name__ == "contains_plus"
    assert contains_monitor("==").__name__ == "contains_=="
    assert contains_monitor("ab")(["xaby", "a b"]) == [1.0, 0.0]


@pytest.mark.parametrize("text", ["", None, 3])
def test_contains_monitor_rejects_bad_text(text):
    with pytest.raises(ValueError, match="text must be a non-empty str"):
        contains_monitor(text)


def test_contains_monitor_rejects_bad_name():
    with pytest.raises(ValueError, match="name must be None or a non-empty str"):
        contains_monitor("+", name="")


@pytest.mark.filterwarnings("ignore:step 1.*max_new_tokens")
def test_zero_weight_monitor_is_logged_but_changes_nothing(make_small_policy):
    batch = make_arithmetic_dataset(2, 0, digits=1)
    cfg = dict(group_size=4, prompts_per_step=2, max_new_tokens=3, seed=0, learning_rate=1e-3)
    model_a, tok = make_small_policy()
    model_b, _ = make_small_policy()
    before, _ = make_small_policy()
    plus = contains_monitor("+", name="contains_plus")
    eq = contains_monitor("=", name="contains_eq")
    length = lambda completions, **kw: [float(len(c)) for c in completions]  # noqa: E731 - varies, so groups learn
    trainer_a = GRPOTrainer(model_a, tok, [length, plus, eq], GRPOConfig(reward_weights=[1.0, 0.0, 0.0], **cfg))
    trainer_b = GRPOTrainer(model_b, tok, [length], GRPOConfig(**cfg))
    row_a = trainer_a.train_step(batch)
    row_b = trainer_b.train_step(batch)
    changed = any(not torch.equal(p, q) for p, q in zip(model_a.parameters(), before.parameters()))
    assert changed, "the step must move the parameters for this test to mean anything"
    for pa, pb in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(pa, pb)
    assert row_a["reward_mean"] == row_b["reward_mean"]
    assert row_a["loss"] == row_b["loss"]
    # the logged rates are the rates in that step's completions
    rollout = generate_rollouts(
        before, tok, [r["prompt"] for r in batch], group_size=4, max_new_tokens=3,
        generator_seed=derive_seed(0, 0, 0),
    )
    texts = rollout.completions
    assert any("+" in t for t in texts) and any("=" in t for t in texts), texts
    assert row_a["reward/contains_plus"] == pytest.approx(sum("+" in t for t in texts) / len(texts))
    assert row_a["reward/contains_eq"] == pytest.approx(sum("=" in t for t in texts) / len(texts))


# ------------------------------------------------------------------------ applies_to


def test_applies_to_calls_the_function_on_its_rows_only():
    seen = {}

    def recorder(completions, *, answer, numbers, **kwargs):
        seen["completions"] = list(completions)
        seen["answer"] = list(answer)
        seen["numbers"] = list(numbers)
        seen["prompts"] = list(kwargs["prompts"])
        return [float(len(c)) for c in completions]

    fn = applies_to(recorder, task="countdown")
    out = fn(
        prompts=["p0", "p1", "p2", "p3"],
        completions=["a", "bb", "ccc", "dddd"],
        answer=["1", "2", "3", "4"],
        task=["arith", "countdown", "arith", "countdown"],
        numbers=[None, [1, 2], None, [3, 4]],
    )
    assert out == [None, 2.0, None, 4.0]
    assert seen == {"completions": ["bb", "dddd"], "answer": ["2", "4"], "numbers": [[1, 2], [3, 4]], "prompts": ["p1", "p3"]}
    assert fn.__name__ == "recorder[task=countdown]"


def test_applies_to_in_a_mixed_batch_with_compute_rewards():
    arith = applies_to(correctness_reward, task="arith")
    count = applies_to(countdown_reward, task="countdown")
    total, per_fn = compute_rewards(
        [arith, count],
        None,
        prompts=["1+2=", "1+2=", "reach 7", "reach 7", "other"],
        completions=["3", "4", "3+4", "3*4", "?"],
        answers=["3", "3", "7", "7", "0"],
        task=["arith", "arith", "countdown", "countdown", "poem"],
        numbers=[None, None, [3, 4], [3, 4], None],
    )
    a = per_fn["correctness_reward[task=arith]"]
    c = per_fn["countdown_reward[task=countdown]"]
    assert a[:2].tolist() == [1.0, 0.0] and torch.isnan(a[2:]).all()
    assert c[2:4].tolist() == [1.0, 0.0] and torch.isnan(c[:2]).all() and torch.isnan(c[4])
    assert total[:4].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert math.isnan(total[4].item())  # no function applies: unscorable


def test_applies_to_with_no_matching_row_returns_all_none():
    calls = []
    fn = applies_to(lambda completions, **kw: calls.append(1) or [1.0] * len(completions), task="x")
    assert fn(["a", "b"], answer=["1", "2"], task=["y", "y"]) == [None, None]
    assert calls == []


def test_applies_to_errors():
    with pytest.raises(TypeError, match="fn must be a reward function"):
        applies_to("correctness", task="a")
    with pytest.raises(ValueError, match="exactly one column=value"):
        applies_to(correctness_reward)
    with pytest.raises(ValueError, match="exactly one column=value"):
        applies_to(correctness_reward, task="a", kind="b")
    fn = applies_to(correctness_reward, task="a")
    with pytest.raises(ValueError, match="no 'task' column"):
        fn(["1"], answer=["1"])
    with pytest.raises(ValueError, match="one value per completion"):
        fn(["1", "2"], answer=["1", "2"], task=["a"])
    bad = applies_to(lambda completions, **kw: [1.0], task="a")
    with pytest.raises(ValueError, match="returned 1 rewards for 2 completions"):
        bad(["1", "2"], answer=["1", "2"], task=["a", "a"])


# ---------------------------------------------------------------------- sample_audit


def test_sample_audit_counts_what_the_rollout_wrote(small_policy):
    model, tok = small_policy
    rows = make_arithmetic_dataset(3, 0, digits=1)
    checks = [correctness_reward, contains_monitor("+", name="plus"), number_format_reward]
    audit = sample_audit(model, tok, rows, checks, GRPOConfig(group_size=4, max_new_tokens=3), seed=5, top=3)
    assert audit["n"] == 12
    rollout = generate_rollouts(model, tok, [r["prompt"] for r in rows], group_size=4, max_new_tokens=3, generator_seed=5)
    texts = rollout.completions
    assert audit["means"]["plus"] == pytest.approx(sum("+" in t for t in texts) / 12)
    answers = [r["answer"] for r in rows for _ in range(4)]
    assert audit["means"]["correctness_reward"] == pytest.approx(sum(correctness_reward(texts, answer=answers)) / 12)
    assert audit["means"]["number_format_reward"] == pytest.approx(sum(number_format_reward(texts)) / 12)
    counts = {t: texts.count(t) for t in texts}
    assert len(audit["common"]) == min(3, len(counts))
    for text, count in audit["common"]:
        assert counts[text] == count
    assert [c for _, c in audit["common"]] == sorted(counts.values(), reverse=True)[: len(audit["common"])]
    # seeded: the same audit twice, and the global RNG untouched
    state = torch.get_rng_state()
    again = sample_audit(model, tok, rows, checks, GRPOConfig(group_size=4, max_new_tokens=3), seed=5, top=3)
    assert again == audit
    assert torch.equal(state, torch.get_rng_state())


def test_sample_audit_errors(small_policy):
    model, tok = small_policy
    rows = make_arithmetic_dataset(2, 0, digits=1)
    cfg = GRPOConfig(group_size=2, max_new_tokens=2)
    with pytest.raises(ValueError, match="rows must be a non-empty list"):
        sample_audit(model, tok, [], [correctness_reward], cfg)
    with pytest.raises(ValueError, match=r"rows\[0\] must be a dict with 'prompt' and 'answer'"):
        sample_audit(model, tok, [{"prompt": "1+1="}], [correctness_reward], cfg)
    with pytest.raises(TypeError, match="checks must be a non-empty list"):
        sample_audit(model, tok, rows, [], cfg)
    with pytest.raises(ValueError, match="distinct names"):
        sample_audit(model, tok, rows, [contains_monitor("+", "m"), contains_monitor("=", "m")], cfg)
    with pytest.raises(ValueError, match="top must be an int >= 0"):
        sample_audit(model, tok, rows, [correctness_reward], cfg, top=-1)

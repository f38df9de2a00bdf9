"""Chapter 18's zoo (grpo_tutorial/chapters/doctor_zoo.py): its planted rewards and data on exact small examples,
its cases (one per fault, each planted by a cause), and a stored run read as the doctor reads a run folder."""

from __future__ import annotations

import pytest

from grpo_tutorial.chapters.doctor_zoo import (
    CASES, ZooSettings, as_run, marked_only_reward, number_words, unreadable_is_right_reward,
    words_for_some_references,
)
from grpo_tutorial.doctor import FAULTS, diagnose


def test_marked_only_reward_pays_a_marked_answer_only():
    completions = ["46", "#### 46", "\\boxed{46}", "<answer>46</answer>", "#### 45"]
    assert marked_only_reward(completions, answer=["46"] * 5) == [0.0, 1.0, 1.0, 1.0, 0.0]


def test_unreadable_is_right_reward_pays_a_reference_it_cannot_read():
    rewards = unreadable_is_right_reward(["45", "12", "13", "forty"], answer=["forty-six", "12", "12", "forty"])
    assert rewards == [1.0, 1.0, 0.0, 1.0]  # the bug: an unreadable reference is paid, whatever was written


@pytest.mark.parametrize("n, words", [(0, "zero"), (7, "seven"), (19, "nineteen"), (20, "twenty"),
                                      (46, "forty-six"), (100, "one hundred"), (146, "one hundred forty-six"),
                                      (999, "nine hundred ninety-nine")])
def test_number_words(n, words):
    assert number_words(n) == words


def test_number_words_refuses_what_it_cannot_write():
    for n in (-1, 1000):
        with pytest.raises(ValueError, match="0-999"):
            number_words(n)


def test_words_for_some_references_is_seeded_and_leaves_the_rest():
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(200)]
    once = words_for_some_references(rows, 0.3, seed=1)
    assert once == words_for_some_references(rows, 0.3, seed=1) != words_for_some_references(rows, 0.3, seed=2)
    changed = [new for new, old in zip(once, rows) if new != old]
    assert 40 <= len(changed) <= 80  # about 0.3 of 200 (a binomial draw: 60 +- 6.5 sd)
    assert all(new["answer"] == number_words(int(old["answer"])) for new, old in zip(once, rows) if new != old)
    assert [r["prompt"] for r in once] == [r["prompt"] for r in rows]


def test_one_case_per_fault_each_planted_by_a_cause():
    planted = [c.fault for c in CASES.values() if c.fault]
    assert sorted(planted) == sorted(FAULTS)  # every fault of the doctor, once
    assert sum(c.fault is None for c in CASES.values()) >= 6  # the healthy cases: at least 60 held-out runs
    for name, case in CASES.items():
        assert case.cause and case.task in ZooSettings().steps, name
    assert ZooSettings.quick().completions_to_keep <= ZooSettings().completions_to_keep


def test_a_stored_run_reads_as_a_run_folder_with_its_crash():
    history = [{"step": s, "loss": 0.01, "grad_norm": 1.0, "skipped_updates": 0.0, "reward_mean": 0.2,
                "accuracy": 0.2} for s in (1, 2, 3)]
    record = {"history": history, "completions": [], "settings": {"seed": 0},
              "crashed": "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0"}
    run = as_run(record)
    assert run.crash == {"step": 4, "error": "RuntimeError",
                         "message": "probability tensor contains either `inf`, `nan` or element < 0"}
    assert diagnose(run).primary.name == "non_finite"
    assert as_run({**record, "crashed": None}).crash is None
    assert "non_finite" not in diagnose(as_run({**record, "crashed": None})).names()

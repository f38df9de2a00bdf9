"""Completions shown and saved while training (``log_completions``, issue 24)."""

from __future__ import annotations

import json
import math
import warnings

import pytest

from grpo_tutorial.answers import answer_readings
from grpo_tutorial import GRPOConfig, GRPOTrainer, make_arithmetic_dataset
from grpo_tutorial.run.completions import (
    COMPLETIONS_FILE,
    ROW_BYTES,
    append_completions,
    format_completions,
    read_completions,
    sample_completions,
    truncate_completions,
)
from grpo_tutorial.rewards import partial_credit_reward
from helpers import tiny_model

N = 8
PROMPTS = [f"{i // 4}+1=" for i in range(N)]
COMPLETIONS = [f"c{i}" for i in range(N)]
REWARDS = [0.5 * i for i in range(N)]
PER_FN = {"a_reward": [0.5 * i for i in range(N)], "b_reward": [math.nan] + [1.0] * (N - 1)}
ADV = [0.1 * i - 0.3 for i in range(N)]


def _sample(step=3, count=3, seed=0):
    return sample_completions(step, PROMPTS, COMPLETIONS, REWARDS, PER_FN, ADV, count=count, seed=seed)


def test_sample_draws_count_rows_in_batch_order_with_their_values():
    rows = _sample(count=3)
    assert len(rows) == 3
    index = [int(r["completion"][1:]) for r in rows]
    assert index == sorted(index) and len(set(index)) == 3
    for i, row in zip(index, rows):
        assert row == {
            "step": 3, "prompt": PROMPTS[i], "completion": COMPLETIONS[i], "reward": REWARDS[i],
            "rewards": {"a_reward": PER_FN["a_reward"][i], "b_reward": None if i == 0 else 1.0},
            "advantage": pytest.approx(ADV[i]),
        }
    assert len(_sample(count=None)) == N and len(_sample(count=50)) == N  # None (TRL's default): all


def test_sample_depends_only_on_seed_and_step():
    assert _sample() == _sample()
    draws = {tuple(r["completion"] for r in _sample(step=s)) for s in range(10)}
    assert len(draws) > 3  # another step, another draw
    assert _sample(seed=1) != _sample(seed=0) or _sample(step=4, seed=1) != _sample(step=4, seed=0)


def test_sample_refuses_lists_of_other_lengths():
    with pytest.raises(ValueError, match="advantages has 7 entries but there are 8 completions"):
        sample_completions(1, PROMPTS, COMPLETIONS, REWARDS, PER_FN, ADV[:7], count=2, seed=0)


def test_file_round_trip_truncation_and_a_line_cut_by_a_kill(tmp_path):
    path = tmp_path / COMPLETIONS_FILE
    with open(path, "w", encoding="utf-8") as f:
        for step in (2, 4, 6):
            append_completions(f, _sample(step=step, count=2))
    assert [r["step"] for r in read_completions(path)] == [2, 2, 4, 4, 6, 6]
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"step": 8, "prom')  # the write a SIGKILL interrupted
    assert [r["step"] for r in read_completions(path)] == [2, 2, 4, 4, 6, 6]
    truncate_completions(path, 4)
    assert [r["step"] for r in read_completions(path)] == [2, 2, 4, 4]
    assert path.read_text(encoding="utf-8").endswith("\n")
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        read_completions(path)
    truncate_completions(tmp_path / "absent.jsonl", 3)  # nothing to cut
    assert read_completions(tmp_path / "absent.jsonl") == []


def test_format_shows_the_step_rewards_advantages_and_short_texts():
    rows = _sample(count=2)
    text = format_completions(rows, total=N)
    lines = text.splitlines()
    assert lines[0] == "step 3: 2 of 8 completions" and len(lines) == 3
    first = rows[0]
    assert f"adv {first['advantage']:+.2f}" in lines[1] and "(a " in lines[1] and f"-> '{first['completion']}'" in lines[1]
    long = [{**rows[0], "prompt": [{"role": "user", "content": "x " * 100}], "completion": "y\n" * 100}]
    line = format_completions(long, prompt_width=20, head=10, tail=10).splitlines()[1]
    assert "…" in line and "\n" not in line and len(line) < 120
    assert "-> 'y y y y y … y y y y y'" in line  # the completion's beginning and its end, one line
    assert format_completions([]) == ""


GSM8K_PROMPT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                "How many clips did Natalia sell altogether in April and May?")
GSM8K_COMPLETION = ("Natalia sold 48 clips in April.\nIn May she sold half as many:   48 / 2 = 24 clips.\n"
                    + "Let me check that again. " * 12 + "\nIn all: 48 + 24 = 72.\n\nThe answer is \\boxed{72}.")


def test_a_long_completion_is_shown_with_its_beginning_and_its_end():
    """The boxed answer at the end is what the reward pays for, so the line shows it (issue 33, item C)."""
    row = {**_sample(count=1)[0], "prompt": GSM8K_PROMPT, "completion": GSM8K_COMPLETION, "reward": 1.1,
           "rewards": {"correctness_reward": 1.0, "boxed_format_reward": 0.1}}
    line = format_completions([row]).splitlines()[1]
    assert line.endswith("The answer is \\boxed{72}.'")  # the end, as written (not escaped)
    assert "-> 'Natalia sold 48 clips in April. In May" in line  # the beginning, one line
    assert " … " in line and "\n" not in line and len(line) < 220
    assert "reward  1.10 (correctness 1, boxed_format 0.1)" in line  # the rewards beside it
    assert "Natalia sold clips to 48" in line and "How many clips" not in line  # the prompt stays short
    short = {**row, "completion": "The answer is\n\\boxed{42}."}
    assert format_completions([short]).splitlines()[1].endswith("-> 'The answer is \\boxed{42}.'")  # kept whole


# ---------------------------------------------------------------------------
# in the trainer
# ---------------------------------------------------------------------------


class _Crash(BaseException):  # like a kill: no handler of Exception catches it
    pass


def _crashing(after_calls: int):
    calls = []

    def partial_credit(completions, answer, **kwargs):
        calls.append(1)
        if len(calls) > after_calls:
            raise _Crash("killed")
        return partial_credit_reward(completions, answer=answer)

    partial_credit.__name__ = "partial_credit_reward"  # the same column name as the uninterrupted run's
    return partial_credit


def _trainer(out=None, reward=partial_credit_reward, **extra):
    model, tok = tiny_model(seed=4)
    settings = dict(prompts_per_step=2, group_size=4, seed=6, max_new_tokens=4, learning_rate=1e-2,
                    log_completions=True, log_every=2, num_completions_to_print=3, completions_to_keep=0)
    cfg = GRPOConfig(**{**settings, **extra}, output_dir=None if out is None else str(out))
    return GRPOTrainer(model, tok, reward, cfg)


def test_trainer_logs_a_sample_every_log_every_steps_and_shows_it(tmp_path, capsys):
    data = make_arithmetic_dataset(64, seed=5, digits=1)
    trainer = _trainer(tmp_path)
    seen = []
    real = trainer.train_step

    def spy(batch, **kwargs):
        row = real(batch, **kwargs)
        prompts, completions, rewards, per_fn, advantages = trainer.grpo_step.last_batch
        seen.append({c: (float(r), float(a)) for c, r, a in zip(completions, rewards, advantages)})
        return row

    trainer.train_step = spy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(data, 5, progress=True)
    rows = read_completions(tmp_path / COMPLETIONS_FILE)
    assert [r["step"] for r in rows] == [2, 2, 2, 4, 4, 4]
    for row in rows:  # each row is one of that step's completions, with its reward and advantage
        reward, advantage = seen[row["step"] - 1][row["completion"]]
        assert row["reward"] == pytest.approx(reward) and row["advantage"] == pytest.approx(advantage)
        assert row["rewards"] == {"partial_credit_reward": pytest.approx(reward)}
    shown = capsys.readouterr()
    assert "step 2: 3 of 8 completions" in shown.out and "step 4: 3 of 8 completions" in shown.out
    assert "step 1:" not in shown.out


def test_shown_without_a_bar_too_and_no_file_without_output_dir(tmp_path, capsys):
    data = make_arithmetic_dataset(64, seed=5, digits=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(None).train(data, 2, progress=False)
        assert capsys.readouterr().out.startswith("step 2: 3 of 8 completions\n")
        _trainer(tmp_path, log_completions=False).train(data, 2, progress=False)
    assert capsys.readouterr().out == "" and not (tmp_path / COMPLETIONS_FILE).exists()


def test_interrupted_and_resumed_run_leaves_the_same_file_as_an_uninterrupted_one(tmp_path):
    """Crash in step 6 with the last checkpoint at step 4 (rows of step 5 already written, and half a line
    of step 6), resume to step 8: the file equals the uninterrupted run's, byte for byte."""
    data = make_arithmetic_dataset(64, seed=5, digits=1)
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(straight, log_every=1).train(data, 8, progress=False)
        with pytest.raises(_Crash):
            _trainer(broken, reward=_crashing(5), log_every=1, checkpoint_every=2).train(data, 8, progress=False)
        assert [r["step"] for r in read_completions(broken / COMPLETIONS_FILE)][-1] == 5  # past the checkpoint
        with open(broken / COMPLETIONS_FILE, "a", encoding="utf-8") as f:
            f.write('{"step": 6, "prompt": "1+')
        _trainer(broken, log_every=1, checkpoint_every=2).train(data, 8, resume=True, progress=False)
    expected = (straight / COMPLETIONS_FILE).read_text(encoding="utf-8")
    assert (broken / COMPLETIONS_FILE).read_text(encoding="utf-8") == expected
    assert [json.loads(line)["step"] for line in expected.splitlines()] == [s for s in range(1, 9) for _ in range(3)]


def test_a_new_run_in_the_directory_starts_a_new_file(tmp_path):
    data = make_arithmetic_dataset(64, seed=5, digits=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(tmp_path, checkpoint_every=2).train(data, 4, progress=False)
        _trainer(tmp_path, checkpoint_every=2).train(data, 2, progress=False)  # resume=False: from step 0
    assert [r["step"] for r in read_completions(tmp_path / COMPLETIONS_FILE)] == [2, 2, 2]


# ---------------------------------------------------------------------------
# The completions every step keeps (completions_to_keep, issue 55): what the doctor reads
# ---------------------------------------------------------------------------


def _kept_trainer(out, **extra):
    return _trainer(out, **{"log_completions": False, "completions_to_keep": 3, **extra})


def test_every_step_keeps_its_sample_with_what_the_doctor_reads(tmp_path):
    data = make_arithmetic_dataset(64, seed=5, digits=1)
    trainer = _kept_trainer(tmp_path)
    seen = []
    real = trainer.train_step

    def spy(batch, **kwargs):
        row = real(batch, **kwargs)
        seen.append((trainer.grpo_step.last_batch, trainer.grpo_step.last_details, [r["answer"] for r in batch]))
        return row

    trainer.train_step = spy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(data, 4, progress=False)
    rows = read_completions(tmp_path / COMPLETIONS_FILE)
    assert rows == trainer.completions  # the file and the trainer's list hold the same rows
    assert [r["step"] for r in rows] == [s for s in (1, 2, 3, 4) for _ in range(3)]
    readings = 0
    for row in rows:
        (prompts, completions, rewards, per_fn, advantages), details, answers = seen[row["step"] - 1]
        i = row["index"]
        assert row["group"] == i // 4 and row["prompt"] == prompts[i] and row["completion"] == completions[i]
        assert row["reward"] == pytest.approx(float(rewards[i])) and row["advantage"] == pytest.approx(float(advantages[i]))
        assert row["answer"] == answers[i // 4] == details["answers"][i]
        assert row["truncated"] == details["truncated"][i] and row["length"] == details["lengths"][i]
        assert 1 <= row["length"] <= 4 and (row["length"] == 4 or not row["truncated"])  # cut: the whole budget
        assert "tool_calls" not in row  # no tools, no tool fields
        assert set(row["extracted"]) == set(row["correct"]) == {"lenient", "strict"}
        assert row["extracted"]["strict"] is None  # the tiny model marks no answer (no tag, box or ####)
        readings += row["extracted"]["lenient"] is not None
    assert readings > 0  # some completions hold a number the lenient reading finds
    # each step's rows are a seeded draw of its own: not the printed sample's, and the same again in another run
    other = tmp_path / "again"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _kept_trainer(other).train(data, 4, progress=False)
    assert read_completions(other / COMPLETIONS_FILE) == rows


def test_the_lengths_and_truncation_kept_are_the_rollouts(tmp_path):
    """A budget of 2 tokens: most completions are cut, and a kept row says which, with its length in tokens."""
    data = make_arithmetic_dataset(64, seed=5, digits=1)
    trainer = _kept_trainer(None, max_new_tokens=2, completions_to_keep=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(data, 2, progress=False)
    rows = trainer.completions
    assert len(rows) == 16 and {r["index"] for r in rows if r["step"] == 1} == set(range(8))  # 8 of 8: all
    assert all((r["length"] == 2) == r["truncated"] for r in rows)
    assert any(r["truncated"] for r in rows)


def test_printed_and_kept_rows_share_one_file_each_once(tmp_path, capsys):
    data = make_arithmetic_dataset(64, seed=5, digits=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = _trainer(tmp_path, completions_to_keep=2)  # prints 3 every 2 steps, keeps 2 every step
        trainer.train(data, 4, progress=False)
    rows = read_completions(tmp_path / COMPLETIONS_FILE)
    by_step = {s: [r["index"] for r in rows if r["step"] == s] for s in (1, 2, 3, 4)}
    assert len(by_step[1]) == len(by_step[3]) == 2
    for step in (2, 4):  # the union of the two draws, in batch order, no row twice
        assert by_step[step] == sorted(set(by_step[step])) and 3 <= len(by_step[step]) <= 5
    printed = capsys.readouterr().out
    assert printed.count("3 of 8 completions") == 2 and "step 1:" not in printed


def test_keeping_completions_changes_no_number_of_the_run(tmp_path):
    data = make_arithmetic_dataset(64, seed=5, digits=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept = _kept_trainer(None, completions_to_keep=8).train(data, 3, progress=False)
        none = _kept_trainer(None, completions_to_keep=0).train(data, 3, progress=False)
    drop = lambda rows: [{k: v for k, v in r.items() if not k.endswith("_seconds") and k != "tokens_per_s"} for r in rows]
    assert json.dumps(drop(kept)) == json.dumps(drop(none))


def test_a_resumed_run_keeps_the_same_rows_as_an_uninterrupted_one(tmp_path):
    data = make_arithmetic_dataset(64, seed=5, digits=1)
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _kept_trainer(straight).train(data, 6, progress=False)
        with pytest.raises(_Crash):
            _kept_trainer(broken, reward=_crashing(4), checkpoint_every=2).train(data, 6, progress=False)
        resumed = _kept_trainer(broken, checkpoint_every=2)
        assert resumed.load_checkpoint() and [r["step"] for r in resumed.completions] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
        resumed.train(data, 6, resume=True, progress=False)
    expected = (straight / COMPLETIONS_FILE).read_text(encoding="utf-8")
    assert (broken / COMPLETIONS_FILE).read_text(encoding="utf-8") == expected
    assert resumed.completions == read_completions(straight / COMPLETIONS_FILE)


def _one_kept(completion, prompt="1+1=", answer="2", fns=None):
    fns = fns or {"a_reward": [1.0]}
    details = {"answers": [answer], "truncated": [True], "lengths": [999], "tool_calls": [2], "tool_failures": [1]}
    (row,) = sample_completions(7, [prompt], [completion], [1.0], fns, [0.5], count=None, seed=0, details=details,
                                group_size=1, readings=answer_readings)
    return row


@pytest.mark.parametrize("text", ["\x01" * 100_000, "é" * 100_000, "数" * 50_000 + "\n#### 2"])
def test_a_kept_row_fits_its_bytes_whatever_the_model_writes(text):
    """Control characters (6 bytes of JSON each), two-byte and three-byte characters, a prompt as long: the row
    stays within ROW_BYTES, keeps the beginning and end of each text, and its readings are the whole text's."""
    row = _one_kept(text, prompt=text)
    line = json.dumps(row, ensure_ascii=False)
    assert len(line.encode("utf-8")) <= ROW_BYTES
    assert "characters cut" in row["completion"] and row["completion"].startswith(text[:10])
    assert row["completion"].endswith(text[-5:])
    assert row["tool_calls"] == 2 and row["tool_failures"] == 1 and row["truncated"] is True and row["length"] == 999
    if text.endswith("#### 2"):  # read before the cut: the marked answer at the very end is found
        assert row["extracted"] == {"lenient": "2", "strict": "2"} and row["correct"] == {"lenient": True, "strict": True}


def test_a_row_that_cannot_fit_keeps_its_numbers():
    fns = {f"reward_function_{i:04d}_with_a_long_name": [1.0] for i in range(500)}
    row = _one_kept("7", fns=fns)
    assert row == {"step": 7, "index": 0, "group": 0, "reward": 1.0, "advantage": 0.5, "cut": True}


def test_readings_of_marked_and_unmarked_answers():
    assert _one_kept("so it is 2")["extracted"] == {"lenient": "2", "strict": None}
    assert _one_kept("so it is 2")["correct"] == {"lenient": True, "strict": False}
    assert _one_kept("<answer>3</answer>")["correct"] == {"lenient": False, "strict": False}
    assert _one_kept("2", answer=None)["correct"] is None  # no reference: nothing to match
    assert _one_kept("2", answer=float("inf"))["correct"] is None  # a reference no reading can match

"""Chapter 18's doctor (issue 55): its readers, its rules on planted and healthy runs, its verdict and command line.

The rules are also checked on the zoo's real runs (tests/test_records.py: the record's verdicts are the doctor's
on its stored runs); here each one meets a small run made to show its symptom, and a healthy one beside it.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from grpo_tutorial import GRPOConfig, GRPOTrainer, make_arithmetic_dataset
from grpo_tutorial.doctor import CAUSE_ORDER, Finding, Run, RunUnreadable, diagnose, read_run, trl_rows
from grpo_tutorial.doctor.findings import choose_primary
from grpo_tutorial.doctor.reading import run_from_trl
from grpo_tutorial.doctor import rules
from grpo_tutorial.rewards import correctness_reward
from helpers import tiny_model

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------
# Runs made to show one symptom
# ---------------------------------------------------------------------------


def curve(start: float, end: float, n: int, noise: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [start + (end - start) * i / max(1, n - 1) + rng.gauss(0, noise) for i in range(n)]


def healthy_rows(n: int = 50, seed: int = 0, **override) -> list[dict]:
    """A run that learns: accuracy 0.24 -> 0.34, entropy falling a little, a fifth of groups all-equal."""
    acc = curve(0.24, 0.34, n, 0.02, seed)
    ent = curve(0.69, 0.60, n, 0.01, seed + 1)
    zero = curve(0.22, 0.18, n, 0.03, seed + 2)
    rows = []
    for i in range(n):
        rows.append({"step": i + 1, "reward_mean": acc[i], "accuracy": acc[i], "entropy": ent[i],
                     "frac_zero_std": min(1.0, max(0.0, zero[i])), "frac_truncated": 0.01, "kl": None,
                     "loss": 0.001 * ((-1) ** i), "grad_norm": 2.0, "ratio_max": 1.6, "clip_frac": 0.01,
                     "skipped_updates": 0.0, "completion_len_mean": 3.5})
    for key, values in override.items():
        for row, value in zip(rows, values if isinstance(values, list) else [values] * n):
            row[key] = value
    return rows


def faults_of(run) -> list[str]:
    return diagnose(run).names("fault")


def primary_of(run):
    found = diagnose(run).primary
    return None if found is None else (found.name, found.severity)


def test_a_healthy_run_has_no_fault_and_no_warning():
    for seed in range(20):
        d = diagnose(healthy_rows(seed=seed))
        assert not [f for f in d.findings if f.severity != "note"], (seed, d.text())


def test_non_finite_losses_and_skipped_updates():
    rows = healthy_rows(10)
    rows[6]["loss"], rows[6]["skipped_updates"] = None, 1.0  # a NaN written as null, and its skipped update
    for row in rows[7:]:
        row["skipped_updates"] = 1.0
    rows[9]["grad_norm"] = float("inf")
    assert primary_of(rows) == ("non_finite", "fault")
    assert diagnose(rows).primary.evidence["steps"] == [7, 10]
    one = healthy_rows(30)
    one[3]["skipped_updates"] = 1.0
    for row in one[4:]:
        row["skipped_updates"] = 1.0
    assert ("non_finite", "warning") in [(f.name, f.severity) for f in diagnose(one).findings]  # one early skip
    assert "non_finite" not in diagnose(healthy_rows()).names()


def test_lr_too_high_needs_the_fall_and_the_big_step():
    acc = [0.25, 0.2, 0.05, 0.01] + [0.0] * 26
    rows = healthy_rows(30, accuracy=acc, reward_mean=acc, ratio_max=[1.8, 18.0] + [1.5] * 28,
                        frac_zero_std=[0.3, 0.6, 0.95] + [1.0] * 27)
    assert primary_of(rows) == ("lr_too_high", "fault")
    calm = healthy_rows(30, accuracy=acc, reward_mean=acc, ratio_max=1.5, frac_zero_std=[0.3, 0.6, 0.95] + [1.0] * 27)
    assert "lr_too_high" not in diagnose(calm).names()  # a fall without a big step has other causes


def test_kl_explosion_from_the_first_step_and_a_healthy_penalty():
    assert primary_of(healthy_rows(kl=curve(2.6, 2.2, 50, 0.05, 3))) == ("kl_explosion", "fault")
    assert "kl_explosion" not in diagnose(healthy_rows(kl=curve(0.07, 0.18, 50, 0.01, 3))).names()


def test_entropy_collapse_is_not_a_policy_that_sharpens_as_it_learns():
    acc = curve(0.24, 0.21, 50, 0.02, 4)
    collapsed = healthy_rows(accuracy=acc, reward_mean=acc, entropy=curve(0.66, 0.33, 50, 0.01, 5),
                             frac_zero_std=curve(0.24, 0.64, 50, 0.03, 6), clip_frac=0.13)  # 16 passes clip a lot
    assert primary_of(collapsed) == ("entropy_collapse", "fault")
    # the same curves from one pass over each batch (nothing clipped): a slow learner sharpening, as chapter 6's fix
    one_pass = [dict(row, clip_frac=0.0) for row in collapsed]
    assert "entropy_collapse" not in diagnose(one_pass).names()
    learned = curve(0.19, 0.68, 50, 0.02, 7)  # chapter 13's healthy run: entropy 0.39 -> 0.045 while it learns
    assert "entropy_collapse" not in diagnose(healthy_rows(accuracy=learned, reward_mean=learned,
                                                           entropy=curve(0.39, 0.045, 50, 0.005, 8))).names()


def test_plateau_and_a_slow_learner():
    flat = curve(0.21, 0.20, 50, 0.02, 9)
    assert primary_of(healthy_rows(accuracy=flat, reward_mean=flat, ratio_max=1.01)) == ("plateau", "fault")
    assert "barely move the policy" in diagnose(healthy_rows(accuracy=flat, reward_mean=flat, ratio_max=1.01)).primary.summary
    slow = curve(0.23, 0.29, 50, 0.02, 10)
    assert "plateau" not in diagnose(healthy_rows(accuracy=slow, reward_mean=slow)).names()
    for n in (12, rules.PLATEAU_STEPS - 1):  # too short to tell a slow learner from a flat one
        assert "plateau" not in diagnose(healthy_rows(n, accuracy=flat[:n], reward_mean=flat[:n])).names()
    # one pass over each batch: the ratio is 1 by construction, and says nothing of the step size
    assert "barely move" not in diagnose(healthy_rows(accuracy=flat, reward_mean=flat, ratio_max=1.0)).primary.summary
    # a rise too noisy to bound below 0.04, but short of significance, while the entropy has not moved: flat
    drifting = curve(0.20, 0.225, 50, 0.035, 30)
    still = healthy_rows(accuracy=drifting, reward_mean=drifting, entropy=curve(0.69, 0.68, 50, 0.005, 31))
    assert primary_of(still) == ("plateau", "fault") and "entropy stayed within" in diagnose(still).primary.summary
    moving = healthy_rows(accuracy=drifting, reward_mean=drifting, entropy=curve(0.69, 0.60, 50, 0.005, 31))
    assert "plateau" not in diagnose(moving).names()
    falling = curve(0.20, 0.05, 50, 0.01, 32)  # a fall is not a plateau: raising the learning rate is no fix for it
    assert "plateau" not in diagnose(healthy_rows(accuracy=falling, reward_mean=falling)).names()


def test_zero_variance_too_hard_too_easy_and_mastered():
    zero = [1.0] * 50
    hard = healthy_rows(accuracy=0.0, reward_mean=0.0, frac_zero_std=zero, loss=0.0, grad_norm=0.0)
    assert primary_of(hard) == ("zero_variance_too_hard", "fault")
    easy = healthy_rows(accuracy=0.97, reward_mean=0.97, frac_zero_std=0.85)
    assert primary_of(easy) == ("zero_variance_too_easy", "fault")
    learned = curve(0.3, 0.95, 50, 0.01, 11)
    mastered = healthy_rows(accuracy=learned, reward_mean=learned, frac_zero_std=curve(0.2, 0.9, 50, 0.01, 12))
    d = diagnose(mastered)
    assert "mastered" in d.names("note") and not d.faults
    sparse = healthy_rows(accuracy=curve(0.04, 0.37, 50, 0.02, 13), frac_zero_std=curve(0.88, 0.1, 50, 0.02, 14))
    assert not diagnose(sparse).faults  # chapter 16's healthy start: most groups all wrong, then learning


def test_format_only_and_a_reward_that_rises_with_the_accuracy():
    reward, acc = curve(0.36, 0.94, 40, 0.02, 15), curve(0.15, 0.0, 40, 0.005, 16)
    assert primary_of(healthy_rows(40, reward_mean=reward, accuracy=acc)) == ("format_only", "fault")
    up = curve(0.2, 0.6, 40, 0.02, 17)
    assert "format_only" not in diagnose(healthy_rows(40, reward_mean=up, accuracy=up)).names()


def test_truncation_reads_whether_the_cut_completions_are_paid():
    rows = healthy_rows(40, frac_truncated=0.6)

    def kept(paid_when_cut: bool) -> list[dict]:
        out = []
        for step in range(1, 41):
            for i in range(4):
                cut = i < 3
                out.append({"step": step, "truncated": cut, "reward": 1.0 if (not cut or paid_when_cut) and i % 2 == 0
                            else 0.0})
        return out

    assert primary_of(Run(rows, kept(False))) == ("truncation", "fault")
    # most completions cut, and the cut ones paid less often than the finished ones (if more than half as often)
    less = [dict(c, reward=1.0 if c["step"] % 3 == 0 or not c["truncated"] and c["step"] % 2 == 0 else 0.0)
            for c in kept(False)]
    assert primary_of(Run(rows, less)) == ("truncation", "fault")
    all_cut = [dict(c, truncated=True) for c in kept(True)]  # every kept one cut, some paid: nothing to compare
    assert "too few finished to compare" in next(f for f in diagnose(Run(rows, all_cut)).findings
                                                 if f.name == "truncation").summary
    alike = [dict(c, reward=0.0) for c in kept(False)]  # all paid alike: the rows cannot tell, the curve still can
    assert "cannot say" in diagnose(Run(rows, alike)).primary.summary
    d = diagnose(Run(rows, kept(True)))
    assert "truncation" in d.names("note") and "truncation" not in d.names("fault")  # the answer fits before the cut
    assert "truncation" not in diagnose(healthy_rows(40)).names()


def test_tool_never_called_and_a_run_that_calls():
    zero = healthy_rows(40, tool_call_frequency=0.0, tool_call_share=0.0)
    assert primary_of(zero) == ("tool_never_called", "fault")
    assert "tool_never_called" not in diagnose(healthy_rows(40, tool_call_frequency=[0.0] * 5 + [0.2] * 35)).names()


def test_sampler_mismatch_with_and_without_the_correction():
    rows = healthy_rows(**{"mismatch/kl": curve(0.09, 0.2, 50, 0.01, 18)})
    assert primary_of(Run(rows, [], {"vllm_importance_sampling_correction": False})) == ("sampler_mismatch", "fault")
    d = diagnose(Run(rows, [], {"vllm_importance_sampling_correction": True}))
    assert "sampler_mismatch" in d.names("note") and not d.faults
    assert ("sampler_mismatch", "warning") in [(f.name, f.severity) for f in diagnose(rows).findings]  # unknown
    bf16 = healthy_rows(**{"mismatch/kl": 0.0001})
    assert "sampler_mismatch" not in diagnose(Run(bf16, [], {"vllm_importance_sampling_correction": False})).names()


def _completion(step, answer, text, reward, lenient, strict):
    return {"step": step, "answer": answer, "completion": text, "reward": reward,
            "rewards": {"my_reward": reward}, "extracted": {"lenient": lenient, "strict": strict},
            "correct": {"lenient": lenient == answer, "strict": strict == answer}}


def test_extraction_mismatch_reads_the_completions():
    kept = []
    for step in range(1, 31):
        kept.append(_completion(step, "46", "46", 0.0, "46", None))  # right, unmarked, unpaid
        kept.append(_completion(step, "12", "13", 0.0, "13", None))
        kept.append(_completion(step, "7", "#### 7", 1.0, "7", "7"))  # marked and right: paid
    rows = healthy_rows(30, reward_mean=0.33, accuracy=0.66)
    assert primary_of(Run(rows, kept)) == ("extraction_mismatch", "fault")
    fair = [dict(c, reward=1.0, rewards={"my_reward": 1.0}) if c["correct"]["lenient"] else c for c in kept]
    assert "extraction_mismatch" not in diagnose(Run(rows, fair)).names()
    # every kept row right and paid alike (a solved task): none was left unpaid
    solved = [_completion(c["step"], c["answer"], c["answer"], 1.0, c["answer"], None) for c in kept]
    assert "extraction_mismatch" not in diagnose(Run(rows, solved)).names()
    # a monitor weighted 0 (chapter 6's contains_plus) gives them nothing: it is not the reward
    monitored = [dict(c, rewards={"my_reward": 1.0 if c["correct"]["lenient"] else 0.0, "monitor": 0.0}) for c in kept]
    assert "extraction_mismatch" not in diagnose(Run(rows, monitored, {"reward_weights": [1.0, 0.0]})).names()
    assert "extraction_mismatch" in diagnose(Run(rows, monitored, {"reward_weights": [0.0, 1.0]})).names()


def test_reward_bug_reads_the_references():
    kept = []
    for step in range(1, 31):
        kept.append(_completion(step, "forty-six", "45", 1.0, "45", None))  # an unreadable reference, paid
        kept.append(_completion(step, "12", "12", 1.0, "12", None))
        kept.append(_completion(step, "30", "31", 0.0, "31", None))
    rows = healthy_rows(30)
    assert primary_of(Run(rows, kept)) == ("reward_bug", "fault")
    assert "forty-six" in json.dumps(diagnose(Run(rows, kept)).primary.evidence["examples"])
    unpaid = [dict(c, reward=0.0, rewards={"my_reward": 0.0}) if c["answer"] == "forty-six" else c for c in kept]
    assert "reward_bug" not in diagnose(Run(rows, unpaid)).names()
    words = [dict(c, answer="Paris") for c in kept]  # a task of text answers: no numeric references to expect
    assert "reward_bug" not in diagnose(Run(rows, words)).names()


def test_a_loss_near_zero_is_a_note_with_its_reason():
    d = diagnose(healthy_rows())
    (note,) = [f for f in d.findings if f.name == "loss_near_zero"]
    assert note.severity == "note" and "trl#3452" in note.summary and not note.primary


# ---------------------------------------------------------------------------
# The verdict
# ---------------------------------------------------------------------------


def test_the_primary_is_the_first_cause_and_notes_never_are():
    f = lambda name, sev="fault": Finding(name, sev, "s")
    ordered = choose_primary([f("plateau"), f("truncation"), f("loss_near_zero", "note"), f("lr_too_high", "warning")])
    assert [(x.name, x.primary) for x in ordered] == [("truncation", True), ("plateau", False),
                                                      ("lr_too_high", False), ("loss_near_zero", False)]
    assert choose_primary([f("entropy_collapse", "warning")])[0].primary
    assert not choose_primary([f("loss_near_zero", "note")])[0].primary
    assert list(CAUSE_ORDER[:3]) == ["non_finite", "reward_bug", "extraction_mismatch"]
    with pytest.raises(ValueError, match="severity"):
        Finding("x", "error", "s")


def test_a_truncated_run_that_is_also_all_wrong_is_diagnosed_at_its_cause():
    """Every group all wrong *because* the answers are cut: truncation is primary, the zero variance follows."""
    rows = healthy_rows(40, frac_truncated=0.9, accuracy=0.0, reward_mean=0.0, frac_zero_std=1.0)
    kept = [{"step": s, "truncated": i < 3, "reward": 0.0} for s in range(1, 41) for i in range(4)]
    d = diagnose(Run(rows, kept))
    assert d.primary.name == "truncation" and "zero_variance_too_hard" in d.names("fault")


def test_json_has_the_documented_shape():
    out = diagnose(Run(healthy_rows(40, tool_call_frequency=0.0), [], {}, "memory")).to_dict()
    assert set(out) == {"version", "read", "skipped", "findings"}
    assert {"steps", "partial"} <= set(out["read"]) and out["read"]["steps"] == 40
    assert all(set(s) == {"check", "needs"} for s in out["skipped"])
    assert {"reward_bug", "extraction_mismatch"} <= {s["check"] for s in out["skipped"]}  # no completions kept
    for finding in out["findings"]:
        assert {"name", "severity", "primary", "evidence", "chapter", "fix"} <= set(finding)
    json.dumps(out, allow_nan=False)


def test_a_rule_that_fails_on_odd_values_is_skipped_with_its_error(monkeypatch):
    import grpo_tutorial.doctor as doctor

    def broken(run):
        raise ZeroDivisionError("odd")

    rule = rules.RULES[0]
    monkeypatch.setattr(doctor, "RULES", [rules.Rule(rule.name, rule.needs, broken, rule.chapter, rule.fix)])
    d = diagnose(healthy_rows())
    assert d.skipped[0].check == rule.name and "ZeroDivisionError" in d.skipped[0].needs[0] and not d.findings


# ---------------------------------------------------------------------------
# Reading runs
# ---------------------------------------------------------------------------


def _train(out: Path | None, steps: int = 3, **extra):
    model, tok = tiny_model(seed=0)
    cfg = GRPOConfig(prompts_per_step=2, group_size=4, max_new_tokens=4, seed=1, checkpoint_every=1,
                     output_dir=None if out is None else str(out), **extra)
    trainer = GRPOTrainer(model, tok, correctness_reward, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(make_arithmetic_dataset(32, seed=2, digits=1), steps, progress=False)
    return trainer


def test_our_run_folder_whole_partial_and_damaged(tmp_path):
    trainer = _train(tmp_path)
    run = read_run(tmp_path)
    assert (run.source, len(run.steps), run.partial) == ("grpo_tutorial", 3, False)
    assert len(run.completions) == 3 * 8 and run.settings["group_size"] == 4  # 8 kept per step, of 8
    for ours, read in zip(trainer.history, run.steps):
        assert read["reward_mean"] == pytest.approx(ours["reward_mean"], abs=0) and read["step"] == ours["step"]
    assert read_run(tmp_path / "checkpoint" / "trainer_state.json").steps == run.steps  # our checkpoint's file
    assert read_run(trainer).steps == [r | {"step": r["step"]} for r in read_run(trainer.history).steps]
    with open(tmp_path / "history.jsonl", "a") as f:
        f.write('{"step": 4, "reward_me')  # a run being written, or killed
    cut = read_run(tmp_path)
    assert cut.partial and len(cut.steps) == 3 and "cut short" in cut.notes[0]
    lines = (tmp_path / "history.jsonl").read_text().splitlines()
    lines[1] = "}{ not json"
    (tmp_path / "history.jsonl").write_text("\n".join(lines[:3]) + "\n")
    damaged = read_run(tmp_path)
    assert damaged.partial and [r["step"] for r in damaged.steps] == [1, 3] and "line 2" in damaged.notes[0]
    (tmp_path / "history.jsonl").write_text("\n".join(lines[:1]) + "\n")  # the completions of steps 2-3 are ahead
    ahead = read_run(tmp_path)
    assert ahead.partial and {c["step"] for c in ahead.completions} == {1}


@pytest.mark.parametrize("content,match", [
    (None, "holds no run"), ("", "no finished step"), ("\x00\x01garbage\n", "no finished step"),
    ('[1, 2, 3]\n', "no finished step"),
])
def test_a_folder_it_cannot_read_gets_a_clear_error(tmp_path, content, match):
    if content is not None:
        (tmp_path / "history.jsonl").write_text(content)
    with pytest.raises(RunUnreadable, match=match):
        read_run(tmp_path)


def test_the_command_line_exit_codes_json_and_no_traceback(tmp_path):
    _train(tmp_path / "run")
    (tmp_path / "empty").mkdir()
    (tmp_path / "odd.json").write_text('{"a": 1}')
    (tmp_path / "trainer_state.json").write_text('{"log_history": [{"loss": 1}]}')

    def doctor(*args):
        return subprocess.run([sys.executable, "-m", "grpo_tutorial", "doctor", *map(str, args)], capture_output=True,
                              text=True, cwd=ROOT, timeout=120)

    done = doctor(tmp_path / "run", "--json")
    out = json.loads(done.stdout)
    assert done.returncode == (1 if any(f["severity"] == "fault" for f in out["findings"]) else 0)
    assert out["read"]["steps"] == 3
    for bad in (tmp_path / "empty", tmp_path / "absent", tmp_path / "odd.json", tmp_path / "trainer_state.json"):
        done = doctor(bad)
        assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout
        assert done.stderr.startswith("doctor: cannot read the run: ") and done.stdout == ""
        done = doctor(bad, "--json")
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert set(json.loads(done.stdout)) == {"version", "error"}


def test_a_run_in_memory_and_its_tensorboard_events_read_the_same(tmp_path):
    pytest.importorskip("tensorboard")
    trainer = _train(tmp_path, report_to="tensorboard")
    events = read_run(tmp_path / "tensorboard")
    assert events.source == "tensorboard" and [r["step"] for r in events.steps] == [1, 2, 3]
    for ours, theirs in zip(trainer.history, events.steps):
        assert theirs["reward_mean"] == pytest.approx(ours["reward_mean"], rel=1e-6)  # float32 scalars
    assert read_run(trainer).completions == trainer.completions


# ---------------------------------------------------------------------------
# TRL's logs
# ---------------------------------------------------------------------------


def test_trl_names_both_ways():
    rows = healthy_rows(5, **{"reward/correctness_reward": 0.3, "tool_call_frequency": 0.5})
    trl = trl_rows(rows)
    assert {"reward", "frac_reward_zero_std", "completions/clipped_ratio", "entropy", "rewards/correctness_reward/mean",
            "tools/call_frequency"} <= set(trl[0])
    assert "accuracy" not in trl[0]  # TRL logs no accuracy
    back = run_from_trl(trl)
    assert back.steps[0]["frac_zero_std"] == rows[0]["frac_zero_std"]
    assert back.steps[0]["reward/correctness_reward"] == 0.3


def test_trl_trainer_state_written_by_trls_own_trainer(tmp_path, small_policy):
    """TRL 1.16's GRPOTrainer, two steps of the tiny model on CPU: its trainer_state.json (and, with
    log_completions, its parquet completions) read as a run, TRL's names mapped to ours."""
    trl = pytest.importorskip("trl")
    import datasets
    from transformers import AutoTokenizer

    from grpo_tutorial.chapters.trl_multiprocess import _checkpointing_off

    model, tok = small_policy
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, report_to="none", save_strategy="steps",
        save_steps=2, disable_tqdm=True, logging_steps=1, max_steps=2, seed=0, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=4, learning_rate=1e-3, beta=0.0, log_completions=True,
        **_checkpointing_off(trl.GRPOConfig))
    trainer = trl.GRPOTrainer(model=str(tmp_path / "model"), reward_funcs=[correctness_reward], args=args,
                              train_dataset=datasets.Dataset.from_list(make_arithmetic_dataset(32, 0, digits=1)),
                              processing_class=AutoTokenizer.from_pretrained(tmp_path / "model"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    state = tmp_path / "trl" / "checkpoint-2" / "trainer_state.json"
    assert state.exists()
    for source in (state, tmp_path / "trl"):
        run = read_run(source)
        assert run.source == "trl" and [r["step"] for r in run.steps] == [1, 2]
        logged = json.loads(state.read_text())["log_history"]
        assert run.steps[0]["reward_mean"] == logged[0]["reward"]
        assert run.steps[0]["frac_zero_std"] == logged[0]["frac_reward_zero_std"]
        assert run.steps[1]["frac_truncated"] == logged[1]["completions/clipped_ratio"]
        assert "reward/correctness_reward" in run.steps[0]
    d = diagnose(tmp_path / "trl")
    assert "accuracy" not in d.run.steps[0] and {"reward_bug", "extraction_mismatch"} <= {s.check for s in d.skipped}
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        return
    assert {c["step"] for c in d.run.completions} == {1, 2} and "correctness_reward" in d.run.completions[0]["rewards"]


def test_a_run_that_died_sampling_from_non_finite_weights(tmp_path, monkeypatch):
    """A float16 policy's weights go non-finite and the next step dies inside generate, before it has a row: the
    trainer keeps the error in crash.json, the doctor names non_finite from it, and a new attempt removes it."""
    trainer = _train(tmp_path / "run", steps=2)
    real = trainer.grpo_step.sample

    def dies(*args, **kwargs):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")

    monkeypatch.setattr(trainer.grpo_step, "sample", dies)
    with pytest.raises(RuntimeError, match="probability tensor"):
        trainer.train(make_arithmetic_dataset(32, seed=2, digits=1), 4, resume=True, progress=False)
    crash = json.loads((tmp_path / "run" / "crash.json").read_text())
    assert crash == {"step": 3, "error": "RuntimeError",
                     "message": "probability tensor contains either `inf`, `nan` or element < 0"}
    found = diagnose(tmp_path / "run")
    assert (found.primary.name, found.primary.severity) == ("non_finite", "fault")
    assert "died at step 3" in found.primary.summary
    assert primary_of(read_run(tmp_path / "run").steps) != ("non_finite", "fault")  # the history alone cannot tell
    monkeypatch.setattr(trainer.grpo_step, "sample", real)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(make_arithmetic_dataset(32, seed=2, digits=1), 3, resume=True, progress=False)
    assert not (tmp_path / "run" / "crash.json").exists()
    assert "non_finite" not in diagnose(tmp_path / "run").names()

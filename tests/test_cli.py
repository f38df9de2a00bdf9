"""The command line (python -m grpo_tutorial) and the training-curve plot."""

import argparse
import json
import os
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from grpo_tutorial.__main__ import main, parse_rewards
from grpo_tutorial.plotting import moving_average, plot_history
from grpo_tutorial.rewards import correctness_reward, format_reward


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], "{train,evaluate,plot}"),
        (["train"], "--group-size"),
        (["evaluate"], "--checkpoint"),
        (["plot"], "--smooth"),
    ],
)
def test_help_for_every_subcommand(argv, expected, capsys):
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    assert expected in capsys.readouterr().out


def test_module_entry_point_runs():
    done = subprocess.run(
        [sys.executable, "-m", "grpo_tutorial", "train", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "--resume" in done.stdout and "--checkpoint-every" in done.stdout


def test_parse_rewards():
    assert parse_rewards(["correctness", "format:0.2"]) == ([correctness_reward, format_reward], [1.0, 0.2])
    with pytest.raises(ValueError, match="unknown reward 'speed'"):
        parse_rewards(["speed"])
    with pytest.raises(ValueError, match="weight 'x' is not a number"):
        parse_rewards(["format:x"])


def test_missing_required_flags_exit_with_usage(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--model", "tiny"])
    assert info.value.code == 2
    assert "required" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--group-size", "1"], "GRPOConfig.group_size must be an int >= 2, got 1"),
        (["--minibatch-size", "5"], "minibatch_size must be a divisor"),
        (["--lr", "0"], "learning_rate must be a positive number"),
        (["--steps", "0"], "--steps must be a positive int, got 0"),
        (["--reward", "speed"], "unknown reward 'speed'"),
    ],
)
def test_bad_train_flags_give_one_line_errors(tmp_path, capsys, flags, message):
    argv = ["train", "--model", "tiny", "--task", "addition", "--out", str(tmp_path / "r"), "--no-progress"]
    if "--steps" not in flags:
        argv += ["--steps", "2"]
    assert main(argv + flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_tiny_model_refuses_word_tasks(tmp_path, capsys):
    code = main(["train", "--model", "tiny", "--task", "countdown", "--steps", "1", "--out", str(tmp_path)])
    assert code == 2
    assert "character vocabulary" in capsys.readouterr().err


def test_gsm8k_offline_fails_fast_with_the_loader_message(tmp_path, capsys):
    code = main(["train", "--model", "smollm2-135m-instruct", "--task", "gsm8k", "--steps", "1", "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: load_gsm8k needs the Hugging Face hub") and "HF_HUB_OFFLINE" in err
    assert "make_arithmetic_dataset" in err


def test_train_evaluate_plot_smoke(tmp_path, capsys):
    out = tmp_path / "run"
    code = main([
        "train", "--model", "tiny", "--task", "addition", "--digits", "1", "--steps", "2", "--out", str(out),
        "--prompts-per-step", "4", "--group-size", "4", "--n-train", "50", "--n-eval", "8",
        "--checkpoint-every", "1", "--eval-after", "--no-progress", "--reward", "partial_credit",
    ])
    assert code == 0
    printed = capsys.readouterr().out
    assert "after GRPO: accuracy" in printed
    rows = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert "reward/partial_credit_reward" in rows[0]
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["group_size"] == 4 and run["config"]["num_iterations"] == 2  # tiny preset
    evals = json.loads((out / "eval.json").read_text())
    assert evals["after"]["n"] == 8

    # evaluate picks up model, task, digits and seed from run.json
    assert main(["evaluate", "--checkpoint", str(out), "--out", str(tmp_path / "e.json")]) == 0
    again = json.loads((tmp_path / "e.json").read_text())
    assert again["n"] == 8 and again["accuracy"] == evals["after"]["accuracy"]
    assert again["samples"] == evals["after"]["samples"]

    assert main(["plot", str(out), "--out", str(tmp_path / "curves.png"), "--smooth", "2"]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 1000


def test_evaluate_without_a_checkpoint_needs_model_and_task(capsys):
    assert main(["evaluate", "--n", "4"]) == 2
    assert "evaluate needs --model and --task" in capsys.readouterr().err
    assert main(["evaluate", "--checkpoint", "/nonexistent/dir"]) == 2
    assert capsys.readouterr().err == "error: --checkpoint '/nonexistent/dir' does not exist\n"


def test_evaluate_checkpoint_folder_without_a_checkpoint(tmp_path, capsys):
    assert main(["evaluate", "--checkpoint", str(tmp_path)]) == 2
    assert "holds no checkpoint (expected checkpoint/state.pt)" in capsys.readouterr().err


def _subcommand_parsers():
    from grpo_tutorial.__main__ import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


@pytest.mark.parametrize("command", ["train", "evaluate", "plot"])
def test_help_states_each_default_once(command, capsys):
    sub = _subcommand_parsers()[command]
    formatter = sub._get_formatter()
    for action in sub._actions:
        if not action.help:
            continue
        text = formatter._expand_help(action)
        assert "(default: None)" not in text and "(default: False)" not in text, (action.dest, text)
        assert text.lower().count("default") <= 1, (action.dest, text)
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in out
    if command == "train":  # the defaults argparse knows still show, once
        assert "(default: 0)" in out and "(default: 5000)" in out
        assert out.count("(default: cuda if available)") == 1


# ---------------------------------------------------------------------------
# Path errors: one line on stderr, exit code 2, nothing written, no model loaded
# ---------------------------------------------------------------------------


def _paths(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--model", "tiny", "--task", "addition", "--steps", "1", "--out", "{t}/afile/run"],
         "--out '{t}/afile/run' cannot be created: '{t}/afile' is a file, not a directory"),
        (["train", "--model", "tiny", "--task", "addition", "--steps", "1", "--out", "{t}/afile/a/b"],
         "--out '{t}/afile/a/b' cannot be created: '{t}/afile' is a file, not a directory"),
        (["train", "--model", "tiny", "--task", "addition", "--steps", "1", "--out", "{t}/afile", "--resume"],
         "--out '{t}/afile' is a file; it must be a directory (or not exist yet)"),
        (["evaluate", "--model", "tiny", "--task", "addition", "--n", "2", "--out", "{t}/afile/e.json"],
         "--out '{t}/afile/e.json' cannot be created: '{t}/afile' is a file, not a directory"),
        (["evaluate", "--model", "tiny", "--task", "addition", "--n", "2", "--out", "{t}/adir"],
         "--out '{t}/adir' is a directory; it must be a file name"),
        (["evaluate", "--model", "{t}/adir", "--task", "addition", "--n", "2"],
         "model folder '{t}/adir' is empty"),
        (["evaluate", "--model", "{t}/afile", "--task", "addition", "--n", "2"],
         "model path '{t}/afile' is a file, not a folder"),
        (["train", "--model", "{t}/adir", "--task", "addition", "--steps", "1", "--out", "{t}/run"],
         "model folder '{t}/adir' is empty"),
        (["plot", "{t}/nothing", "--out", "{t}/c.png"],
         "'{t}/nothing' does not exist; pass a train --out directory or its history.jsonl"),
        (["plot", "{t}/adir", "--out", "{t}/afile/c.png"],
         "--out '{t}/afile/c.png' cannot be created: '{t}/afile' is a file, not a directory"),
        (["plot", "{t}/adir", "--out", "{t}/adir"], "--out '{t}/adir' is a directory; it must be a file name"),
    ],
)
def test_path_errors_are_one_line(tmp_path, capsys, argv, message):
    t = str(_paths(tmp_path))
    assert main([a.format(t=t) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {message.format(t=t)}\n" or (err.startswith(f"error: {message.format(t=t)}") and err.count("\n") == 1), err
    assert not (tmp_path / "run").exists()


def test_out_under_a_file_prints_one_line_from_the_shell(tmp_path):
    (tmp_path / "afile").write_text("x")
    done = subprocess.run(
        [sys.executable, "-m", "grpo_tutorial", "train", "--model", "tiny", "--task", "addition", "--steps", "1",
         "--out", str(tmp_path / "afile" / "run")],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "is a file, not a directory" in done.stderr


def test_evaluate_out_creates_missing_parent_folders(tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "e.json"
    assert main(["evaluate", "--model", "tiny", "--task", "addition", "--n", "2", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["n"] == 2


# ---------------------------------------------------------------------------
# plot_history
# ---------------------------------------------------------------------------


def _history(n=6, kl=True):
    rows = []
    for step in range(1, n + 1):
        row = {
            "step": step,
            "reward_mean": step / 10,
            "reward_std": 0.1,
            "accuracy": step / 20,
            "clip_frac": 0.01,
            "completion_len_mean": 3.0,
            "completion_len_max": 4.0,
            "frac_zero_std": 0.3,
            "kl": step / 1000 if kl else float("nan"),
        }
        rows.append(row)
    return rows


def test_plot_history_from_a_path(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _history()))
    fig = plot_history(path)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert titles == [
        "reward (mean)", "accuracy (sampled)", "KL to reference",
        "clip fraction", "completion length", "groups with zero reward std",
    ]
    line = fig.axes[0].get_lines()[0]
    assert list(line.get_xdata()) == [1, 2, 3, 4, 5, 6]
    assert list(line.get_ydata()) == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    assert plot_history(tmp_path) is not None  # a run directory works too


def test_plot_history_skips_missing_keys_and_smooths():
    fig = plot_history(_history(kl=False), smooth=2)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert "KL to reference" not in titles and len(titles) == 5
    # smoothed curve is the second line (the first is the faint raw one)
    smoothed = fig.axes[0].get_lines()[1].get_ydata()
    assert list(smoothed) == pytest.approx([0.1, 0.15, 0.25, 0.35, 0.45, 0.55])
    import matplotlib.pyplot as plt

    _, ax = plt.subplots()
    fig2 = plot_history(_history(), keys=["accuracy", "kl"], ax=ax)
    assert fig2 is ax.figure and len(ax.get_lines()) == 2


def test_plot_history_bad_input():
    with pytest.raises(ValueError, match="history is empty"):
        plot_history([])
    with pytest.raises(ValueError, match="none of the keys"):
        plot_history(_history(), keys=["nope"])
    with pytest.raises(ValueError, match="smooth must be an int >= 1, got 0; it is a window in steps"):
        plot_history(_history(), smooth=0)
    with pytest.raises(TypeError, match="history row 0 must be a dict"):
        plot_history([1, 2])
    assert moving_average([1.0, float("nan"), 3.0], 2).tolist() == [1.0, 1.0, 3.0]


def test_read_only_parent_of_out_is_one_line(tmp_path, capsys, monkeypatch):
    """Root writes everywhere, so os.access is made to answer 'no' for the parent folder."""
    import grpo_tutorial.__main__ as cli

    real_access = os.access
    monkeypatch.setattr(cli.os, "access", lambda path, mode: False if str(path) == str(tmp_path) else real_access(path, mode))
    code = main(["train", "--model", "tiny", "--task", "addition", "--steps", "1", "--out", str(tmp_path / "run")])
    assert code == 2
    assert capsys.readouterr().err == (
        f"error: --out '{tmp_path / 'run'}' cannot be created: '{tmp_path}' is not writable by this user\n"
    )
    assert not (tmp_path / "run").exists()

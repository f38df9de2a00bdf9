"""The command line (python -m grpo_tutorial) and the training-curve plot."""

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import pytest

from grpo_tutorial.__main__ import (
    FIELD_CHOICES,
    RUN_DEFAULTS,
    RUN_FIELDS,
    build_parser,
    config_from_args,
    main,
    make_task_data,
    parse_rewards,
    resolve_run_defaults,
)
from grpo_tutorial.config import GRPOConfig, field_docs
from grpo_tutorial.objectives import LOSS_TYPES
from grpo_tutorial.plotting import moving_average, plot_history
from grpo_tutorial.presets import PRESETS, get_preset
from grpo_tutorial.rewards import correctness_reward, format_reward


pytestmark = pytest.mark.usefixtures("hub_offline")


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], "{train,evaluate,plot,export,doctor}"),
        (["train"], "--group-size"),
        (["evaluate"], "--checkpoint"),
        (["plot"], "--smooth"),
        (["export"], "merge_and_unload"),
        (["doctor"], "--json"),
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


def test_train_evaluate_plot_smoke(tmp_path, run_dir, capsys):
    out = run_dir
    code = main([
        "train", "--model", "tiny", "--task", "addition", "--digits", "1", "--steps", "2", "--out", str(out),
        "--prompts-per-step", "4", "--group-size", "4", "--minibatch-size", "none", "--n-train", "50",
        "--n-eval", "8", "--sft-steps", "0", "--no-eval-before",
        "--checkpoint-every", "1", "--eval-after", "--no-progress", "--reward", "partial_credit",
    ])
    assert code == 0
    printed = capsys.readouterr().out
    assert "after GRPO: accuracy" in printed and "before GRPO" not in printed and "warm start" not in printed
    rows = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert "reward/partial_credit_reward" in rows[0]
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["group_size"] == 4 and run["config"]["minibatch_size"] is None  # the flags
    tiny_cpu = get_preset("tiny-cpu")
    assert (run["config"]["num_iterations"], run["config"]["eval_batch_size"]) == (
        tiny_cpu.num_iterations, tiny_cpu.eval_batch_size)  # the rest: the tiny-cpu preset
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
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    for action in sub._actions:
        if not action.help:
            continue
        text = formatter._expand_help(action)
        assert "(default: None)" not in text and "(default: False)" not in text, (action.dest, text)
        if command == "train" and action.dest in fields:
            # a field's doc may speak of defaults (TRL's, the package's); the preset gives the value,
            # so the formatter appends nothing to it
            assert "(default:" not in text.replace(action.help % {}, ""), (action.dest, text)
            continue
        assert text.lower().count("default") <= 1, (action.dest, text)
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in out
    if command == "train":  # the defaults argparse knows still show, once
        assert "(default: True)" in out and "(default: 200)" in out
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


# ---------------------------------------------------------------------------
# Every GRPOConfig field is a flag; the no-flag run is chapter 8's recipe
# ---------------------------------------------------------------------------


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def test_train_help_lists_every_config_field_with_its_doc(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    docs = field_docs()
    for f in dataclasses.fields(GRPOConfig):
        assert _flag(f.name) in out, f.name
        first_words = " ".join(docs[f.name].replace("``", "").split()[:3])
        assert first_words in flat, (f.name, first_words)
    assert "{" + ",".join(LOSS_TYPES) + "}" in flat  # choices from the package's constants
    # every field that takes one of a few names has its choices (a new one must be added to FIELD_CHOICES)
    assert {f.name for f in dataclasses.fields(GRPOConfig) if f.type == "str"} == set(FIELD_CHOICES)
    assert "--no-mask-truncated-completions" in out and "--lr" in out and "--out" in out
    assert "{" + ",".join(sorted(PRESETS)) + "}" in flat


def _parse(*flags: str) -> GRPOConfig:
    args = build_parser().parse_args(["train", "--out", "somewhere", *flags])
    return config_from_args(resolve_run_defaults(args))


def _other_value(name: str, value, hint: str):
    """A command-line spelling of a valid value other than ``value``, and the value it means."""
    special = {
        "top_p": None,  # only 1.0 trains; checked on its own below
        "group_size": ("4", 4), "prompts_per_step": ("16", 16), "minibatch_size": ("64", 64),
        "micro_batch_size": ("32", 32), "clip_eps_high": ("0.28", 0.28), "delta": ("2.0", 2.0),
        "reward_weights": (["1", "0.5"], [1.0, 0.5]), "entropy_coef": ("0.01", 0.01),
        "entropy_coef_min": ("0.001", 0.001), "use_adaptive_entropy": None, "output_dir": None,
        "system_prompt": ("Be brief.", "Be brief."), "log_completions": ("--no-log-completions", False),
        "lora_target_modules": (["q_proj", "v_proj"], ["q_proj", "v_proj"]),
    }
    if name in special:
        return special[name]
    if name in FIELD_CHOICES:
        other = next(c for c in FIELD_CHOICES[name] if c != value)
        return other, other
    if isinstance(value, bool):
        return ("--no-" if value else "--") + name.replace("_", "-"), not value
    if value is None and "bool" in hint:
        return "false", False
    if value is None:
        return ("3", 3) if "int" in hint else ("0.5", 0.5)
    if isinstance(value, int):
        return str(value + 1), value + 1
    return (str(value / 2), value / 2) if value else ("0.5", 0.5)


def test_every_config_field_can_be_set_from_the_command_line():
    preset = _parse()
    hints = {f.name: str(f.type) for f in dataclasses.fields(GRPOConfig)}
    set_once = []
    for f in dataclasses.fields(GRPOConfig):
        other = _other_value(f.name, getattr(preset, f.name), hints[f.name])
        if other is None:
            continue
        text, expected = other
        if isinstance(text, list):
            flags = [_flag(f.name), *text]
        elif text.startswith("--"):
            flags = [text]
        else:
            flags = [_flag(f.name), text]
        config = _parse(*flags)
        assert getattr(config, f.name) == expected != getattr(preset, f.name), (f.name, flags)
        set_once.append(f.name)
    assert _parse("--use-adaptive-entropy").use_adaptive_entropy is True
    assert _parse("--out", "elsewhere").output_dir == "elsewhere"
    with pytest.raises(ValueError, match="top_p must be 1.0"):
        _parse("--top-p", "0.9")
    assert set(set_once) | {"top_p", "use_adaptive_entropy", "output_dir"} == {f.name for f in dataclasses.fields(GRPOConfig)}


def test_optional_fields_take_none_and_bools_turn_off():
    assert _parse("--max-grad-norm", "none").max_grad_norm is None
    assert _parse("--minibatch-size", "None").minibatch_size is None
    assert _parse("--reward-weights", "none").reward_weights is None
    assert _parse("--onednn-generation", "false").onednn_generation is False
    assert _parse("--onednn-generation", "none").onednn_generation is None
    assert _parse("--scale-rewards", "none").scale_rewards == "none"  # a choice named 'none' stays a name
    assert _parse("--no-share-prompt-cache").share_prompt_cache is False
    assert _parse("--lr", "3e-4").learning_rate == 3e-4


def test_lora_flags_reach_the_config():
    """use_peft and the lora_* fields, TRL's names, are flags like every other field (LoRA: tests/test_lora.py)."""
    config = _parse("--use-peft", "--lora-r", "4", "--lora-alpha", "8", "--lora-dropout", "0",
                    "--lora-target-modules", "q_proj", "k_proj", "v_proj", "o_proj")
    assert (config.use_peft, config.lora_r, config.lora_alpha, config.lora_dropout) == (True, 4, 8.0, 0.0)
    assert config.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert _parse().use_peft is False and _parse().lora_target_modules == "all-linear"  # every linear layer
    assert _parse("--lora-target-modules", "all-linear").lora_target_modules == "all-linear"  # one name, not a list
    assert _parse("--lora-target-modules", "none").lora_target_modules is None  # PEFT's per-model default
    assert "--lora-target-modules NAME [NAME ...]" in " ".join(
        _subcommand_parsers()["train"].format_help().split())


@pytest.mark.parametrize("flags", [["--group-size", "x"], ["--max-grad-norm", "big"], ["--loss-type", "ppo"],
                                   ["--onednn-generation", "maybe"]])
def test_bad_field_values_are_argparse_errors(flags, capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--out", "x", *flags])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and flags[0] in err  # the short usage line and the error, nothing more


def test_the_no_flag_run_is_chapter_8s_recipe():
    """``train --out DIR`` runs TinyAdditionRecipe's settings: preset, data split, warm start, model, threads."""
    import inspect

    from grpo_tutorial.chapters.recipes import TinyAdditionRecipe, make_recipe_data
    from grpo_tutorial.models import build_tiny_policy
    from grpo_tutorial.sft import SFTConfig

    recipe = TinyAdditionRecipe()
    args = resolve_run_defaults(build_parser().parse_args(["train", "--out", "somewhere"]))
    config = config_from_args(args)
    assert dataclasses.replace(config, output_dir=None, **{k: getattr(recipe.grpo, k) for k in RUN_FIELDS}) == recipe.grpo
    assert config.output_dir == "somewhere" and {k: getattr(config, k) for k in RUN_FIELDS} == RUN_FIELDS
    assert (args.model, args.task, args.preset, args.digits) == ("tiny", "addition", "tiny-cpu", None)
    assert SFTConfig(steps=args.sft_steps, seed=0) == recipe.sft_config(0)
    assert (args.sft_target_accuracy, args.sft_check_every) == (recipe.sft_target_accuracy, recipe.sft_check_every)
    assert (args.n_train, args.n_eval, args.n_probe) == (recipe.n_train, recipe.n_test, recipe.n_probe)
    assert args.threads == recipe.num_threads and args.eval_before and args.eval_after
    assert 0 < args.steps <= recipe.grpo_steps
    defaults = {k: p.default for k, p in inspect.signature(build_tiny_policy).parameters.items()}
    assert [defaults[k] for k in ("hidden_size", "num_layers", "num_heads", "intermediate_size")] == [
        recipe.hidden_size, recipe.num_layers, recipe.num_heads, recipe.intermediate_size]
    data = make_task_data("addition", tiny=True, n_train=args.n_train, n_eval=args.n_eval, n_probe=args.n_probe,
                          seed=0, digits=args.digits)
    assert recipe.data_seed == 0 and recipe.digits == 2
    split = make_recipe_data(recipe)
    assert (data.train, data.test, data.probe) == (split["train"], split["test"], split["probe"])


def test_chat_models_get_the_smollm2_preset_and_no_warm_start():
    args = resolve_run_defaults(build_parser().parse_args(["train", "--out", "x", "--model", "smollm2-135m-instruct"]))
    assert (args.preset, args.sft_steps, args.sft_target_accuracy, args.threads) == ("smollm2-cpu", 0, None, None)
    config = config_from_args(args)
    assert config.system_prompt == get_preset("smollm2-cpu").system_prompt and config.log_completions
    assert RUN_DEFAULTS.keys() == {"tiny", "chat"}


def test_a_preset_that_logs_and_checkpoints_keeps_its_own_settings():
    t4 = get_preset("qwen2.5-0.5b-colab-t4")
    config = _parse("--preset", "qwen2.5-0.5b-colab-t4")
    assert dataclasses.replace(config, output_dir=None) == t4  # its log_every=10, checkpoint_every=25 stay
    assert _parse("--log-every", "7").log_every == 7 and _parse("--no-log-completions").log_completions is False


def test_reward_weights_must_match_the_reward_functions(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "r"), "--preset", "qwen2.5-0.5b-colab-t4", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: reward_weights [1.0, 0.1] (preset qwen2.5-0.5b-colab-t4) weigh 2 reward functions")
    assert "--reward correctness --reward format:0.1" in err
    assert main(["train", "--out", str(tmp_path / "r"), "--reward", "correctness", "--reward-weights", "1"]) == 2
    assert "either with --reward NAME:WEIGHT or with --reward-weights" in capsys.readouterr().err
    assert _parse("--reward", "correctness", "--reward", "format:0.2").reward_weights == [1.0, 0.2]


QUICK = ["--digits", "1", "--n-train", "50", "--n-eval", "4", "--prompts-per-step", "2", "--group-size", "4",
         "--minibatch-size", "none", "--sft-steps", "0", "--no-eval-before", "--no-eval-after", "--no-progress"]


@pytest.mark.parametrize("flags", [
    ["--loss-type", "cispo", "--importance-sampling-level", "sequence", "--clip-eps-high", "4.0"],
    ["--loss-type", "luspo", "--importance-sampling-level", "sequence"],
    ["--loss-type", "vespo", "--vespo-k-pos", "1.5", "--use-bias-correction-kl", "--beta", "0.04"],
    ["--advantage-baseline", "rloo", "--dynamic-sampling", "--max-sampling-rounds", "2", "--entropy-coef", "0.01"],
    ["--sampler", "stale", "--sampler-staleness", "2", "--vllm-importance-sampling-correction",
     "--vllm-importance-sampling-mode", "token_truncate", "--vllm-importance-sampling-clip-min", "0.5"],  # issue 35
])
def test_a_variant_trains_from_the_command_line(run_dir, capsys, flags):
    out = run_dir
    assert main(["train", "--out", str(out), "--steps", "2", "--log-every", "1", *QUICK, *flags]) == 0
    rows = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)
    if "--sampler" in flags:  # a sampler that is not the learner: the history says how far apart they are
        assert all(math.isfinite(r["mismatch/kl"]) and math.isfinite(r["mismatch/weight_mean"]) for r in rows)
    config = json.loads((out / "run.json").read_text())["config"]
    for i, name in enumerate(flags):
        field = name[2:].replace("-", "_")
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            value = flags[i + 1]
            assert str(config[field]) == value or config[field] == float(value), (field, config[field])
        elif name.startswith("--"):
            assert config[field] is True, field
    completions = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    # completions_to_keep (8) keeps all 8 of each step's completions; the 4 printed (RUN_FIELDS) are among them
    assert [c["step"] for c in completions] == [1] * 8 + [2] * 8
    assert all(c["index"] == i % 8 for i, c in enumerate(completions))
    printed = capsys.readouterr().out
    assert "step 2: 4 of 8 completions" in printed and f"and {out / 'completions.jsonl'}" in printed


def test_sft_target_accuracy_none_is_kept_not_replaced_by_the_default():
    """'--sft-target-accuracy none' is a value: a warm start of a fixed length, no probe drawn."""
    args = resolve_run_defaults(build_parser().parse_args(
        ["train", "--out", "x", "--sft-steps", "3", "--sft-target-accuracy", "none"]))
    assert args.sft_target_accuracy is None and args.sft_steps == 3
    left_out = resolve_run_defaults(build_parser().parse_args(["train", "--out", "x"]))
    assert left_out.sft_target_accuracy == RUN_DEFAULTS["tiny"]["sft_target_accuracy"]


def test_a_smaller_batch_keeps_the_presets_updates_per_pass(capsys):
    """tiny-cpu makes two updates per step (minibatches of 128 of 256 completions); a batch
    changed on the command line keeps two where it divides, else one, said on stderr."""
    preset = get_preset("tiny-cpu")
    assert preset.prompts_per_step * preset.group_size // preset.minibatch_size == 2
    assert _parse("--prompts-per-step", "4", "--group-size", "4").minibatch_size == 8
    assert _parse("--prompts-per-step", "3", "--group-size", "3").minibatch_size is None
    assert "do not divide a batch of 9" in capsys.readouterr().err
    assert _parse("--prompts-per-step", "4", "--minibatch-size", "16").minibatch_size == 16  # given: kept
    assert _parse("--prompts-per-step", "4", "--minibatch-size", "none").minibatch_size is None
    assert _parse().minibatch_size == preset.minibatch_size


def test_the_flags_live_in_cli_and_each_subcommand_runs_its_command():
    """grpo_tutorial.cli holds the flags (each subcommand's in its own function) and what they make; __main__ holds
    the commands, builds the parser with them, and still exports the names outside code imports from it."""
    import grpo_tutorial.__main__ as entry
    from grpo_tutorial import cli

    for name in ("FIELD_ALIASES", "FIELD_CHOICES", "RUN_DEFAULTS", "RUN_FIELDS", "TASKS", "config_from_args",
                 "parse_rewards", "resolve_run_defaults"):
        assert getattr(entry, name) is getattr(cli, name), name
    argv = {"train": ["train", "--out", "o"], "evaluate": ["evaluate"], "plot": ["plot", "h", "--out", "p.png"],
            "export": ["export", "--checkpoint", "c", "--out", "o"], "doctor": ["doctor", "run", "--json"]}
    commands = {name: (lambda args, name=name: name) for name in argv}
    for name, args in argv.items():
        assert build_parser().parse_args(args).func is getattr(entry, f"_cmd_{name}")
        parsed = cli.build_parser(commands).parse_args(args)
        assert parsed.command == name and parsed.func(parsed) == name
    assert cli.model_kind(None) == cli.model_kind(" Tiny ") == "tiny" and cli.model_kind("smollm2-135m-instruct") == "chat"

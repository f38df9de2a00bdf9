"""Command line: ``python -m grpo_tutorial {train,evaluate,plot,export,doctor} ...``.

Examples::

    # the tiny model learns 2-digit addition in a few minutes on a CPU: a supervised
    # warm start, held-out accuracy, 200 GRPO steps, held-out accuracy again
    python -m grpo_tutorial train --out runs/tiny

    # continue a run that was interrupted (Ctrl-C, a kill, a lost Colab session)
    python -m grpo_tutorial train --out runs/tiny --resume

    # every GRPOConfig field is a flag: chapter 10's variants, for example
    python -m grpo_tutorial train --out runs/cispo --loss-type cispo --importance-sampling-level sequence

    python -m grpo_tutorial evaluate --checkpoint runs/tiny
    python -m grpo_tutorial plot runs/tiny --out runs/tiny/curves.png

    # a run that does not learn: what the doctor reads in its curves and completions (chapter 18)
    python -m grpo_tutorial doctor runs/tiny

    # LoRA adapters on every linear layer instead of every weight (pip install peft); the
    # checkpoint holds the adapters; export merges them into the base as one plain model
    python -m grpo_tutorial train --out runs/lora --use-peft --lora-r 4 --lr 1e-3
    python -m grpo_tutorial export --checkpoint runs/lora --out runs/lora/merged

A run's settings are a named preset (``--preset``; :mod:`grpo_tutorial.presets`)
with any :class:`~grpo_tutorial.config.GRPOConfig` field changed by a flag of the
same name (``--loss-type``, ``--group-size``; ``--lr`` and ``--out`` are short
for ``--learning-rate`` and ``--output-dir``). The flags are made from the
dataclass's fields, with the field docs as their help, so a new field is a new
flag. A LoRA run (``--use-peft``) that had a warm start keeps the warm-started
base once, in ``OUT/base.safetensors``: its checkpoints hold only the adapters,
and ``--resume``, ``evaluate --checkpoint`` and ``export`` put them back on that
base. What is not a config field (model, task, steps, warm start, evaluation)
defaults by kind of model (:data:`RUN_DEFAULTS`): the tiny model's defaults are
chapter 8's recipe.

Errors in flags and paths print one line, ``error: ...``, and exit with code 2
(``--traceback`` shows the full traceback); Ctrl-C during training exits with 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import typing
from pathlib import Path
from typing import Any, Sequence

from . import cli
from .cli import (
    FIELD_ALIASES, FIELD_CHOICES, RUN_DEFAULTS, RUN_FIELDS, TASKS, config_from_args, is_tiny, model_kind, parse_rewards,
    resolve_run_defaults,
)
from .config import GRPOConfig
from .presets import get_preset
from .stats import paired_gain

__all__ = [
    "BASE_FILE", "FIELD_ALIASES", "FIELD_CHOICES", "RUN_DEFAULTS", "RUN_FIELDS", "TASKS", "TaskData", "build_parser",
    "config_from_args", "main", "make_task_data", "parse_rewards", "resolve_run_defaults",
]

#: A LoRA run's warm-started base, in its output directory (written once, before GRPO starts).
BASE_FILE = "base.safetensors"

# ---------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (:func:`grpo_tutorial.cli.build_parser`), each subcommand running its command here."""
    return cli.build_parser({"train": _cmd_train, "evaluate": _cmd_evaluate, "plot": _cmd_plot, "export": _cmd_export,
                             "doctor": _cmd_doctor})


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _load_model(args: argparse.Namespace, seed: int) -> tuple[Any, Any]:
    """The policy and tokenizer; the tiny model's initial weights follow ``seed``."""
    import torch

    from .models import build_tiny_policy, pick_device_and_dtype
    from .pretrained import load_policy

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if is_tiny(args.model):
        device, dtype = pick_device_and_dtype(args.device, args.dtype)
        model, tokenizer = build_tiny_policy(seed=seed)
        return model.to(device=device, dtype=dtype), tokenizer
    return load_policy(args.model, device=args.device, dtype=args.dtype)


class TaskData(typing.NamedTuple):
    """A task's rows: ``train``, the held-out ``test`` rows, the ``probe`` rows that decide when a
    warm start stops (held out too, apart from ``test``), and the task's ``reward_fns``."""

    train: list[dict]
    test: list[dict]
    probe: list[dict]
    reward_fns: list


def make_task_data(
    task: str, *, tiny: bool, n_train: int, n_eval: int, seed: int, digits: int | None, n_probe: int = 0
) -> TaskData:
    """Training rows, ``n_eval`` held-out rows, ``n_probe`` more held-out rows and the reward functions.

    For arithmetic the held-out rows are one draw of ``n_eval + n_probe`` distinct
    problems, the first ``n_eval`` for evaluation and the rest for the probe, as
    chapter 8's recipe splits them (``chapters.recipes.make_recipe_data``).
    """
    from .rewards import correctness_reward
    from .tasks import countdown_reward, load_gsm8k, make_countdown_dataset, train_test_split_arithmetic

    n_held = n_eval + n_probe
    if task in ("addition", "multiplication"):
        op = "+" if task == "addition" else "*"
        if digits is None:
            digits = 1 if (task == "multiplication" and not tiny) else 2
        if n_held > 10 ** (2 * digits):
            raise ValueError(
                f"--n-eval {n_eval} + --n-probe {n_probe} = {n_held} distinct held-out problems requested, but "
                f"only {10 ** (2 * digits)} exist with --digits {digits}; lower them (--n-probe 0 if the warm "
                "start has no target)"
            )
        train, held = train_test_split_arithmetic(
            n_train, n_held, seed, op=op, digits=digits, style="plain" if tiny else "question"
        )
        return TaskData(train, held[:n_eval], held[n_eval:], [correctness_reward])
    if tiny:
        raise ValueError(
            f"--task {task} has word prompts, which the tiny model's character vocabulary cannot "
            "spell; use --task addition or multiplication with --model tiny"
        )
    if task == "countdown":
        train = make_countdown_dataset(n_train, seed)
        seen = {row["prompt"] for row in train}
        held = [row for row in make_countdown_dataset(n_held * 3, seed + 1) if row["prompt"] not in seen][:n_held]
        return TaskData(train, held[:n_eval], held[n_eval:], [countdown_reward])
    if task == "gsm8k":
        train = load_gsm8k("train")[:n_train]
        held = load_gsm8k("test")[:n_held]
        return TaskData(train, held[:n_eval], held[n_eval:], [correctness_reward])
    raise ValueError(f"--task must be one of {list(TASKS)}, got {task!r}")


def accuracy_fn_for(task: str) -> Any:
    """What counts as a correct completion: the countdown checker, else the default (answer matches)."""
    if task == "countdown":
        from .tasks import countdown_reward

        return countdown_reward
    return None


def _paired_change(before: dict, after: dict) -> tuple[float, float]:
    """After minus before on the same problems, and the standard error of the per-problem differences.

    :func:`grpo_tutorial.stats.paired_gain` of the two evaluations' outcomes (an unjudged problem counts as wrong).
    """
    return paired_gain([float(bool(c)) for c in before["correct"]], [float(bool(c)) for c in after["correct"]])


def _print_eval(label: str, result: dict) -> None:
    print(
        f"{label}: accuracy {result['accuracy']:.3f} on n={result['n']}, "
        f"reward {result['reward_mean']:.3f}, length {result['completion_len_mean']:.2f}",
        flush=True,
    )
    for sample in result.get("samples", [])[:3]:
        print(f"    {sample['prompt']!r} -> {sample['completion']!r} (answer {sample['answer']!r})")


def _check_writable(flag: str, path: str, *, is_dir: bool) -> None:
    """Fail before any work when ``path`` cannot be created: it (or a parent) is
    a file where a directory must be, or the nearest existing parent is read-only."""
    target = Path(path).expanduser()
    if target.exists():
        if is_dir and not target.is_dir():
            raise ValueError(f"{flag} {path!r} is a file; it must be a directory (or not exist yet)")
        if not is_dir and target.is_dir():
            raise ValueError(f"{flag} {path!r} is a directory; it must be a file name")
        if not os.access(target, os.W_OK):
            raise ValueError(f"{flag} {path!r} is not writable by this user")
        return
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {path!r} cannot be created: {str(parent)!r} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path!r} cannot be created: {str(parent)!r} is not writable by this user")


def _check_paths(args: argparse.Namespace) -> None:
    """Path errors of every subcommand, as one-line errors before a model loads."""
    model = getattr(args, "model", None)
    named = ("tiny", "smollm2-135m-instruct")  # load_policy takes these names before folders
    if model is not None and model.strip().lower() not in named and os.path.exists(os.path.expanduser(model)):
        from .pretrained import check_model_dir

        check_model_dir(model)  # a local --model that is not a saved model fails here, before --out is made
    if args.command == "train":
        _check_writable("--out", args.output_dir, is_dir=True)
    elif args.command == "evaluate":
        if args.checkpoint is not None and not Path(args.checkpoint).expanduser().exists():
            raise ValueError(f"--checkpoint {args.checkpoint!r} does not exist")
        if args.out is not None:
            _check_writable("--out", args.out, is_dir=False)
    elif args.command == "export":
        if not Path(args.checkpoint).expanduser().exists():
            raise ValueError(f"--checkpoint {args.checkpoint!r} does not exist")
        _check_writable("--out", args.out, is_dir=True)
    elif args.command == "plot":
        if not Path(args.history).expanduser().exists():
            raise ValueError(f"{args.history!r} does not exist; pass a train --out directory or its history.jsonl")
        _check_writable("--out", args.out, is_dir=False)


def _write_json(path: Path, data: Any, run_dir: Path | None = None) -> None:
    from .run.disk import write_json

    write_json(path, data, run_dir)


def _claim_out(out: Path) -> Any:
    """Lock ``--out`` for this command (creating it): fails at once, in one line, when it
    cannot be written or another run holds it, before any model is loaded."""
    from .run.lock import run_lock

    return run_lock(out)


# ---------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------


def _evaluate(model: Any, tokenizer: Any, rows: list, reward_fns: Any, config: Any, task: str, **kwargs: Any) -> dict:
    """Greedy held-out evaluation with a run's config (no trainer is built for it)."""
    from .evaluation import evaluate_policy

    return evaluate_policy(model, tokenizer, rows, config, reward_fns=reward_fns, accuracy_fn=accuracy_fn_for(task), **kwargs)


def _cmd_train(args: argparse.Namespace) -> int:
    resolve_run_defaults(args)
    for flag, value, minimum in (
        ("--steps", args.steps, 1), ("--n-train", args.n_train, 1), ("--n-eval", args.n_eval, 1),
        ("--n-probe", args.n_probe, 0), ("--sft-steps", args.sft_steps, 0), ("--sft-check-every", args.sft_check_every, 1),
    ):
        if value < minimum:
            raise ValueError(f"{flag} must be a{' positive' if minimum else 'n'} int{'' if minimum else ' >= 0'}, got {value}")
    if args.sft_steps and args.sft_target_accuracy is not None and args.n_probe < 1:
        raise ValueError("--sft-target-accuracy needs probe problems: give --n-probe > 0, or --sft-target-accuracy none")
    config = config_from_args(args)  # a bad value fails here, before --out is created
    with _claim_out(Path(args.output_dir)):
        return _train(args, config, Path(args.output_dir))


def _print_plan(args: argparse.Namespace, config: GRPOConfig) -> None:
    threads = "torch's choice of threads" if args.threads is None else f"{args.threads} thread{'s' * (args.threads > 1)}"
    print(f"preset {args.preset}: model {args.model}, task {args.task}; {args.steps} GRPO steps of "
          f"{config.prompts_per_step} prompts x {config.group_size} completions; {threads}", flush=True)
    if args.sft_steps:
        until = ("" if args.sft_target_accuracy is None else
                 f", until greedy accuracy on {args.n_probe} held-out probe problems reaches {args.sft_target_accuracy:g}")
        print(f"warm start: up to {args.sft_steps} supervised steps{until}", flush=True)


def _train(args: argparse.Namespace, config: GRPOConfig, out: Path) -> int:
    import torch

    from .trainer import GRPOTrainer

    resuming = _announce_resume(args, out)
    tiny = is_tiny(args.model)
    args.seed = seed = config.seed
    data_seed = seed if args.data_seed is None else args.data_seed
    if not (args.sft_steps and args.sft_target_accuracy is not None):
        args.n_probe = 0  # no probe is drawn, so the held-out rows are the first n_eval of the split

    # data first: bad flags or gsm8k offline fail before a slow model load
    data = make_task_data(
        args.task, tiny=tiny, n_train=args.n_train, n_eval=args.n_eval, seed=data_seed, digits=args.digits,
        n_probe=args.n_probe,
    )
    reward_fns = _reward_functions(args, config, data)
    _print_plan(args, config)
    torch.manual_seed(seed)
    model, tokenizer = _load_model(args, seed)
    if config.use_peft and resuming:
        _load_base(model, out)  # the warm-started base the adapters train on, when the run had a warm start
    _write_json(out / "run.json", run_dir=out, data={"argv": sys.argv[1:], "args": vars(args) | {"func": None}, "config": config.to_dict()})

    evals: dict[str, Any] = {}
    if (out / "eval.json").exists() and resuming:
        evals = json.loads((out / "eval.json").read_text(encoding="utf-8"))

    if args.sft_steps and not resuming:
        _warm_start(args, config, model, tokenizer, data, reward_fns, evals)
        if config.use_peft:  # the checkpoints hold only the adapters: keep the base they sit on, once
            _save_base(model, out)

    trainer = GRPOTrainer(model, tokenizer, reward_fns, config, accuracy_fn=accuracy_fn_for(args.task))
    if args.eval_before and not resuming:
        evals["before"] = trainer.evaluate(data.test)
        _print_eval("before GRPO", evals["before"])
        _write_json(out / "eval.json", evals, out)

    t0 = time.perf_counter()
    try:
        history = trainer.train(data.train, args.steps, resume=args.resume, progress=not args.no_progress)
    except KeyboardInterrupt as err:
        print(f"\n{err or 'interrupted'}; continue with the same command plus --resume", file=sys.stderr)
        return 130
    seconds = time.perf_counter() - t0
    print(f"GRPO: {len(history)} steps, last reward {history[-1]['reward_mean']:.3f} "
          f"({seconds:.1f} s in this process)", flush=True)
    if args.eval_after:
        evals["after"] = trainer.evaluate(data.test)
        _print_eval("after GRPO", evals["after"])
        if "before" in evals:
            change, se = _paired_change(evals["before"], evals["after"])
            print(f"change in held-out greedy accuracy: {change:+.3f} (paired standard error {se:.3f})")
    if evals:
        _write_json(out / "eval.json", evals, out)
    print(f"wrote {out / 'history.jsonl'}" + (f" and {out / 'completions.jsonl'}" if config.log_completions else ""),
          flush=True)
    return 0


def _announce_resume(args: argparse.Namespace, out: Path) -> bool:
    """Whether ``--resume`` finds a checkpoint in ``out``; says which, or that the run starts at step 0."""
    from .run.layout import find_checkpoint, read_meta

    checkpoint = find_checkpoint(out) if args.resume else None
    if checkpoint is not None:
        print(f"resuming from {checkpoint} at step {read_meta(checkpoint)['step']}", flush=True)
    elif args.resume:
        print(f"--resume: no checkpoint in {out} yet, starting from step 0", flush=True)
    return checkpoint is not None


def _save_base(model: Any, out: Path) -> None:
    """A LoRA run's warm-started base, to ``out/base.safetensors`` (through a temporary file, then renamed)."""
    from safetensors.torch import save_model

    from .run.disk import disk_errors, fsync_dir

    tmp = out / f"{BASE_FILE}.tmp"
    with disk_errors(tmp, out):
        save_model(model, str(tmp))
        os.replace(tmp, out / BASE_FILE)
        fsync_dir(out)
    print(f"LoRA: the warm-started base the adapters train on is in {out / BASE_FILE}", flush=True)


def _load_base(model: Any, run_dir: Path) -> None:
    """Put a LoRA run's warm-started base (``run_dir/base.safetensors``) into ``model``; nothing when there is none."""
    from safetensors.torch import load_model

    path = run_dir / BASE_FILE
    if path.exists():
        load_model(model, str(path), device=str(next(model.parameters()).device))


def _reward_functions(args: argparse.Namespace, config: GRPOConfig, data: TaskData) -> list:
    """The run's reward functions (``--reward`` or the task's), one per weight of the config."""
    reward_fns = parse_rewards(args.reward)[0] if args.reward else data.reward_fns
    weights = config.reward_weights
    if weights is not None and len(weights) != len(reward_fns):
        raise ValueError(
            f"reward_weights {weights} (preset {args.preset}) weigh {len(weights)} reward functions but the run has "
            f"{len(reward_fns)}; name them with --reward NAME:WEIGHT (e.g. --reward correctness --reward format:0.1) "
            "or pass --reward-weights none"
        )
    return reward_fns


def _warm_start(args: argparse.Namespace, config: GRPOConfig, model: Any, tokenizer: Any, data: TaskData,
                reward_fns: list, evals: dict) -> None:
    """Supervised steps until greedy accuracy on the probe rows reaches the target, as chapter 8's recipe does."""
    import torch

    from .sft import SFTConfig, warm_start_until

    def probe(m: Any) -> float:  # the probe is evaluated as the GRPO phase will evaluate
        return _evaluate(m, tokenizer, data.probe, reward_fns, config, args.task, num_samples=0)["accuracy"]

    done = warm_start_until(model, tokenizer, data.train, SFTConfig(steps=args.sft_steps, seed=config.seed), probe,
                            args.sft_target_accuracy, check_every=args.sft_check_every,
                            progress=not args.no_progress)
    history, reached = done["history"], done["reached"]
    probe_accuracy = [value for _, value in done["checks"]]
    evals["sft"] = {"steps": done["steps"], "seconds": done["seconds"], "reached_target": reached,
                    "probe_accuracy": probe_accuracy[-1] if probe_accuracy else None}
    note = ""
    if probe_accuracy:
        note = (f", probe accuracy {probe_accuracy[-1]:.3f}"
                f" ({'reached' if reached else 'below'} the target {args.sft_target_accuracy:g})")
    print(f"warm start: {len(history)} supervised steps in {evals['sft']['seconds']:.1f} s{note}", flush=True)
    torch.manual_seed(config.seed)  # GRPO starts from the same RNG state however long the warm start ran


def _run_of(checkpoint: str) -> tuple[Path, dict[str, Any]]:
    """The checkpoint directory a ``--checkpoint`` names, and its run's ``train`` arguments (from run.json; {} if none)."""
    from .run.layout import find_checkpoint

    ckpt = find_checkpoint(checkpoint)
    if ckpt is None:
        raise FileNotFoundError(f"--checkpoint {checkpoint!r} holds no checkpoint (expected checkpoint/state.pt)")
    for candidate in (Path(checkpoint) / "run.json", ckpt.parent / "run.json"):
        if candidate.exists():
            return ckpt, json.loads(candidate.read_text(encoding="utf-8"))["args"]
    return ckpt, {}


def _load_checkpoint(model: Any, ckpt: Path) -> tuple[Any, dict]:
    """The run's policy from its checkpoint: its weights, or (LoRA) its adapters on its base; and the checkpoint's meta."""
    from .run.checkpoint import load_model_state
    from .run.layout import read_meta

    meta = read_meta(ckpt)
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    config = GRPOConfig(**{k: v for k, v in meta["config"].items() if k in fields and k != "output_dir"})
    if not config.use_peft:
        load_model_state(model, ckpt.parent)
        return model, meta
    from .lora import AdapterWeights, check_checkpoint_fits, wrap_with_adapters

    _load_base(model, ckpt.parent)
    model = wrap_with_adapters(model, config)
    check_checkpoint_fits(meta, model)  # another base: refused, in words
    load_model_state(AdapterWeights(model), ckpt.parent)
    return model, meta


def _cmd_evaluate(args: argparse.Namespace) -> int:
    run: dict[str, Any] = {}
    if args.checkpoint is not None:
        ckpt, run = _run_of(args.checkpoint)
    model_name = args.model or run.get("model")
    task = args.task or run.get("task")
    if model_name is None or task is None:
        raise ValueError("evaluate needs --model and --task (or --checkpoint of a train run, which records them)")
    args.model = model_name
    if args.threads is None:
        args.threads = run.get("threads")
    seed = args.seed if args.seed is not None else run.get("seed", 0)
    data_seed = args.data_seed if args.data_seed is not None else run.get("data_seed")
    data_seed = seed if data_seed is None else data_seed
    digits = args.digits if args.digits is not None else run.get("digits")
    n = args.n if args.n is not None else run.get("n_eval", 200)
    tiny = is_tiny(model_name)

    # the run's split: its held-out draw included the warm start's probe rows
    _, eval_rows, _, reward_fns = make_task_data(
        task, tiny=tiny, n_train=1, n_eval=n, seed=data_seed, digits=digits, n_probe=run.get("n_probe", 0)
    )
    model, tokenizer = _load_model(args, seed)
    config_values: dict[str, Any]
    if args.checkpoint is not None:  # evaluate as the run trained: its whole config
        model, meta = _load_checkpoint(model, ckpt)
        fields = {f.name for f in dataclasses.fields(GRPOConfig)}
        config_values = {k: v for k, v in meta["config"].items() if k in fields and k != "output_dir"}
    else:
        preset = args.preset or RUN_DEFAULTS[model_kind(model_name)]["preset"]
        config_values = {k: v for k, v in get_preset(preset).to_dict().items() if k != "output_dir"}
    if args.max_new_tokens is not None:
        config_values["max_new_tokens"] = args.max_new_tokens
    if args.system_prompt is not None:
        config_values["system_prompt"] = args.system_prompt
    result = _evaluate(
        model, tokenizer, eval_rows, reward_fns, GRPOConfig(**config_values), task, batch_size=args.batch_size
    )
    _print_eval(f"{model_name} on {task}" + (f" ({args.checkpoint})" if args.checkpoint else ""), result)
    if args.out:
        _write_json(Path(args.out), result)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    """The run's policy as one plain model folder: a LoRA run's adapters merged into its base."""
    from .lora import export_merged

    ckpt, run = _run_of(args.checkpoint)
    if run.get("model") is None:
        raise ValueError(f"export needs the run's run.json (written by train) beside {str(ckpt)!r}")
    args.model, args.threads = run["model"], run.get("threads")
    model, tokenizer = _load_model(args, run.get("seed", 0))
    model, _ = _load_checkpoint(model, ckpt)
    path = export_merged(model, args.out, tokenizer, copy_first=False)  # the loaded copy is ours to spend
    print(f"wrote {path} (load it with --model {path})")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from .plotting import plot_history
    from .run.disk import disk_errors

    fig = plot_history(args.history, keys=args.keys, smooth=args.smooth)
    out = Path(args.out)
    with disk_errors(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    """The doctor's verdict on a run (chapter 18): 0 no fault, 1 a fault, 2 a run it cannot read."""
    from .doctor import main as doctor_main

    return doctor_main([args.run, *(["--json"] if args.json else [])])


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code (0 on success)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _check_paths(args)
        return args.func(args)
    except (ValueError, TypeError, ModuleNotFoundError, OSError) as err:  # OSError: ConnectionError, FileNotFoundError, ...
        # allowed broad handler: the top level prints the error (RunDirectoryError too) as one line, exit 2
        if args.traceback:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Command line: ``python -m grpo_tutorial {train,evaluate,plot} ...``.

Examples::

    # GRPO on the tiny model, with a supervised warm start and before/after evaluation
    python -m grpo_tutorial train --model tiny --task addition --steps 200 --out runs/tiny \\
        --sft-steps 450 --sft-target-accuracy 0.3 --eval-before --eval-after

    # continue a run that was interrupted (Ctrl-C, a kill, a lost Colab session)
    python -m grpo_tutorial train --model tiny --task addition --steps 200 --out runs/tiny --resume

    python -m grpo_tutorial evaluate --checkpoint runs/tiny --n 500
    python -m grpo_tutorial plot runs/tiny --out runs/tiny/curves.png

Errors in flags and paths print one line, ``error: ...``, and exit with code 2
(``--traceback`` shows the full traceback); Ctrl-C during training exits with 130.

Every flag left out takes the model's preset (see ``PRESETS``): the tiny model
gets DESIGN.md's calibrated CPU settings, chat models settings sized for a
135M-0.5B model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

__all__ = ["PRESETS", "TASKS", "build_parser", "main"]

TASKS = ("addition", "multiplication", "countdown", "gsm8k")

#: GRPOConfig values per kind of model, used for every flag not given.
PRESETS: dict[str, dict[str, Any]] = {
    # DESIGN.md's calibration: B=16, G=8, 4 new tokens, mu=2, lr 1e-4, clip 1.0
    "tiny": dict(
        group_size=8, prompts_per_step=16, max_new_tokens=4, num_iterations=2, learning_rate=1e-4,
        checkpoint_every=50,
    ),
    # a starting point for 135M-0.5B instruct models on CPU/GPU
    "chat": dict(
        group_size=8, prompts_per_step=4, max_new_tokens=48, num_iterations=1, learning_rate=1e-5,
        checkpoint_every=10,
    ),
}

_FLAG_TO_FIELD = {
    "group_size": "group_size",
    "prompts_per_step": "prompts_per_step",
    "max_new_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "lr": "learning_rate",
    "weight_decay": "weight_decay",
    "warmup_steps": "warmup_steps",
    "beta": "beta",
    "kl_kind": "kl_kind",
    "clip_eps": "clip_eps",
    "clip_eps_high": "clip_eps_high",
    "num_iterations": "num_iterations",
    "minibatch_size": "minibatch_size",
    "micro_batch_size": "micro_batch_size",
    "loss_type": "loss_type",
    "scale_rewards": "scale_rewards",
    "std": "std",
    "max_grad_norm": "max_grad_norm",
    "ref_sync_every": "ref_sync_every",
    "system_prompt": "system_prompt",
    "checkpoint_every": "checkpoint_every",
    "eval_batch_size": "eval_batch_size",
}


# ---------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------


class _DefaultsOnceFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Append "(default: X)" only where the help text does not state the default
    itself, and never "(default: None)" or "(default: False)" (an absent flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or any(action.default is v for v in (None, False, argparse.SUPPRESS)):
            return text
        return super()._get_help_string(action)


def _add_model_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument(
        "--model",
        required=required,
        help="'tiny', 'smollm2-135m-instruct', a Hugging Face id (online) or a local folder",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:0 ... (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="float32, bf16 or fp16 (default: by device)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def _add_task_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--task", choices=TASKS, required=required, help="which problems to train/evaluate on")
    p.add_argument("--digits", type=int, default=None, help="operand digits for addition/multiplication (default 2, 1 for chat models' multiplication)")
    p.add_argument("--data-seed", type=int, default=None, help="seed of the generated problems (default: --seed)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m grpo_tutorial",
        description="GRPO from the ground up: train, evaluate and plot from the command line.",
    )
    parser.add_argument("--traceback", action="store_true", help="show full tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,evaluate,plot}")

    # -- train
    t = sub.add_parser(
        "train",
        help="run GRPO and write history.jsonl, checkpoints and eval.json",
        description="Run GRPO. Flags left out take the model's preset (tiny or chat).",
        formatter_class=_DefaultsOnceFormatter,
    )
    _add_model_args(t, required=True)
    _add_task_args(t, required=True)
    t.add_argument("--steps", type=int, required=True, help="total GRPO steps (a resumed run stops at the same step)")
    t.add_argument("--out", required=True, help="output directory (history.jsonl, checkpoint/, eval.json, run.json)")
    t.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint if it exists")
    t.add_argument("--seed", type=int, default=0, help="seed of sampling, data order and the tiny model's init")
    t.add_argument("--n-train", type=int, default=5000, help="training problems to generate")
    t.add_argument("--n-eval", type=int, default=200, help="held-out problems for --eval-before/--eval-after")
    t.add_argument("--eval-before", action="store_true", help="greedy accuracy on the held-out set before GRPO")
    t.add_argument("--eval-after", action="store_true", help="greedy accuracy on the held-out set after GRPO")
    t.add_argument(
        "--reward",
        action="append",
        default=None,
        metavar="NAME[:WEIGHT]",
        help="reward function, repeatable: correctness, format, partial_credit, countdown "
        "(default: the task's own, countdown for countdown, else correctness); e.g. "
        "--reward correctness --reward format:0.2",
    )
    t.add_argument("--sft-steps", type=int, default=0, help="supervised warm-start steps before GRPO (tiny model)")
    t.add_argument("--sft-target-accuracy", type=float, default=None, help="stop the warm start at this held-out greedy accuracy")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = t.add_argument_group("GRPO config (default: the model's preset)")
    g.add_argument("--group-size", type=int, help="G, completions per prompt")
    g.add_argument("--prompts-per-step", type=int, help="B, prompts per step")
    g.add_argument("--max-new-tokens", type=int, help="completion budget")
    g.add_argument("--temperature", type=float)
    g.add_argument("--top-p", type=float)
    g.add_argument("--lr", type=float, help="learning rate")
    g.add_argument("--weight-decay", type=float)
    g.add_argument("--warmup-steps", type=int, help="linear LR warmup, in optimizer updates")
    g.add_argument("--beta", type=float, help="KL penalty weight (0 = no reference model)")
    g.add_argument("--kl-kind", choices=("k1", "k2", "k3"))
    g.add_argument("--clip-eps", type=float)
    g.add_argument("--clip-eps-high", type=float, help="DAPO clip-higher, e.g. 0.28")
    g.add_argument("--num-iterations", type=int, help="mu, passes over each batch")
    g.add_argument("--minibatch-size", type=int, help="completions per optimizer update")
    g.add_argument("--micro-batch-size", type=int, help="completions per forward/backward pass (memory only)")
    g.add_argument("--loss-type", choices=("grpo", "bnpo", "dapo", "dr_grpo"))
    g.add_argument("--scale-rewards", choices=("group", "batch", "none"))
    g.add_argument("--std", choices=("sample", "population"))
    g.add_argument("--max-grad-norm", type=float)
    g.add_argument("--ref-sync-every", type=int)
    g.add_argument("--system-prompt", help="system message for chat models")
    g.add_argument("--checkpoint-every", type=int, help="steps between checkpoints, also saved at the end (0 = none; Ctrl-C still saves)")
    g.add_argument("--eval-batch-size", type=int)
    t.set_defaults(func=_cmd_train)

    # -- evaluate
    e = sub.add_parser(
        "evaluate",
        help="greedy accuracy of a model or checkpoint on held-out problems",
        description="Greedy evaluation. With --checkpoint pointing at a train --out directory, "
        "--model, --task and the other settings default to that run's.",
        formatter_class=_DefaultsOnceFormatter,
    )
    _add_model_args(e, required=False)
    _add_task_args(e, required=False)
    e.add_argument("--checkpoint", default=None, help="a train --out directory or a checkpoint directory")
    e.add_argument("--n", type=int, default=None, help="number of held-out problems (default: the run's --n-eval, else 200)")
    e.add_argument("--seed", type=int, default=None, help="the run's seed (default: from run.json, else 0)")
    e.add_argument("--max-new-tokens", type=int, default=None)
    e.add_argument("--system-prompt", default=None)
    e.add_argument("--batch-size", type=int, default=None, help="prompts per generate call")
    e.add_argument("--out", default=None, help="write the result as JSON here")
    e.set_defaults(func=_cmd_evaluate)

    # -- plot
    p = sub.add_parser(
        "plot",
        help="draw the training curves of a history.jsonl",
        description="Plot reward, accuracy, KL, clip fraction, length and zero-std fraction against the step.",
        formatter_class=_DefaultsOnceFormatter,
    )
    p.add_argument("history", help="a run directory or its history.jsonl")
    p.add_argument("--out", required=True, help="image file to write (png, pdf, svg)")
    p.add_argument("--smooth", type=int, default=None, help="moving-average window in steps")
    p.add_argument("--keys", nargs="+", default=None, help="history keys to plot (default: the standard six)")
    p.set_defaults(func=_cmd_plot)
    return parser


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _is_tiny(model_name: str) -> bool:
    return model_name.strip().lower() == "tiny"


def _load_model(args: argparse.Namespace, seed: int) -> tuple[Any, Any]:
    """The policy and tokenizer; the tiny model's initial weights follow ``seed``."""
    import torch

    from .models import build_tiny_policy, load_policy, pick_device_and_dtype

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if _is_tiny(args.model):
        device, dtype = pick_device_and_dtype(args.device, args.dtype)
        model, tokenizer = build_tiny_policy(seed=seed)
        return model.to(device=device, dtype=dtype), tokenizer
    return load_policy(args.model, device=args.device, dtype=args.dtype)


def make_task_data(
    task: str, *, tiny: bool, n_train: int, n_eval: int, seed: int, digits: int | None
) -> tuple[list[dict], list[dict], list]:
    """Training rows, held-out rows and reward functions for a task."""
    from .rewards import correctness_reward
    from .tasks import countdown_reward, load_gsm8k, make_countdown_dataset, train_test_split_arithmetic

    if task in ("addition", "multiplication"):
        op = "+" if task == "addition" else "*"
        if digits is None:
            digits = 1 if (task == "multiplication" and not tiny) else 2
        train, test = train_test_split_arithmetic(
            n_train, n_eval, seed, op=op, digits=digits, style="plain" if tiny else "question"
        )
        return train, test, [correctness_reward]
    if tiny:
        raise ValueError(
            f"--task {task} has word prompts, which the tiny model's character vocabulary cannot "
            "spell; use --task addition or multiplication with --model tiny"
        )
    if task == "countdown":
        train = make_countdown_dataset(n_train, seed)
        seen = {row["prompt"] for row in train}
        test = [row for row in make_countdown_dataset(n_eval * 3, seed + 1) if row["prompt"] not in seen][:n_eval]
        return train, test, [countdown_reward]
    if task == "gsm8k":
        train = load_gsm8k("train")[:n_train]
        test = load_gsm8k("test")[:n_eval]
        return train, test, [correctness_reward]
    raise ValueError(f"--task must be one of {list(TASKS)}, got {task!r}")


def accuracy_fn_for(task: str) -> Any:
    """What counts as a correct completion: the countdown checker, else the default (answer matches)."""
    if task == "countdown":
        from .tasks import countdown_reward

        return countdown_reward
    return None


def parse_rewards(specs: Sequence[str]) -> tuple[list, list[float]]:
    """``["correctness", "format:0.2"]`` -> reward functions and their weights."""
    from .rewards import correctness_reward, format_reward, partial_credit_reward
    from .tasks import countdown_reward

    named = {
        "correctness": correctness_reward,
        "format": format_reward,
        "partial_credit": partial_credit_reward,
        "countdown": countdown_reward,
    }
    fns, weights = [], []
    for spec in specs:
        name, _, weight = spec.partition(":")
        if name not in named:
            raise ValueError(f"--reward {spec!r}: unknown reward {name!r}; expected one of {sorted(named)}")
        try:
            value = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"--reward {spec!r}: the weight {weight!r} is not a number") from None
        fns.append(named[name])
        weights.append(value)
    return fns, weights


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
        from .models import _check_model_dir

        _check_model_dir(model)  # a local --model that is not a saved model fails here, before --out is made
    if args.command == "train":
        _check_writable("--out", args.out, is_dir=True)
    elif args.command == "evaluate":
        if args.checkpoint is not None and not Path(args.checkpoint).expanduser().exists():
            raise ValueError(f"--checkpoint {args.checkpoint!r} does not exist")
        if args.out is not None:
            _check_writable("--out", args.out, is_dir=False)
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
    if args.steps < 1:
        raise ValueError(f"--steps must be a positive int, got {args.steps}")
    with _claim_out(Path(args.out)):
        return _train(args, Path(args.out))


def _train(args: argparse.Namespace, out: Path) -> int:
    import torch

    from .config import GRPOConfig
    from .run.layout import find_checkpoint, read_meta
    from .trainer import GRPOTrainer

    checkpoint = find_checkpoint(out) if args.resume else None
    resuming = checkpoint is not None
    if resuming:
        meta = read_meta(checkpoint)
        print(f"resuming from {checkpoint} at step {meta['step']}", flush=True)
    elif args.resume:
        print(f"--resume: no checkpoint in {out} yet, starting from step 0", flush=True)
    tiny = _is_tiny(args.model)
    data_seed = args.seed if args.data_seed is None else args.data_seed

    # data and config first: bad flags or gsm8k offline fail before a slow model load
    train_rows, eval_rows, reward_fns = make_task_data(
        args.task, tiny=tiny, n_train=args.n_train, n_eval=args.n_eval, seed=data_seed, digits=args.digits
    )
    weights = None
    if args.reward:
        reward_fns, weights = parse_rewards(args.reward)
    preset = dict(PRESETS["tiny" if tiny else "chat"])
    for flag, field_name in _FLAG_TO_FIELD.items():
        value = getattr(args, flag)
        if value is not None:
            preset[field_name] = value
    config = GRPOConfig(**preset, reward_weights=weights, seed=args.seed, output_dir=str(out))
    torch.manual_seed(args.seed)
    model, tokenizer = _load_model(args, args.seed)
    _write_json(out / "run.json", run_dir=out, data={"argv": sys.argv[1:], "args": vars(args) | {"func": None}, "config": config.to_dict()})

    evals: dict[str, Any] = {}
    if (out / "eval.json").exists() and resuming:
        evals = json.loads((out / "eval.json").read_text(encoding="utf-8"))

    if args.sft_steps and not resuming:
        from .sft import SFTConfig, supervised_warmup

        t0 = time.perf_counter()
        stop_when = None
        if args.sft_target_accuracy is not None:
            probe_rows = train_rows[-200:]  # training problems: the held-out set stays unseen

            def stop_when(m: Any) -> bool:
                probe = _evaluate(m, tokenizer, probe_rows, reward_fns, config, args.task, num_samples=0)
                return probe["accuracy"] >= args.sft_target_accuracy

        sft_history = supervised_warmup(
            model, tokenizer, train_rows, SFTConfig(steps=args.sft_steps, seed=args.seed),
            stop_when=stop_when, progress=not args.no_progress,
        )
        evals["sft"] = {"steps": len(sft_history), "seconds": time.perf_counter() - t0}
        print(f"warm start: {len(sft_history)} supervised steps in {evals['sft']['seconds']:.1f} s", flush=True)
        torch.manual_seed(args.seed)  # GRPO starts from the same RNG state however long the warm start ran

    trainer = GRPOTrainer(model, tokenizer, reward_fns, config, accuracy_fn=accuracy_fn_for(args.task))
    if args.eval_before and not resuming:
        evals["before"] = trainer.evaluate(eval_rows)
        _print_eval("before GRPO", evals["before"])
        _write_json(out / "eval.json", evals, out)

    t0 = time.perf_counter()
    try:
        history = trainer.train(train_rows, args.steps, resume=args.resume, progress=not args.no_progress)
    except KeyboardInterrupt as err:
        print(f"\n{err or 'interrupted'}; continue with the same command plus --resume", file=sys.stderr)
        return 130
    seconds = time.perf_counter() - t0
    print(f"GRPO: {len(history)} steps, last reward {history[-1]['reward_mean']:.3f} "
          f"({seconds:.1f} s in this process)", flush=True)
    if args.eval_after:
        evals["after"] = trainer.evaluate(eval_rows)
        _print_eval("after GRPO", evals["after"])
        if "before" in evals:
            gain = evals["after"]["accuracy"] - evals["before"]["accuracy"]
            print(f"change in held-out greedy accuracy: {gain:+.3f}")
    if evals:
        _write_json(out / "eval.json", evals, out)
    print(f"wrote {out / 'history.jsonl'}", flush=True)
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    import dataclasses

    from .config import GRPOConfig
    from .run.checkpoint import load_model_state
    from .run.layout import find_checkpoint

    run: dict[str, Any] = {}
    if args.checkpoint is not None:
        ckpt = find_checkpoint(args.checkpoint)
        if ckpt is None:
            raise FileNotFoundError(f"--checkpoint {args.checkpoint!r} holds no checkpoint (expected checkpoint/state.pt)")
        for candidate in (Path(args.checkpoint) / "run.json", ckpt.parent / "run.json"):
            if candidate.exists():
                run = json.loads(candidate.read_text(encoding="utf-8"))["args"]
                break
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
    tiny = _is_tiny(model_name)

    _, eval_rows, reward_fns = make_task_data(
        task, tiny=tiny, n_train=1, n_eval=n, seed=data_seed, digits=digits
    )
    model, tokenizer = _load_model(args, seed)
    config_values: dict[str, Any]
    if args.checkpoint is not None:  # evaluate as the run trained: its whole config
        meta = load_model_state(model, args.checkpoint)
        fields = {f.name for f in dataclasses.fields(GRPOConfig)}
        config_values = {k: v for k, v in meta["config"].items() if k in fields and k != "output_dir"}
    else:
        config_values = dict(PRESETS["tiny" if tiny else "chat"])
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

"""GRPO on SmolLM2-135M-Instruct on the CPU: held-out greedy accuracy before and after.

The run behind chapter 9's committed log (``grpo_tutorial/data/smollm2_history.jsonl``
and ``grpo_tutorial/data/smollm2_eval.json``, package data that the chapter reads
with ``grpo_tutorial.data.read_data``)::

    HF_HUB_OFFLINE=1 python benchmarks/smollm2_run.py --out runs/smollm2 \\
        --max-train-minutes 15 --steps 200 --publish

``--out`` gets ``history.jsonl`` and ``summary.json``. ``--publish`` also writes
them into ``grpo_tutorial/data/``: the history as ``smollm2_history.jsonl`` (seed 0)
or ``smollm2_history_seed<N>.jsonl``, and, for seed 0, the summary as
``smollm2_eval.json``, keeping that file's hand-written ``tried`` list.

Task: one-digit arithmetic, ``"What is 7 * 3?"`` with +, - and *. There are 300
such problems; 200 of them are the held-out test set and GRPO trains only on the
other 100. Settings: the ``"smollm2-cpu"`` preset (``grpo_tutorial.presets``),
any field of which can be overridden with ``--set name=value``.

Training stops at ``--steps``, or before a step that would (judging by the
previous one) take the training time (evaluation excluded) past
``--max-train-minutes``, whichever comes first; the load of the machine can still
make the last step overrun, and the summary records the time actually spent. The summary JSON holds
the before/after accuracy with standard errors, the paired gain, per-operator
accuracies, example completions, timings and the load average.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpo_tutorial.chapters.run_record import package_commit  # noqa: E402
from grpo_tutorial import GRPOTrainer, correctness_reward, load_policy  # noqa: E402
from grpo_tutorial.chapters.gsm8k import smollm2_cpu_data  # noqa: E402
from grpo_tutorial.chapters.recipes import accuracy_with_se, paired_gain  # noqa: E402
from grpo_tutorial.presets import get_preset  # noqa: E402

OPS = ["+", "-", "*"]
DATA_DIR = Path(__file__).resolve().parent.parent / "grpo_tutorial" / "data"  # package data


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["learning_rate=1e-5", "system_prompt='Be brief.'"]`` -> a dict of GRPOConfig fields."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--set {item!r}: expected name=value, e.g. learning_rate=1e-5")
        try:
            out[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[name] = text  # a bare string such as system_prompt=Be brief.
    return out


def per_op_accuracy(rows: Sequence[dict], correct: Sequence[bool]) -> dict[str, dict[str, float]]:
    """Accuracy and its standard error for each operator."""
    result = {}
    for op in OPS:
        hits = [c for row, c in zip(rows, correct) if row["op"] == op]
        if hits:
            acc, se = accuracy_with_se(hits)
            result[op] = {"accuracy": acc, "se": se, "n": len(hits)}
    return result


def short_eval(rows: Sequence[dict], evaluation: dict, k: int = 8) -> dict:
    """The JSON part of a ``trainer.evaluate`` result, with k example completions."""
    return {
        "accuracy": evaluation["accuracy"],
        "se": evaluation["se"],
        "n": evaluation["n"],
        "seconds": evaluation["seconds"],
        "per_op": per_op_accuracy(rows, evaluation["correct"]),
        "examples": [
            {"prompt": row["prompt"], "completion": c, "answer": row["answer"], "correct": ok}
            for row, c, ok in list(zip(rows, evaluation["completions"], evaluation["correct"]))[:k]
        ],
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line; tests/test_records.py parses each record's command with it."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (history.jsonl, summary.json)")
    p.add_argument("--steps", type=int, default=200, help="most GRPO steps")
    p.add_argument("--max-train-minutes", type=float, default=15.0, help="stop training after this much training time")
    p.add_argument("--seed", type=int, default=0, help="sampling and data-order seed")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the train/test split")
    p.add_argument("--n-train", type=int, default=2000, help="training rows (drawn with repeats from the 100 non-test problems)")
    p.add_argument("--n-test", type=int, default=200, help="held-out problems (distinct)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--preset", default="smollm2-cpu")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a GRPOConfig field")
    p.add_argument("--publish", action="store_true", help="also write the files chapter 9 reads into grpo_tutorial/data/")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code = package_commit()  # at the start: the code that runs, whatever changes while it runs
    if args.steps < 1 or args.max_train_minutes <= 0:
        raise ValueError(f"--steps must be >= 1 and --max-train-minutes > 0, got {args.steps} and {args.max_train_minutes}")

    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = get_preset(args.preset, seed=args.seed, output_dir=str(out), **parse_overrides(args.set))
    train_rows, test_rows = smollm2_cpu_data(args.n_train, args.n_test, args.data_seed)
    t0 = time.perf_counter()
    model, tokenizer = load_policy("smollm2-135m-instruct", device="cpu")
    load_seconds = time.perf_counter() - t0
    torch.manual_seed(args.seed)
    trainer = GRPOTrainer(model, tokenizer, correctness_reward, config)

    before = trainer.evaluate(test_rows)
    print(f"before: greedy accuracy {before['accuracy']:.3f} +- {before['se']:.3f} (n={before['n']}, {before['seconds']:.0f} s)", flush=True)

    budget = 60.0 * args.max_train_minutes
    train_seconds = last_step = 0.0
    # a step starts only if it is expected (from the last one) to end within the budget
    while trainer.step < args.steps and train_seconds + last_step <= budget:
        start = time.perf_counter()
        row = trainer.train(train_rows, trainer.step + 1, progress=False)[-1]
        last_step = time.perf_counter() - start
        train_seconds += last_step
        print(
            f"step {row['step']:3d}  reward {row['reward_mean']:.3f}  zero-std {row['frac_zero_std']:.2f}  "
            f"len {row['completion_len_mean']:.1f}  trunc {row['frac_truncated']:.2f}  "
            f"{row['step_seconds']:.1f} s  (total {train_seconds / 60:.1f} min, load {os.getloadavg()[0]:.1f})",
            flush=True,
        )

    after = trainer.evaluate(test_rows)
    gain, gain_se = paired_gain(before["correct"], after["correct"])
    print(f"after:  greedy accuracy {after['accuracy']:.3f} +- {after['se']:.3f}; gain {gain:+.3f} +- {gain_se:.3f} (paired)", flush=True)

    summary = {
        "model": "smollm2-135m-instruct",
        "task": "one-digit arithmetic (+, -, *), question style; test = 200 of the 300 problems, train = the other 100",
        "command": "python benchmarks/smollm2_run.py " + " ".join(sys.argv[1:] if argv is None else argv),
        **code,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "preset": args.preset,
        "config": {k: v for k, v in config.to_dict().items() if k != "output_dir"},
        "steps": trainer.step,
        "train_seconds": train_seconds,
        "seconds_per_step": train_seconds / max(1, trainer.step),
        "load_seconds": load_seconds,
        "torch_threads": torch.get_num_threads(),
        "load_average_at_end": list(os.getloadavg()),
        "before": short_eval(test_rows, before),
        "after": short_eval(test_rows, after),
        "gain": gain,
        "gain_se_paired": gain_se,
        "correct_before": before["correct"],
        "correct_after": after["correct"],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out / 'history.jsonl'} and {out / 'summary.json'}")
    if args.publish:
        suffix = "" if args.seed == 0 else f"_seed{args.seed}"
        history = DATA_DIR / f"smollm2_history{suffix}.jsonl"
        shutil.copyfile(out / "history.jsonl", history)
        print(f"wrote {history}")
        if args.seed == 0:
            eval_file = DATA_DIR / "smollm2_eval.json"
            old = json.loads(eval_file.read_text(encoding="utf-8")) if eval_file.exists() else {}
            kept = {k: old[k] for k in ("tried", "tried_note") if k in old}
            eval_file.write_text(json.dumps({**summary, **kept}, indent=1) + "\n", encoding="utf-8")
            print(f"wrote {eval_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

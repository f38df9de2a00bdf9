"""Does GRPO really learn on this CPU? The tiny-model demonstration, for several seeds.

For each seed, :func:`grpo_tutorial.chapters.recipes.run_tiny_addition` warm-starts a tiny
character-level Qwen2 on 2-digit addition until it has partial skill, measures
held-out greedy accuracy, runs GRPO, and measures it again on the same held-out
problems. This script prints one row per seed and writes a JSON file with
everything, including the machine's load average while it ran (other processes
on a shared machine inflate the wall-clock seconds; the CPU seconds of this
process are recorded too).

Run it as either of::

    python benchmarks/tiny_learning.py --seeds 0 1
    python -m benchmarks.tiny_learning --seeds 0 1 2 3 4 5 6 7 --jobs 2

``--jobs N`` runs seeds in N processes at once (each at the recipe's one thread, so the
numbers do not depend on N). The committed record, chapter 8's, is the second command
(about 15 minutes on 2 idle cores); its machine names the kernel fingerprint that
``tests/test_records.py`` compares before it asks for the same bits.

``--quick`` runs the seconds-long test recipe instead (it proves nothing about
learning; it checks that the script works).
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks.common import LoadSampler, RecordRun  # noqa: E402
from grpo_tutorial.chapters.recipes import (  # noqa: E402
    FLAT_SETTINGS,
    TinyAdditionRecipe,
    result_summary,
    run_tiny_addition,
)

# package data: chapter 8 reads it with grpo_tutorial.data.read_data("tiny_learning.json")
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "grpo_tutorial" / "data" / "tiny_learning.json"
TARGET_GAIN = 0.25  # issue 3: at least +25 points of held-out greedy accuracy ...
TARGET_GRPO_SECONDS = 180.0  # ... within at most 3 minutes of GRPO wall-clock time


def load_summary(sampler: LoadSampler) -> dict[str, float]:
    """Mean, min and max of the 1-minute load average recorded during a run."""
    xs = sampler.samples or [os.getloadavg()[0]]
    return {"mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``["grpo_steps=400", "grpo_learning_rate=5e-5"]`` -> recipe settings (JSON-parsed).

    Names are recipe fields or the flat names of config settings (``FLAT_SETTINGS``),
    as :meth:`TinyAdditionRecipe.with_settings` takes them.
    """
    names = ({f.name for f in dataclasses.fields(TinyAdditionRecipe)} - {"sft", "grpo"}) | set(FLAT_SETTINGS)
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--set expects FIELD=VALUE, got {pair!r}")
        name, text = pair.split("=", 1)
        if name not in names:
            raise ValueError(f"--set {name}: not a TinyAdditionRecipe field; choose from {sorted(names)}")
        try:
            out[name] = json.loads(text)
        except json.JSONDecodeError:
            out[name] = text
    return out


def format_table(rows: Sequence[dict]) -> str:
    """One line per seed: warm-start s, accuracy before +- se, GRPO s, after +- se, gain."""
    head = (
        f"{'seed':>4}  {'warm start':>10}  {'before':>13}  {'GRPO s':>7}  {'GRPO cpu s':>10}  "
        f"{'after':>13}  {'gain (points)':>14}  {'load':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['seed']:>4}  {r['seconds']['warm_start']:>9.0f}s  "
            f"{r['before']['accuracy']:>6.3f}±{r['before']['se']:.3f}  {r['seconds']['grpo']:>7.0f}  "
            f"{r['seconds']['grpo_cpu']:>10.0f}  {r['after']['accuracy']:>6.3f}±{r['after']['se']:.3f}  "
            f"{100 * r['gain']:>+8.1f} ± {100 * r['gain_se']:.1f}  {r['load']['mean']:>5.1f}"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line; tests/test_records.py parses each record's command with it."""
    parser = argparse.ArgumentParser(
        prog="python benchmarks/tiny_learning.py",
        description="Warm start + GRPO on the tiny model for each seed; held-out greedy accuracy "
        "before and after, with standard errors and the seconds of each phase.",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="training seeds (default: 0 1)")
    parser.add_argument("--quick", action="store_true", help="the seconds-long test recipe (a smoke run)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a TinyAdditionRecipe field, e.g. --set grpo_steps=400 (repeatable)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output (default: %(default)s)")
    parser.add_argument("--history", action="store_true", help="also store every GRPO history row in the JSON")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes (default 1)")
    return parser


def _one_seed(recipe: TinyAdditionRecipe, seed: int, progress: bool, history: bool) -> dict[str, Any]:
    """One seed's run, summarised (a process of its own with ``--jobs``)."""

    def report(name: str, info: dict) -> None:
        if name == "warm_start":
            print(f"[seed {seed}] warm start: {info['steps']} steps, {info['seconds']:.0f} s, "
                  f"probe accuracy {info['probe_accuracy'][-1][1]:.3f}", flush=True)
        elif name in ("before", "after", "heldout"):
            where = f"step {info['step']}" if name == "heldout" else name
            print(f"[seed {seed}] held-out accuracy {where}: {info['accuracy']:.3f} ± {info['se']:.3f}", flush=True)
        elif name == "grpo":
            print(f"[seed {seed}] GRPO: {info['steps']} steps, {info['seconds']:.0f} s "
                  f"({info['cpu_seconds']:.0f} CPU s)", flush=True)

    with LoadSampler() as load:
        result = run_tiny_addition(recipe, seed=seed, progress=progress, on_phase=report)
    row = result_summary(result, include_history=history)
    row["load"] = load_summary(load)
    row["meets_target"] = bool(row["gain"] >= TARGET_GAIN and row["seconds"]["grpo"] <= TARGET_GRPO_SECONDS)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = RecordRun("python benchmarks/tiny_learning.py", argv)
    if any(s < 0 for s in args.seeds):
        parser.error(f"--seeds must be >= 0, got {args.seeds}")

    overrides = parse_overrides(args.overrides)
    base = TinyAdditionRecipe.quick() if args.quick else TinyAdditionRecipe()
    recipe = base.with_settings(**overrides)
    print(f"recipe: {'quick' if args.quick else 'default'}"
          + (f" with {overrides}" if overrides else "")
          + f"; load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)

    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    progress = not args.no_progress and args.jobs == 1  # several processes' bars would overwrite each other
    with run:
        if args.jobs == 1:
            rows = [_one_seed(recipe, seed, progress, args.history) for seed in args.seeds]
        else:
            with futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
                rows = list(pool.map(_one_seed, *zip(*[(recipe, seed, False, args.history) for seed in args.seeds])))
    header = run.header(quick=args.quick, jobs=args.jobs, threads=recipe.num_threads or torch.get_num_threads())

    print()
    print(format_table(rows))
    print(f"target: gain >= {100 * TARGET_GAIN:.0f} points with GRPO <= {TARGET_GRPO_SECONDS:.0f} s; "
          f"met for {sum(r['meets_target'] for r in rows)} of {len(rows)} seeds "
          "(load = mean 1-minute load average during the seed's run)")
    record = {**header, "target": {"gain": TARGET_GAIN, "grpo_seconds": TARGET_GRPO_SECONDS}, "runs": rows}
    run.write(args.out, record)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

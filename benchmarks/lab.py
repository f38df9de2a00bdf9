"""``python -m benchmarks.lab``: chapter 12's GRPO lab, every method for several seeds.

For each seed, one warm start (chapter 8's recipe), then every method of
:data:`grpo_tutorial.chapters.lab.LAB_METHODS` from a copy of it for the same
number of steps; pass@k before and after GRPO. The per-seed results and the
summary across seeds (mean, standard error, t confidence interval, paired
difference against GRPO) go into ONE file inside the package data,
``grpo_tutorial/data/lab_results.json``, which chapter 12 reads. The file also
records the command, the wall time, and the machine's load (``uptime`` at the
start and end, and the 1-minute load average sampled during the run).

``--jobs N`` (default 3) runs seeds in parallel processes (a seed is independent of the
others, so the numbers are the same; only the wall time changes).
``--cache DIR`` keeps each finished seed there (checked against the settings it was made with) and
takes it again when the same command runs after an interruption, so a killed run loses at most the
seeds in progress. ``--quick`` is a seconds-long smoke run of the test recipe that proves nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RecordRun, add_record_arguments, open_cache, run_seeds, write_atomic  # noqa: E402
from grpo_tutorial.chapters.lab import LAB_METHODS, LabSettings, run_seed, summarize_lab  # noqa: E402
from grpo_tutorial.chapters.recipes import TinyAdditionRecipe  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "grpo_tutorial" / "data" / "lab_results.json"

#: The full lab's recipe: chapter 8's, with 80 instead of 400 GRPO steps so that 8 methods x 3
#: seeds fit in an hour on a shared 2-core machine, and a smaller held-out set
#: (500 problems; the curve and final accuracy use all of them).
FULL = dict(grpo_steps=80, eval_every=20, n_test=500)
QUICK_SEEDS = (0, 1)


def settings_for(args: argparse.Namespace) -> LabSettings:
    if args.quick:
        recipe = TinyAdditionRecipe.quick(grpo_steps=args.steps or 4, eval_every=2)
        return LabSettings(recipe=recipe, methods=tuple(args.methods), seeds=tuple(args.seeds or QUICK_SEEDS),
                           passk_problems=20, passk_n=args.passk_n or 16)
    recipe = TinyAdditionRecipe(**{**FULL, **({"grpo_steps": args.steps} if args.steps else {})})
    return LabSettings(recipe=recipe, methods=tuple(args.methods), seeds=tuple(args.seeds or (0, 1, 2)),
                       passk_problems=args.passk_problems, passk_n=args.passk_n or 64)


class _SeedFree:
    """The settings a cached seed depends on: all but the list of seeds (a seed's run does not read it), so
    that a later command with more seeds takes the finished ones from the same cache."""

    def __init__(self, settings: LabSettings) -> None:
        self.settings = settings

    def to_dict(self) -> dict:
        return {k: v for k, v in self.settings.to_dict().items() if k != "seeds"}


def _one_seed(settings: LabSettings, seed: int, progress: bool, folder: str | None = None) -> dict:
    """One seed's results: from ``folder`` when an earlier invocation finished it, else run (and kept there)."""
    cached = None if folder is None else Path(folder) / f"seed_{seed}.json"
    if cached is not None and cached.exists():
        return json.loads(cached.read_text())
    result = _run_seed(settings, seed, progress)
    if cached is not None:
        write_atomic(cached, json.dumps(result))
    return result


def _run_seed(settings: LabSettings, seed: int, progress: bool) -> dict:
    def report(method: str, result: dict) -> None:
        print(f"  seed {seed} {method:9s} held-out {result['final_accuracy']:.3f}  "
              f"{result['seconds']:6.1f} s", flush=True)

    return run_seed(settings, seed, progress=progress, on_method=report)


def build_parser() -> argparse.ArgumentParser:
    """The command line; tests/test_records.py parses each record's command with it."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default 0 1 2)")
    parser.add_argument("--methods", nargs="+", default=list(LAB_METHODS), choices=list(LAB_METHODS))
    parser.add_argument("--steps", type=int, default=None, help=f"steps per method (default {FULL['grpo_steps']})")
    parser.add_argument("--passk-problems", type=int, default=200, help="held-out problems for pass@k")
    parser.add_argument("--passk-n", type=int, default=None, help="samples per problem for pass@k (default 64)")
    add_record_arguments(parser, DEFAULT_OUT, jobs=3, jobs_help="seeds run in parallel processes, one per seed")
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep finished seeds here, and take them again after an interruption (default: none)")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    settings = settings_for(args)
    with RecordRun("python -m benchmarks.lab", argv) as run, contextlib.ExitStack() as stack:
        print(f"{run.command}: {len(settings.seeds)} seeds x {len(settings.methods)} methods x "
              f"{settings.recipe.grpo_steps} steps, jobs={args.jobs}\n  {run.uptime_start}", flush=True)
        folder = None if args.cache is None else open_cache(args.cache, _SeedFree(settings), stack)
        seeds = run_seeds(settings.seeds, functools.partial(_one_seed, settings, folder=folder), jobs=args.jobs,
                          progress=not args.no_progress, run=run)
    out = {**run.header(quick=args.quick, jobs=args.jobs, threads=settings.recipe.num_threads or 1),
           "settings": settings.to_dict(), "method_options": {m: LAB_METHODS[m] for m in settings.methods},
           "missing_methods": [m for m in LAB_METHODS if m not in settings.methods],
           "summary": summarize_lab(seeds), "seeds": seeds}
    run.write(args.out, out)
    wall = out["wall_seconds"]
    print(f"\nwall time {wall / 60:.1f} min; {out['load']['uptime_end']}")
    print(f"{'method':10s} {'final acc':>10s} {'95% CI':>17s} {'vs GRPO':>8s} {'s/run':>7s}")
    for m, e in out["summary"]["methods"].items():
        diff = e.get("vs_grpo", {}).get("mean", float("nan"))
        print(f"{m:10s} {e['mean']:10.3f} [{e['lo']:6.3f}, {e['hi']:6.3f}] {diff:+8.3f} {e['seconds']:7.1f}")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()

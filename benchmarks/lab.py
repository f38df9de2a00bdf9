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
import concurrent.futures as futures
import contextlib
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import LoadSampler, load_average, machine, open_cache, write_atomic  # noqa: E402
from grpo_tutorial.chapters.run_record import json_safe, package_commit  # noqa: E402
from grpo_tutorial.run.progress import progress_bar  # noqa: E402
from grpo_tutorial.chapters.lab import LAB_METHODS, LabSettings, run_seed, summarize_lab  # noqa: E402
from grpo_tutorial.chapters.recipes import TinyAdditionRecipe  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "grpo_tutorial" / "data" / "lab_results.json"

#: The full lab's recipe: chapter 8's, with 80 instead of 400 GRPO steps so that 8 methods x 3
#: seeds fit in an hour on a shared 2-core machine, and a smaller held-out set
#: (500 problems; the curve and final accuracy use all of them).
FULL = dict(grpo_steps=80, eval_every=20, n_test=500)
QUICK_SEEDS = (0, 1)


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


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
    parser.add_argument("--jobs", type=int, default=3, help="seeds run in parallel processes (default 3: one per seed)")
    parser.add_argument("--quick", action="store_true", help="the seconds-long test recipe (proves nothing)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="default: %(default)s")
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep finished seeds here, and take them again after an interruption (default: none)")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    code = package_commit()  # at the start: the code that runs, whatever changes while it runs
    settings = settings_for(args)
    command = "python -m benchmarks.lab " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    started = dt.datetime.now(dt.timezone.utc)
    uptime_start = uptime()
    print(f"{command.strip()}: {len(settings.seeds)} seeds x {len(settings.methods)} methods x "
          f"{settings.recipe.grpo_steps} steps, jobs={args.jobs}\n  {uptime_start}", flush=True)
    t0 = time.perf_counter()
    seeds: list[dict] = []
    with contextlib.ExitStack() as stack, LoadSampler(every=10.0) as sampler:
        folder = None if args.cache is None else open_cache(args.cache, _SeedFree(settings), stack)
        if args.jobs <= 1:
            for seed in settings.seeds:
                seeds.append(_one_seed(settings, seed, not args.no_progress, folder))
                print(f"seed {seed} done: {seeds[-1]['seconds']:.0f} s (total {time.perf_counter() - t0:.0f} s)",
                      flush=True)
        else:
            bar = progress_bar(total=len(settings.seeds), desc="seeds", enabled=not args.no_progress)
            with futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
                pending = [pool.submit(_one_seed, settings, seed, False, folder) for seed in settings.seeds]
                for done in futures.as_completed(pending):
                    seeds.append(done.result())
                    bar.update(1)
                    print(f"seed {seeds[-1]['seed']} done: {seeds[-1]['seconds']:.0f} s "
                          f"(total {time.perf_counter() - t0:.0f} s)", flush=True)
            bar.close()
            seeds.sort(key=lambda r: r["seed"])
    wall = time.perf_counter() - t0
    missing = [m for m in LAB_METHODS if m not in settings.methods]
    out = {
        "created": started.isoformat(timespec="seconds"),
        "command": command.strip(),
        **code,
        "quick": args.quick,
        "wall_seconds": wall,
        "jobs": args.jobs,
        "load": {"uptime_start": uptime_start, "uptime_end": uptime(), "during": sampler.summary(),
                 "end": load_average()},
        "machine": machine(settings.recipe.num_threads or 1),
        "settings": settings.to_dict(),
        "method_options": {m: LAB_METHODS[m] for m in settings.methods},
        "missing_methods": missing,
        "summary": summarize_lab(seeds),
        "seeds": seeds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(json_safe(out), indent=1, allow_nan=False) + "\n")
    print(f"\nwall time {wall / 60:.1f} min; {out['load']['uptime_end']}")
    print(f"{'method':10s} {'final acc':>10s} {'95% CI':>17s} {'vs GRPO':>8s} {'s/run':>7s}")
    for m, e in out["summary"]["methods"].items():
        diff = e.get("vs_grpo", {}).get("mean", float("nan"))
        print(f"{m:10s} {e['mean']:10.3f} [{e['lo']:6.3f}, {e['hi']:6.3f}] {diff:+8.3f} {e['seconds']:7.1f}")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()

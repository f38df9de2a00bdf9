"""``python -m benchmarks.mismatch``: chapter 15's experiment, samplers that are not the learner, with and without TRL's correction.

For each seed, one warm start (chapter 8's recipe), then every setting of
:class:`grpo_tutorial.chapters.mismatch_lab.MismatchSweep` from a copy of it: the
on-policy baseline, then a bfloat16 sampler, samplers 1, 4 and 16 optimizer
updates stale and top-p 0.8 sampling, each uncorrected and with TRL's
``token_truncate`` and ``sequence_mask`` corrections (60 GRPO steps, held-out
accuracy every 20 steps on 300 problems). Each uncorrected run ends with a
measurement of its sampler against its policy (per-token log-ratios, sequence
log-ratio by length, ESS; top-p: the nucleus mass). The per-seed results and the
summary (:func:`~grpo_tutorial.chapters.mismatch_lab.summarize_mismatch`) go into
ONE file in the package data, ``grpo_tutorial/data/sampler_mismatch.json``, with
the command, the package commit, the wall time and the machine's load.

Expected wall time of the full run (6 seeds x 16 settings, ``--jobs 2``) on the
book's 2-core CPU with nothing else running: about 30 minutes (:data:`EXPECTED`:
on one core, with the 1-minute load at 1-2, one GRPO step took 0.34-0.50 s
depending on the sampler, seed 0's warm start 34 s (up to about 75 s for
other seeds and loads), so a seed is about 16 x 30 s of runs, evaluations and
measurements included, plus its warm start, and the seeds run two at a time,
in three rounds). ``--jobs N`` (default 2) runs seeds in
parallel processes (the numbers do not change, only the wall time). ``--quick``
is a seconds-long smoke run of the test recipe that proves nothing.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RecordRun, add_record_arguments, run_seeds  # noqa: E402
from grpo_tutorial.chapters.mismatch_lab import MismatchSweep, run_sweep_seed, summarize_mismatch  # noqa: E402
from grpo_tutorial.chapters.recipes import TinyAdditionRecipe  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "grpo_tutorial" / "data" / "sampler_mismatch.json"
#: The full run's wall time, extrapolated from one step of each sampler timed on the book's CPU.
EXPECTED = "about 30 minutes for 6 seeds with --jobs 2 on 2 idle cores (at most about 40 on a loaded machine)"


def sweep_for(args: argparse.Namespace) -> MismatchSweep:
    if args.quick:
        recipe = TinyAdditionRecipe.quick(grpo_steps=args.steps or 4, eval_every=2)
        return MismatchSweep(recipe=recipe, samplers=("bfloat16", "stale k=1", "top_p=0.8"),
                             modes=("none", "sequence_mask"), measure_batches=1, seeds=tuple(args.seeds or (0,)))
    default = MismatchSweep()
    recipe = default.recipe
    if args.steps:
        recipe = recipe.with_settings(grpo_steps=args.steps)
    grids = {name: tuple(getattr(args, name)) for name in ("samplers", "modes") if getattr(args, name) is not None}
    return MismatchSweep(recipe=recipe, seeds=tuple(args.seeds or default.seeds), **grids)


def _one_seed(sweep: MismatchSweep, seed: int, progress: bool = False, only: list[str] | None = None) -> dict:
    def report(name: str, result: dict) -> None:
        ess = result["mismatch_curves"].get("mismatch/ess")
        extra = f"  ess {sum(ess) / len(ess):.3f}" if ess else ""
        print(f"  seed {seed} {name:<30} held-out {result['final_accuracy']:.3f} "
              f"(gain {result['gain']:+.3f}){extra}  {result['seconds_per_step']:.2f} s/step", flush=True)

    return run_sweep_seed(sweep, seed, only=only, on_setting=report)


def build_parser() -> argparse.ArgumentParser:
    """The command line; tests/test_records.py parses the record's command with it."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mismatch", description=__doc__.split("\n\n")[0],
                                     epilog=f"Expected wall time of the full run: {EXPECTED}.")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default 0 1 2 3 4 5)")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default the sweep's 60)")
    parser.add_argument("--only", nargs="+", default=None, help="run only these settings (by name)")
    parser.add_argument("--samplers", nargs="+", default=None,
                        help="samplers (default bfloat16 'stale k=1' 'stale k=4' 'stale k=16' top_p=0.8)")
    parser.add_argument("--modes", nargs="+", default=None,
                        help="corrections, 'none' first (default none token_truncate sequence_mask)")
    add_record_arguments(parser, DEFAULT_OUT)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    sweep = sweep_for(args)
    with RecordRun("python -m benchmarks.mismatch", argv) as run:
        print(f"{run.command}: {len(sweep.seeds)} seeds x {len(sweep.settings())} settings x "
              f"{sweep.recipe.grpo_steps} steps, jobs={args.jobs}\n  {run.uptime_start}", flush=True)
        seeds = run_seeds(sweep.seeds, functools.partial(_one_seed, sweep, only=args.only), jobs=args.jobs,
                          progress=not args.no_progress, run=run)
    out = {**run.header(quick=args.quick, jobs=args.jobs, threads=sweep.recipe.num_threads or 1),
           "sweep": sweep.to_dict(), "summary": summarize_mismatch(seeds), "seeds": seeds}
    run.write(args.out, out)
    wall = out["wall_seconds"]
    print(f"\nwall time {wall / 60:.1f} min; {out['load']['uptime_end']}")
    print(f"{'setting':<32}{'final acc':>10}{'95% CI':>18}{'vs policy':>11}{'collapsed':>10}{'ess':>7}{'s/step':>8}")
    for name, e in out["summary"]["settings"].items():
        acc, vs = e["final_accuracy"], e.get("vs_policy")
        ess = e["mismatch"].get("mismatch/ess", float("nan"))
        print(f"{name:<32}{acc['mean']:10.3f} [{acc['lo']:6.3f}, {acc['hi']:6.3f}]"
              f"{vs['mean'] if vs else 0.0:+11.3f}{e['collapsed']:>6}/{e['runs']:<3}{ess:7.3f}"
              f"{e['seconds_per_step']:8.2f}")
    for name, m in out["summary"]["samplers"].items():
        extra = f", nucleus mass {m['nucleus_mass_mean']:.4f}" if "nucleus_mass_mean" in m else ""
        print(f"{name:<12} |log pi/mu| per token {m['log_ratio_abs_mean']:.2e}, mean ratio {m['ratio_mean']:.4f}"
              f"{extra}, ESS {m['diagnostics']['mismatch/ess']:.3f}")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()

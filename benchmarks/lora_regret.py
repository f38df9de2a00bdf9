"""``python -m benchmarks.lora_regret``: the LoRA chapter's experiment, full fine-tuning against LoRA adapters.

For each seed, one warm start (chapter 8's recipe), then every setting of
:class:`grpo_tutorial.chapters.low_rank.LowRankSweep` from a copy of it: full
fine-tuning over a learning-rate grid, LoRA on every linear layer at ranks 1, 4 and
16 over the same grid shifted up (``lora_alpha`` fixed), and LoRA on attention only
at a matched count of trained parameters. The per-seed results and the summary
(:func:`~grpo_tutorial.chapters.low_rank.summarize_sweep`) go into ONE file in the
package data, ``grpo_tutorial/data/lora_regret.json``, with the command, the
package commit, the wall time and the machine's load.

``--jobs N`` (default 2) runs seeds in parallel processes (the numbers do not
change, only the wall time). ``--quick`` is a seconds-long smoke run of the test
recipe that proves nothing.
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
from grpo_tutorial.chapters.low_rank import LowRankSweep, run_sweep_seed, summarize_sweep  # noqa: E402
from grpo_tutorial.chapters.recipes import TinyAdditionRecipe  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "grpo_tutorial" / "data" / "lora_regret.json"


def sweep_for(args: argparse.Namespace) -> LowRankSweep:
    if args.quick:
        recipe = TinyAdditionRecipe.quick(grpo_steps=args.steps or 4, eval_every=2)
        return LowRankSweep(recipe=recipe, full_lrs=(1e-3,), lora_lrs=(1e-2,), ranks=(1, 4), matched_rank=1,
                            seeds=tuple(args.seeds or (0,)))
    default = LowRankSweep()
    recipe = default.recipe
    if args.steps:
        recipe = recipe.with_settings(grpo_steps=args.steps)
    grids = {name: tuple(getattr(args, name)) for name in ("full_lrs", "lora_lrs", "ranks", "attention_lrs")
             if getattr(args, name) is not None}
    return LowRankSweep(recipe=recipe, seeds=tuple(args.seeds or default.seeds), **grids)


def _one_seed(sweep: LowRankSweep, seed: int, progress: bool = False, only: list[str] | None = None) -> dict:
    def report(name: str, result: dict) -> None:
        print(f"  seed {seed} {name:<22} held-out {result['final_accuracy']:.3f} "
              f"(gain {result['gain']:+.3f})  {result['seconds_per_step']:.2f} s/step", flush=True)

    return run_sweep_seed(sweep, seed, only=only, on_setting=report)


def build_parser() -> argparse.ArgumentParser:
    """The command line; tests/test_records.py parses the record's command with it."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lora_regret", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default 0 1 2 3 4)")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default the sweep's 80)")
    parser.add_argument("--only", nargs="+", default=None, help="run only these settings (by name)")
    parser.add_argument("--full-lrs", type=float, nargs="*", default=None,
                        help="full fine-tuning's learning rates (default 3e-5 1e-4 3e-4 1e-3; none: no full runs)")
    parser.add_argument("--lora-lrs", type=float, nargs="*", default=None,
                        help="LoRA's learning rates (default 3e-4 1e-3 3e-3 1e-2)")
    parser.add_argument("--ranks", type=int, nargs="*", default=None, help="LoRA ranks (default 1 4 16)")
    parser.add_argument("--attention-lrs", type=float, nargs="*", default=None,
                        help="attention-only LoRA's learning rates (default: --lora-lrs'; none: no such runs)")
    add_record_arguments(parser, DEFAULT_OUT)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    sweep = sweep_for(args)
    with RecordRun("python -m benchmarks.lora_regret", argv) as run:
        print(f"{run.command}: {len(sweep.seeds)} seeds x {sweep.recipe.grpo_steps} steps, jobs={args.jobs}\n"
              f"  {run.uptime_start}", flush=True)
        seeds = run_seeds(sweep.seeds, functools.partial(_one_seed, sweep, only=args.only), jobs=args.jobs,
                          progress=not args.no_progress, run=run)
    out = {**run.header(quick=args.quick, jobs=args.jobs, threads=sweep.recipe.num_threads or 1),
           "sweep": sweep.to_dict(), "summary": summarize_sweep(seeds), "seeds": seeds}
    run.write(args.out, out)
    wall = out["wall_seconds"]
    print(f"\nwall time {wall / 60:.1f} min; {out['load']['uptime_end']}")
    print(f"{'setting':<24}{'final acc':>10}{'95% CI':>18}{'gain':>8}{'params':>9}{'s/step':>8}")
    for name, e in out["summary"]["settings"].items():
        acc = e["final_accuracy"]
        print(f"{name:<24}{acc['mean']:10.3f} [{acc['lo']:6.3f}, {acc['hi']:6.3f}]{e['gain']['mean']:+8.3f}"
              f"{e['trained_parameters']:9d}{e['seconds_per_step']:8.2f}")
    for family, best in out["summary"]["families"].items():
        vs = best.get("vs_full")
        extra = f", vs full {vs['mean']:+.3f} [{vs['lo']:+.3f}, {vs['hi']:+.3f}]" if vs else ""
        print(f"best {family}: lr {best['learning_rate']:g}{extra}")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()

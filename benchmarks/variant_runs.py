"""The runner behind chapters 13's and 16's records: every variant for several seeds, from one warm start per seed.

For each seed, one warm start (the chapter's ``warm_start``), then every variant
from a copy of it for the same number of steps, with the chapter's held-out
statistics every ``eval_every`` steps. The per-seed results and the summary across
seeds (mean and 95% t interval at every point of every curve, and each variant's
final values against the baseline's, paired by seed) go into ONE file inside the
package data, which the chapter reads. The file also records the command, the
package commit, the CPU, the wall time and the machine's load.

``--jobs N`` (default 2) runs warm starts, and each seed's (seed, variant) runs as soon
as its warm start is done, in parallel processes; every run is independent of the
others, so the numbers are the same whatever N is, only the wall time changes.
``--cache DIR`` keeps each warm start and each finished run in DIR; run the same
command again after an interruption and it picks up what is there (refusing a cache
made with another recipe). ``--quick`` is a seconds-long smoke run of the test recipe
that proves nothing.

A chapter describes itself with a :class:`Chapter` (``benchmarks/thinking.py``,
``benchmarks/tool_use.py``); nothing else differs between the two records' commands.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks.common import RecordRun, add_record_arguments, open_cache, write_atomic
from grpo_tutorial.run.progress import progress_bar

DATA_DIR = Path(__file__).resolve().parent.parent / "grpo_tutorial" / "data"


@dataclass(frozen=True)
class Chapter:
    """What a chapter's record command runs (module-level functions, so that worker processes can get them).

    Attributes:
        command: ``python -m benchmarks.<name>``. recipe: the recipe class (``quick()``, ``to_dict()``,
        ``grpo_steps``, ``num_threads``). make_data, build_model, warm_start, run_variant, summarize:
        the chapter module's functions. variants: its VARIANTS (name -> (description, changes, third)),
        ``third`` recorded as ``third_name``. out: the record's file. warm_start_file, save_warm_start:
        where seed 0's warm start is published, and how (None: not published).
        history_keys: the trainer's history keys kept per step. style: the curve key printed beside accuracy.
    """

    command: str
    recipe: type
    make_data: Callable
    build_model: Callable
    warm_start: Callable
    run_variant: Callable
    summarize: Callable
    variants: dict
    third_name: str
    out: Path
    history_keys: tuple[str, ...]
    style: str
    warm_start_file: Path | None = None
    save_warm_start: Callable | None = None


def _warm(chapter: Chapter, recipe: Any, seed: int, folder: str, publish: tuple[str, dict] | None) -> dict:
    """Phase 1 (one process): the seed's warm start, saved for the variants to copy (and,
    with ``publish``, as ``(path, metadata)``, into the package data)."""
    torch.set_num_threads(recipe.num_threads or torch.get_num_threads())
    data = chapter.make_data(recipe)
    model, tokenizer = chapter.build_model(recipe, seed)
    cached = Path(folder) / f"warm_{seed}.json"
    if cached.exists():  # an earlier, interrupted run of the same command made it
        info = json.loads(cached.read_text())
        model.load_state_dict(torch.load(Path(folder) / f"warm_{seed}.pt"))
    else:
        info = chapter.warm_start(model, tokenizer, data, recipe, seed, progress=False)
        torch.save(model.state_dict(), Path(folder) / f"warm_{seed}.pt")
        write_atomic(cached, json.dumps(info))  # NaN kept as NaN
    if publish is not None:
        info["published"] = {"file": Path(publish[0]).name,
                             "sha256": chapter.save_warm_start(model, publish[0], publish[1])}
    return {"seed": seed, **info}


def _variant(chapter: Chapter, recipe: Any, seed: int, variant: str, folder: str) -> dict:
    """Phase 2 (one process): one variant from the seed's warm start."""
    cached = Path(folder) / f"run_{seed}_{variant}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    torch.set_num_threads(recipe.num_threads or torch.get_num_threads())
    data = chapter.make_data(recipe)
    model, tokenizer = chapter.build_model(recipe, seed)
    model.load_state_dict(torch.load(Path(folder) / f"warm_{seed}.pt"))
    result = chapter.run_variant(variant, model, tokenizer, data, recipe, seed)
    history = [{k: row[k] for k in chapter.history_keys if k in row} for row in result["history"]]
    run = {"seed": seed, "variant": variant, "curve": result["curve"], "history": history,
           "seconds": result["seconds"]}
    write_atomic(cached, json.dumps(run))
    return run


def build_parser(chapter: Chapter, description: str) -> argparse.ArgumentParser:
    """The command line; tests/test_records.py parses each record's command with it."""
    parser = argparse.ArgumentParser(prog=chapter.command, description=description)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="seeds (default 0-4)")
    parser.add_argument("--variants", nargs="+", default=list(chapter.variants), choices=list(chapter.variants))
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default: the recipe's)")
    add_record_arguments(parser, chapter.out, jobs_help="parallel processes")
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep warm starts and finished runs here, and reuse them (default: a temporary folder)")
    if chapter.warm_start_file is not None:
        parser.add_argument("--warm-start-out", type=Path, default=None,
                            help=f"where seed 0's warm start goes (default: {chapter.warm_start_file} for a full "
                                 "run, nowhere with --quick)")
    return parser


def recipe_for(chapter: Chapter, args: argparse.Namespace) -> Any:
    """The recipe a command line asks for: the chapter's (or its quick one), with ``--steps``."""
    recipe = chapter.recipe.quick() if args.quick else chapter.recipe()
    if args.steps:
        recipe = dataclasses.replace(recipe, grpo_steps=args.steps)
    return recipe


def main(chapter: Chapter, description: str, argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser(chapter, description).parse_args(argv)
    recipe = recipe_for(chapter, args)
    run = RecordRun(chapter.command, argv)
    print(f"{run.command}: {len(args.seeds)} seeds x {len(args.variants)} variants x "
          f"{recipe.grpo_steps} steps, jobs={args.jobs}\n  {run.uptime_start}", flush=True)
    warm: dict[int, dict] = {}
    runs: dict[tuple[int, str], dict] = {}
    with run, contextlib.ExitStack() as stack, futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        folder = open_cache(args.cache, recipe, stack)
        bar = progress_bar(total=len(args.seeds) * (1 + len(args.variants)), desc="runs",
                           enabled=not args.no_progress)
        warm_out = getattr(args, "warm_start_out", None) or (
            None if args.quick or chapter.warm_start_file is None else chapter.warm_start_file)
        tags = {"command": run.command, "package_commit": str(run.code.get("package_commit")),
                "seed": "0", "recipe": json.dumps(recipe.to_dict())}
        publish = {s: (str(warm_out), tags) if warm_out is not None and s == 0 else None for s in args.seeds}
        pending = {pool.submit(_warm, chapter, recipe, s, folder, publish[s]) for s in args.seeds}
        while pending:
            finished, pending = futures.wait(pending, return_when=futures.FIRST_COMPLETED)
            for done in finished:
                out = done.result()
                bar.update(1)
                if "variant" not in out:  # a warm start: its seed's variants can start
                    warm[out["seed"]] = out
                    print(f"seed {out['seed']} warm start: {out['steps']} steps, {out['seconds']:.0f} s, "
                          f"probe {out['probe'][-1][1]:.3f}", flush=True)
                    pending |= {pool.submit(_variant, chapter, recipe, out["seed"], v, folder) for v in args.variants}
                    continue
                runs[out["seed"], out["variant"]] = out
                last = out["curve"][-1]
                print(f"seed {out['seed']} {out['variant']:14s} accuracy {last['accuracy']:.3f} {chapter.style} "
                      f"{last[chapter.style]:.3f} length {last['length']:5.1f}  {out['seconds']:6.0f} s "
                      f"(total {run.elapsed():.0f} s)", flush=True)
        bar.close()
    seeds = [{"seed": s, "warm_start": warm[s],
              "variants": {v: {k: runs[s, v][k] for k in ("curve", "history", "seconds")} for v in args.variants}}
             for s in args.seeds]
    header = run.header(quick=args.quick, jobs=args.jobs, threads=recipe.num_threads or 1,
                        cpu_capability=torch.backends.cpu.get_cpu_capability())
    out = {
        **header,
        "recipe": recipe.to_dict(),
        "variants": {v: {"description": chapter.variants[v][0], "changes": chapter.variants[v][1],
                         chapter.third_name: chapter.variants[v][2]} for v in args.variants},
        "summary": chapter.summarize(seeds),
        "seeds": seeds,
    }
    run.write(args.out, out, indent=None)
    print(f"\nwall time {out['wall_seconds'] / 60:.1f} min; {out['load']['uptime_end']}")
    for v, entry in out["summary"].items():
        acc, style, length = entry["accuracy"][-1], entry[chapter.style][-1], entry["length"][-1]
        print(f"{v:14s} accuracy {acc['mean']:.3f} [{acc['lo']:.3f}, {acc['hi']:.3f}]  {chapter.style} "
              f"{style['mean']:.3f}  length {length['mean']:5.1f}")
    print(f"wrote {args.out}")
    return out


def command(chapter: Chapter, doc: str) -> tuple[Callable, Callable, Callable]:
    """A chapter's ``build_parser()``, ``main(argv=None)`` and ``recipe_for(args)`` (the recipe a parsed command
    line asks for), its description the first paragraph of ``doc``."""
    description = doc.split("\n\n")[0]
    return ((lambda: build_parser(chapter, description)), (lambda argv=None: main(chapter, description, argv)),
            (lambda args: recipe_for(chapter, args)))

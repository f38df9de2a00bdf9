"""``python -m benchmarks.thinking``: chapter 13's runs, every variant for several seeds.

For each seed, one warm start (:func:`grpo_tutorial.chapters.thinking.warm_start`),
then every variant of :data:`~grpo_tutorial.chapters.thinking.VARIANTS` from a copy
of it for the same number of steps, with the held-out statistics every
``eval_every`` steps. The per-seed results and the summary across seeds (mean and
95% t interval at every point of every curve, and each variant's final values
against GRPO's, paired by seed) go into ONE file inside the package data,
``grpo_tutorial/data/thinking_results.json``, which chapter 13 reads. The file also
records the command, the package commit, the CPU, the wall time and the machine's load.

``--jobs N`` (default 2) runs warm starts, and each seed's (seed, variant) runs as soon
as its warm start is done, in parallel processes; every run is independent of the
others, so the numbers are the same whatever N is, only the wall time changes.
``--cache DIR`` keeps each warm start and each finished run in DIR; run the same
command again after an interruption and it picks up what is there (refusing a cache
made with another recipe). ``--quick`` is a seconds-long smoke run of the test recipe
that proves nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import contextlib
import dataclasses
import datetime as dt
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks.common import LoadSampler, load_average, machine, package_commit  # noqa: E402
from benchmarks.lab import json_safe, uptime  # noqa: E402
from grpo_tutorial.chapters.thinking import (  # noqa: E402
    VARIANTS, WARM_START_FILE, ThinkingRecipe, build_thinking_model, make_thinking_data, run_variant, save_warm_start, summarize_thinking,
    warm_start,
)
from grpo_tutorial.run.progress import progress_bar  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent.parent / "grpo_tutorial" / "data"
DEFAULT_OUT = DATA_DIR / "thinking_results.json"
DEFAULT_WARM_START = DATA_DIR / WARM_START_FILE

#: The trainer's history keys kept per step (the rest stays out of the package data).
HISTORY_KEYS = ("step", "reward_mean", "accuracy", "completion_len_mean", "frac_zero_std", "frac_truncated",
                "entropy")


def recipe_for(args: argparse.Namespace) -> ThinkingRecipe:
    recipe = ThinkingRecipe.quick() if args.quick else ThinkingRecipe()
    if args.steps:
        recipe = dataclasses.replace(recipe, grpo_steps=args.steps)
    return recipe


def _warm(recipe: ThinkingRecipe, seed: int, folder: str, publish: tuple[str, dict] | None) -> dict:
    """Phase 1 (one process): the seed's warm start, saved for the variants to copy (and,
    with ``publish``, as ``(path, metadata)``, into the package data)."""
    torch.set_num_threads(recipe.num_threads or torch.get_num_threads())
    data = make_thinking_data(recipe)
    model, tokenizer = build_thinking_model(recipe, seed)
    cached = Path(folder) / f"warm_{seed}.json"
    if cached.exists():  # an earlier, interrupted run of the same command made it
        info = json.loads(cached.read_text())
        model.load_state_dict(torch.load(Path(folder) / f"warm_{seed}.pt"))
    else:
        info = warm_start(model, tokenizer, data, recipe, seed, progress=False)
        torch.save(model.state_dict(), Path(folder) / f"warm_{seed}.pt")
        _write_atomic(cached, json.dumps(info))  # NaN kept as NaN
    if publish is not None:
        info["published"] = {"file": Path(publish[0]).name, "sha256": save_warm_start(model, publish[0], publish[1])}
    return {"seed": seed, **info}


def _variant(recipe: ThinkingRecipe, seed: int, variant: str, folder: str) -> dict:
    """Phase 2 (one process): one variant from the seed's warm start."""
    cached = Path(folder) / f"run_{seed}_{variant}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    torch.set_num_threads(recipe.num_threads or torch.get_num_threads())
    data = make_thinking_data(recipe)
    model, tokenizer = build_thinking_model(recipe, seed)
    model.load_state_dict(torch.load(Path(folder) / f"warm_{seed}.pt"))
    result = run_variant(variant, model, tokenizer, data, recipe, seed)
    history = [{k: row[k] for k in HISTORY_KEYS if k in row} for row in result["history"]]
    run = {"seed": seed, "variant": variant, "curve": result["curve"], "history": history,
           "seconds": result["seconds"]}
    _write_atomic(cached, json.dumps(run))
    return run


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _open_cache(cache: Path | None, recipe: ThinkingRecipe, stack: contextlib.ExitStack) -> str:
    """The folder for warm starts and finished runs: ``cache`` (checked against the
    recipe it was made with) or a temporary one."""
    if cache is None:
        return stack.enter_context(tempfile.TemporaryDirectory())
    cache.mkdir(parents=True, exist_ok=True)
    stamp, made = cache / "recipe.json", json.dumps(recipe.to_dict(), sort_keys=True)
    if stamp.exists() and stamp.read_text() != made:
        raise SystemExit(f"error: {cache} holds runs of another recipe; give another --cache or empty it")
    stamp.write_text(made)
    return str(cache)


def build_parser() -> argparse.ArgumentParser:
    """The command line; tests/test_records.py parses the record's command with it."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.thinking", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="seeds (default 0-4)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default: the recipe's)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    parser.add_argument("--quick", action="store_true", help="the seconds-long test recipe (proves nothing)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="default: %(default)s")
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep warm starts and finished runs here, and reuse them (default: a temporary folder)")
    parser.add_argument("--warm-start-out", type=Path, default=None,
                        help=f"where seed 0's warm start goes (default: {DEFAULT_WARM_START} for a full run, "
                             "nowhere with --quick)")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    code = package_commit()  # at the start: the code that runs, whatever changes while it runs
    recipe = recipe_for(args)
    command = "python -m benchmarks.thinking " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    started = dt.datetime.now(dt.timezone.utc)
    uptime_start = uptime()
    print(f"{command.strip()}: {len(args.seeds)} seeds x {len(args.variants)} variants x "
          f"{recipe.grpo_steps} steps, jobs={args.jobs}\n  {uptime_start}", flush=True)
    t0 = time.perf_counter()
    warm: dict[int, dict] = {}
    runs: dict[tuple[int, str], dict] = {}
    with LoadSampler(every=10.0) as sampler, contextlib.ExitStack() as stack, \
            futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        folder = _open_cache(args.cache, recipe, stack)
        bar = progress_bar(total=len(args.seeds) * (1 + len(args.variants)), desc="runs",
                           enabled=not args.no_progress)
        warm_out = args.warm_start_out or (None if args.quick else DEFAULT_WARM_START)
        tags = {"command": command.strip(), "package_commit": str(code.get("package_commit")),
                "seed": "0", "recipe": json.dumps(recipe.to_dict())}
        publish = {s: (str(warm_out), tags) if warm_out is not None and s == 0 else None for s in args.seeds}
        pending = {pool.submit(_warm, recipe, s, folder, publish[s]) for s in args.seeds}
        while pending:
            finished, pending = futures.wait(pending, return_when=futures.FIRST_COMPLETED)
            for done in finished:
                out = done.result()
                bar.update(1)
                if "variant" not in out:  # a warm start: its seed's variants can start
                    warm[out["seed"]] = out
                    print(f"seed {out['seed']} warm start: {out['steps']} steps, {out['seconds']:.0f} s, "
                          f"probe worked out {out['probe'][-1][1]:.3f}", flush=True)
                    pending |= {pool.submit(_variant, recipe, out["seed"], v, folder) for v in args.variants}
                    continue
                runs[out["seed"], out["variant"]] = out
                last = out["curve"][-1]
                print(f"seed {out['seed']} {out['variant']:14s} accuracy {last['accuracy']:.3f} worked "
                      f"{last['worked_share']:.3f} length {last['length']:5.1f}  {out['seconds']:6.0f} s "
                      f"(total {time.perf_counter() - t0:.0f} s)", flush=True)
        bar.close()
    wall = time.perf_counter() - t0
    seeds = [{"seed": s, "warm_start": warm[s],
              "variants": {v: {k: runs[s, v][k] for k in ("curve", "history", "seconds")} for v in args.variants}}
             for s in args.seeds]
    out = {
        "created": started.isoformat(timespec="seconds"),
        "command": command.strip(),
        **code,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "quick": args.quick,
        "wall_seconds": wall,
        "jobs": args.jobs,
        "load": {"uptime_start": uptime_start, "uptime_end": uptime(), "during": sampler.summary(),
                 "end": load_average()},
        "machine": machine(recipe.num_threads or 1),
        "recipe": recipe.to_dict(),
        "variants": {v: {"description": VARIANTS[v][0], "changes": VARIANTS[v][1], "reward": VARIANTS[v][2]}
                     for v in args.variants},
        "summary": summarize_thinking(seeds),
        "seeds": seeds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(json_safe(out), indent=None, allow_nan=False) + "\n")
    print(f"\nwall time {wall / 60:.1f} min; {out['load']['uptime_end']}")
    for v, entry in out["summary"].items():
        acc, share, length = entry["accuracy"][-1], entry["worked_share"][-1], entry["length"][-1]
        print(f"{v:14s} accuracy {acc['mean']:.3f} [{acc['lo']:.3f}, {acc['hi']:.3f}]  worked "
              f"{share['mean']:.3f}  length {length['mean']:5.1f}")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()

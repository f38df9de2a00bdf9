"""``python -m benchmarks.no_critic``: chapter 17's runs, every method for several seeds (first version).

For each seed, chapter 13's warm start (seed 0 and the default recipe: the shipped
one, :func:`~grpo_tutorial.chapters.thinking.load_warm_start`; any other: made with
:func:`~grpo_tutorial.chapters.thinking.warm_start`), then every method of
:data:`~grpo_tutorial.chapters.no_critic.METHODS` from a copy of it, each in its own
process (``--jobs``), with the held-out statistics every ``eval_every`` steps. The
runs and the summary across seeds (:func:`~grpo_tutorial.chapters.no_critic.summarize_methods`)
go into one JSON file with the command, the package commit and the machine.
``--mc-prompts`` gives the Monte Carlo method fewer prompts per step, to match the
sampled tokens (its extra rollouts are counted in every row). ``--n-test`` measures
the curves on the first this many of the recipe's held-out problems (the warm start,
its probe and its training rows stay chapter 13's). ``--cache DIR`` keeps each warm
start and each finished run, and a second run of the same command picks up what is
there (:mod:`benchmarks.variant_runs`' folder, refused when made with other settings);
the record keeps the machine's load as the other records do. ``--quick`` is a
seconds-long smoke run of chapter 13's test recipe that proves nothing.

Not :mod:`benchmarks.variant_runs`' :class:`~benchmarks.variant_runs.Chapter` runner:
a run here keeps what that runner drops (the parameters, the training bytes, the
critic's passes) and takes the methods' own settings; it shares its cache folder,
its atomic writes and the load sampler.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks.common import RecordRun, open_cache, write_atomic  # noqa: E402
from grpo_tutorial.chapters.no_critic import METHODS, run_method, summarize_methods  # noqa: E402
from grpo_tutorial.chapters.thinking import (  # noqa: E402
    ThinkingRecipe, build_thinking_model, load_warm_start, make_thinking_data, warm_start,
)
from grpo_tutorial.ppo import PPOSettings  # noqa: E402
from grpo_tutorial.ppo.vine import MonteCarloSettings  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "grpo_tutorial" / "data" / "no_critic_results.json"


def recipe_for(args: argparse.Namespace) -> ThinkingRecipe:
    recipe = ThinkingRecipe.quick() if args.quick else ThinkingRecipe()
    changes = {k: v for k, v in (("grpo_steps", args.steps), ("eval_every", args.eval_every)) if v is not None}
    return dataclasses.replace(recipe, **changes)


def _warm_part(recipe: ThinkingRecipe) -> dict:
    """What the warm start depends on: the recipe less the RL phase's settings."""
    return {k: v for k, v in recipe.to_dict().items() if k not in ("grpo", "grpo_steps", "eval_every", "num_threads")}


def start_of(recipe: ThinkingRecipe, seed: int, folder: str) -> dict:
    """One process: seed ``seed``'s warm start, saved in ``folder`` for its methods to copy."""
    cached = Path(folder) / f"warm_{seed}.json"
    if cached.exists():  # an earlier, interrupted run of the same command made it
        return {"seed": seed, "warm_start": json.loads(cached.read_text())}
    torch.set_num_threads(recipe.num_threads or torch.get_num_threads())
    t0 = time.perf_counter()
    if seed == 0 and _warm_part(recipe) == _warm_part(ThinkingRecipe()):
        model, _ = load_warm_start(recipe)
        info = {"shipped": True}
    else:
        model, tokenizer = build_thinking_model(recipe, seed)
        info = {"shipped": False, **warm_start(model, tokenizer, make_thinking_data(recipe), recipe, seed,
                                               progress=False)}
    torch.save(model.state_dict(), Path(folder) / f"warm_{seed}.pt")
    info = {**info, "seconds": time.perf_counter() - t0}
    write_atomic(cached, json.dumps(info))  # NaN kept as NaN
    return {"seed": seed, "warm_start": info}


def run_from_state(recipe: ThinkingRecipe, seed: int, method: str, state: dict, settings: dict) -> dict:
    """``method`` for seed ``seed`` from the warm start's weights ``state``, with the record's ``settings``
    (:func:`settings_for`); the run without its model. tests/test_records.py re-runs the record's first steps
    with it."""
    model, tokenizer = build_thinking_model(recipe, seed)
    model.load_state_dict(state)
    data = make_thinking_data(recipe)
    if settings.get("n_test"):
        data = {**data, "test": data["test"][:settings["n_test"]]}
    changes = {"prompts_per_step": settings["mc_prompts"]} if method == "monte_carlo" and settings["mc_prompts"] else {}
    run = run_method(method, model, tokenizer, data, recipe, seed,
                     ppo=PPOSettings(**settings["ppo"]), monte_carlo=MonteCarloSettings(**settings["monte_carlo"]),
                     changes=changes)
    run.pop("model")
    return run


def one_run(recipe: ThinkingRecipe, seed: int, method: str, folder: str, settings: dict) -> dict:
    """One process: ``method`` from seed ``seed``'s warm start, kept in ``folder``."""
    cached = Path(folder) / f"run_{seed}_{method}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    torch.set_num_threads(recipe.num_threads or torch.get_num_threads())
    run = run_from_state(recipe, seed, method, torch.load(Path(folder) / f"warm_{seed}.pt"), settings)
    write_atomic(cached, json.dumps(run))
    return run


def settings_for(args: argparse.Namespace) -> dict:
    """The methods' settings a command line asks for, as the record keeps them."""
    return {"ppo": {"value_lr": args.value_lr, "value_model": args.value_model},
            "monte_carlo": {"num_prefixes": args.prefixes, "rollouts_per_prefix": args.rollouts},
            "mc_prompts": args.mc_prompts, "n_test": args.n_test}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.no_critic", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: the recipe's)")
    parser.add_argument("--eval-every", type=int, default=None, help="held-out points (default: the recipe's)")
    parser.add_argument("--value-lr", type=float, default=PPOSettings().value_lr)
    parser.add_argument("--value-model", default="separate", choices=["separate", "head"])
    parser.add_argument("--prefixes", type=int, default=2, help="M of the Monte Carlo values")
    parser.add_argument("--rollouts", type=int, default=2, help="K of the Monte Carlo values")
    parser.add_argument("--mc-prompts", type=int, default=None, help="the Monte Carlo method's prompts per step")
    parser.add_argument("--n-test", type=int, default=None,
                        help="held-out problems of the curves: the first this many of the recipe's (default: all)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep warm starts and finished runs here, and reuse them (default: a temporary folder)")
    parser.add_argument("--quick", action="store_true", help="the seconds-long test recipe (proves nothing)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    recipe = recipe_for(args)
    run = RecordRun("python -m benchmarks.no_critic", argv)
    settings = settings_for(args)
    print(f"{run.command}\n  {run.uptime_start}", flush=True)
    starts, runs = {}, []
    stamp = SimpleNamespace(to_dict=lambda: {"recipe": recipe.to_dict(), "settings": settings})
    with run, contextlib.ExitStack() as stack, futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        folder = open_cache(args.cache, stamp, stack)
        pending = {pool.submit(start_of, recipe, s, folder) for s in args.seeds}
        while pending:
            finished, pending = futures.wait(pending, return_when=futures.FIRST_COMPLETED)
            for done in finished:
                out = done.result()
                if "method" not in out:  # a warm start: its methods can start
                    starts[out["seed"]] = out["warm_start"]
                    pending |= {pool.submit(one_run, recipe, out["seed"], m, folder, settings) for m in args.methods}
                    continue
                runs.append(out)
                print(f"seed {out['seed']} {out['method']:12s} accuracy {out['curve'][-1]['accuracy']:.3f} "
                      f"{out['seconds']:6.0f} s (total {run.elapsed():.0f} s)", flush=True)
    runs.sort(key=lambda r: (r["seed"], list(METHODS).index(r["method"])))
    header = run.header(quick=args.quick, jobs=args.jobs, threads=recipe.num_threads or 1,
                        cpu_capability=torch.backends.cpu.get_cpu_capability())
    out = {
        **header, "recipe": recipe.to_dict(), "settings": settings,
        "methods": {m: METHODS[m][0] for m in args.methods}, "warm_starts": starts,
        "summary": summarize_methods(runs), "runs": runs,
    }
    run.write(args.out, out, indent=None)
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()

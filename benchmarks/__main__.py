"""``python -m benchmarks``: run the benchmarks, print a table, write benchmarks/results.json."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from . import common

PARTS = ("rollout", "train", "mfu", "sweep")
MODELS = ("tiny", "smollm2-135m-instruct")
SMOLLM2 = "smollm2-135m-instruct"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmarks of grpo_tutorial (and TRL's GRPOTrainer): rollout throughput, "
        "train-step seconds, peak memory and MFU. Prints a table and writes a JSON file.",
    )
    parser.add_argument("--quick", action="store_true", help="smaller and fewer repeats: a smoke run of every part")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--models", default=",".join(MODELS), help="models of the train-step part (default: both)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats of each measurement (default 3, quick 2)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternating rounds of the two trainers in the train part (default 2, quick 1)")
    parser.add_argument("--threads", default="1,2",
                        help="torch thread counts, comma-separated; parts rollout, train and mfu run once per "
                        "count (default: %(default)s)")
    parser.add_argument("--sweep-threads", type=int, default=1, help="torch threads of the sweep (default: 1)")
    parser.add_argument("--out", type=Path, default=common.RESULTS, help="where to write the JSON (default: %(default)s)")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        parser.error(f"--parts must name some of {list(PARTS)}, got {args.parts!r}")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
        parser.error(f"--models must name some of {list(MODELS)}, got {args.models!r}")
    args.parts, args.models = parts, models
    args.repeats = args.repeats or (2 if args.quick else 3)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    args.rounds = args.rounds or (1 if args.quick else 2)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    try:
        args.threads = [int(x) for x in str(args.threads).split(",") if x.strip()]
    except ValueError:
        parser.error(f"--threads must be comma-separated ints, got {args.threads!r}")
    if not args.threads or min(args.threads) < 1 or args.sweep_threads < 1:
        parser.error("--threads and --sweep-threads must be >= 1")
    return args


# ---------------------------------------------------------------------------
# The parts
# ---------------------------------------------------------------------------


def part_rollout(args: argparse.Namespace, policies: dict) -> dict[str, Any]:
    from .rollout import run

    model, tokenizer = policies[SMOLLM2]
    return run(
        model, tokenizer, model_name=SMOLLM2, prompts_per_step=4, group_size=8,
        new_tokens=16 if args.quick else 32, naive_completions=2 if args.quick else 4, repeats=args.repeats,
    )


def part_train(args: argparse.Namespace, threads: int) -> dict[str, Any]:
    """Both trainers on each model, in alternating rounds of fresh worker processes.

    The machine's load drifts, so the two trainers take turns: round 1 runs the
    package then TRL, round 2 TRL then the package, and so on. Each worker takes
    one warm-up step and then ceil(repeats / rounds) timed steps; the figures pool
    the timed steps of all rounds.
    """
    from .trainers import SPECS, phase_summary

    warmup = "0" if args.quick else "1"
    per_worker = -(-args.repeats // args.rounds)  # ceil(repeats / rounds)
    results = []
    for model in args.models:
        runs: dict[str, list[dict]] = {"ours": [], "trl": []}
        for r in range(args.rounds):
            for engine in (("ours", "trl") if r % 2 == 0 else ("trl", "ours")):
                print(f"  train step: {engine} on {model}, round {r + 1} ...", file=sys.stderr, flush=True)
                runs[engine].append(
                    common.run_worker(
                        "benchmarks.trainers",
                        ["--engine", engine, "--model", model, "--threads", str(threads),
                         "--repeats", str(per_worker), "--warmup", warmup],
                        threads=threads,
                        timeout=900,
                    )
                )
        pooled = {}
        for engine, workers in runs.items():
            steps = [t for w in workers for t in w["step_seconds"]]
            phase_steps = [row for w in workers for row in w["phase_steps"]]
            pooled[engine] = {
                **{k: v for k, v in workers[0].items() if k not in ("step_seconds", "phase_steps", "core_step_seconds")},
                "step_seconds": common.summarize(steps),
                "phases": phase_summary(phase_steps),
                "rounds": len(workers),
                "peak_rss_mb": max(w["peak_rss_mb"] for w in workers),
                "rss_before_mb": common.summarize([w["rss_before_mb"] for w in workers])["median"],
                "prompt_tokens_mean": common.summarize([w["prompt_tokens_mean"] for w in workers])["median"],
            }
        results.append(
            {
                "model": model,
                "spec": SPECS[model].__dict__,
                "ours": pooled["ours"],
                "trl": pooled["trl"],
                "ratio": common.ratio(pooled["ours"]["step_seconds"], pooled["trl"]["step_seconds"]),
                "target": 0.8,
            }
        )
    return {"results": results}


def part_mfu(args: argparse.Namespace, policies: dict) -> dict[str, Any]:
    from .mfu import matmul_peak, run

    peak = matmul_peak(n=2048, repeats=5 if args.quick else 10)
    # rows = B*G and completion tokens of the train-step part's matched configurations
    shapes = {"tiny": (128, 4), SMOLLM2: (4 if args.quick else 8, 32)}  # B*G rows, G = 8 (B = 16 and 1)
    models = []
    for name, (model, tokenizer) in policies.items():
        rows, completion_len = shapes[name]
        print(f"  mfu: {name} ...", file=sys.stderr, flush=True)
        models.append(
            run(model, tokenizer, model_name=name, rows=rows, completion_len=completion_len, group_size=min(8, rows),
                repeats=args.repeats, peak_n=peak["n"], profile_ops=name == SMOLLM2)
        )
    return {"peak": peak, "models": models}


def part_sweep(args: argparse.Namespace) -> dict[str, Any]:
    from .sweep import run

    return run(SMOLLM2, threads=args.sweep_threads, quick=args.quick, repeats=1 if args.quick else 2)


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


def fmt(stats: dict, scale: float = 1.0, digits: int = 2) -> str:
    """'median [min, max]'."""
    return f"{stats['median'] * scale:.{digits}f} [{stats['min'] * scale:.{digits}f}, {stats['max'] * scale:.{digits}f}]"


def verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def print_table(results: dict[str, Any]) -> None:
    m = results["machine"]
    print(f"\nMachine: {m['cpu']}, {m['cores']} cores, {m['torch_threads']} torch threads, torch {m['torch']}, "
          f"transformers {m['transformers']}, trl {m['trl']}")
    load = results["load_average"]
    print(f"Load average (1 min) during the run: median {load['median']:.2f}, max {load['max']:.2f}")
    if "rollout" in results:
        r = results["rollout"]
        print(f"\n(a) Rollout throughput, {r['model']}, B={r['prompts_per_step']}, G={r['group_size']}, "
              f"{r['new_tokens']} new tokens each; median [min, max] of {r['batched_tokens_per_s']['n']}")
        print(f"  batched, one generate call ({r['completions_batched']} completions): "
              f"{fmt(r['batched_tokens_per_s'], digits=1)} tokens/s")
        print(f"  per-completion loop (timed on {r['completions_naive']}):       "
              f"{fmt(r['naive_tokens_per_s'], digits=1)} tokens/s")
        print(f"  speedup: {fmt(r['speedup'], digits=1)} x   target >= {r['target']:g}x: "
              f"{verdict(r['speedup']['median'] >= r['target'])}")
    if "train" in results:
        print("\n(b) Seconds per GRPO step, median [min, max]; (d) peak RSS")
        for row in results["train"]["results"]:
            s = row["spec"]
            print(f"  {row['model']} (B={s['prompts_per_step']}, G={s['group_size']}, "
                  f"{s['max_new_tokens']} new tokens, mu=1, beta=0, fp32)")
            for key, label in (("ours", "grpo_tutorial"), ("trl", "TRL")):
                e = row[key]
                print(f"    {label:14s} {fmt(e['step_seconds'])} s   peak RSS {e['peak_rss_mb']:.0f} MiB "
                      f"(before training {e['rss_before_mb']:.0f})")
            print(f"    ratio ours/TRL {fmt(row['ratio'])}   target <= {row['target']:g}: "
                  f"{verdict(row['ratio']['median'] <= row['target'])}")
            phases = " ".join(f"{k}={row['ours']['phases'][k]:.2f}/{row['trl']['phases'][k]:.2f}"
                              for k in row["ours"]["phases"])
            print(f"    phases, seconds ours/TRL: {phases}")
    if "mfu" in results:
        p = results["mfu"]["peak"]
        print(f"\n(c) MFU; float32 matmul peak ({p['n']}x{p['n']}): {fmt(p['gflops'], digits=1)} GFLOP/s")
        for row in results["mfu"]["models"]:
            print(f"  {row['model']}: {row['rows']} rows x {row['seq_len']} tokens, forward+backward "
                  f"{fmt(row['seconds'], digits=3)} s, {fmt(row['gflops_counted'], digits=1)} GFLOP/s counted, "
                  f"peak alongside {fmt(row['peak_gflops'], digits=1)}")
            print(f"    MFU (6ND)     {fmt(row['mfu_6nd'], 100, 1)} %   target >= 50%: "
                  f"{verdict(row['mfu_6nd']['median'] >= row['target'])}")
            print(f"    MFU (counted) {fmt(row['mfu_counted'], 100, 1)} %   target >= 50%: "
                  f"{verdict(row['mfu_counted']['median'] >= row['target'])}")
            sp = row.get("shared_prompts")
            if sp:
                print(f"    the trainer's pass, each prompt encoded once (G={sp['group_size']}): "
                      f"{fmt(sp['seconds'], digits=3)} s, {fmt(sp['speedup'], digits=2)}x faster than the plain pass, "
                      f"MFU (counted) {fmt(sp['mfu_counted'], 100, 1)} %")
            for op in row["top_ops"][:5]:
                print(f"      {op['share']:6.1%}  {op['op']}")


def run_parts(args: argparse.Namespace, threads: int, policies: dict) -> dict[str, Any]:
    """Parts rollout, train and mfu at one thread count."""
    common.set_threads(threads)
    out: dict[str, Any] = {"machine": common.machine(threads)}
    for part in [p for p in args.parts if p != "sweep"]:
        print(f"benchmark part: {part}, {threads} thread(s) ...", file=sys.stderr, flush=True)
        before = common.load_average()
        seconds, result = common.timed(
            lambda: part_rollout(args, policies) if part == "rollout"
            else part_train(args, threads) if part == "train"
            else part_mfu(args, policies)
        )
        out[part] = result | {"seconds": seconds, "load_before": before, "load_after": common.load_average()}
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": "python -m benchmarks" + (" " + shlex.join(argv if argv is not None else sys.argv[1:])).rstrip(),
        "quick": args.quick,
        "repeats": args.repeats,
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "threads": args.threads,
    }
    with common.LoadSampler() as sampler:
        policies: dict = {}
        if {"rollout", "mfu"} & set(args.parts):
            from grpo_tutorial.pretrained import load_policy

            for name in (("tiny", SMOLLM2) if "mfu" in args.parts else (SMOLLM2,)):
                policies[name] = load_policy(name, device="cpu", dtype="float32")
        results["by_threads"] = {str(n): run_parts(args, n, policies) for n in args.threads}
        if "sweep" in args.parts:
            print("benchmark part: sweep ...", file=sys.stderr, flush=True)
            before = common.load_average()
            seconds, sweep = common.timed(lambda: part_sweep(args))
            results["sweep"] = sweep | {"seconds": seconds, "load_before": before, "load_after": common.load_average()}
    # the first thread count's figures also stand at the top level (what the page reads first)
    results.update(results["by_threads"][str(args.threads[0])])
    results["load_average"] = sampler.summary()
    results["total_seconds"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    for n in args.threads:
        print(f"\n===== {n} thread(s) =====")
        print_table({**results["by_threads"][str(n)], "load_average": results["load_average"]})
    if "sweep" in results:
        print_sweep(results["sweep"])
    print(f"\nwrote {args.out} in {results['total_seconds']:.0f} s")


def print_sweep(sweep: dict[str, Any]) -> None:
    print(f"\n(e) Cost growth, {sweep['model']}, {sweep['threads']} thread(s), around {sweep['base']}")
    for point in sweep["points"]:
        print(f"  {point['point']}: ours {point['ours']['step']:.2f} s, TRL {point['trl']['step']:.2f} s, "
              f"ratio {point['ratio']:.2f}")
    print("  log-log slopes (ours / TRL):")
    for axis, engines in sweep["slopes"].items():
        cells = " ".join(f"{ph}={engines['ours'][ph]:.2f}/{engines['trl'][ph]:.2f}" for ph in engines["ours"])
        print(f"    {axis}: {cells}")


if __name__ == "__main__":
    main()

"""``python -m benchmarks.doctor_zoo``: chapter 18's zoo of broken runs, diagnosed by both doctors.

Every case of :data:`grpo_tutorial.chapters.doctor_zoo.CASES` (one fault planted by
its real cause, or a healthy run) for every seed, with the package's own trainer on
the tiny model (:func:`~grpo_tutorial.chapters.doctor_zoo.run_case`). Seeds
``--tuning-seeds`` chose the doctor's thresholds; the rest are held out, and the
summary reports the held-out runs only:

- ours: a confusion matrix (planted fault x primary finding), each count with its
  Clopper-Pearson 95% interval; recall counts the planted name as the primary
  finding at ``fault`` severity; a false alarm is any ``fault`` or ``warning`` on a
  healthy run;
- rldoctor 0.2.0 on the same runs, read by its own JSONL reader from the rows TRL
  would log (:func:`grpo_tutorial.doctor.trl_rows`, TRL's key names, with a config
  line in TRL's names), and both doctors on rldoctor's own simulated scenarios
  (``rl_doctor.simulate``).

Runs are kept in ``--cache DIR`` (one file per case and seed), so an interrupted
command loses only the runs in progress, and a change to the doctor's rules is
re-diagnosed from the cache without training again. The record,
``grpo_tutorial/data/doctor_zoo.json``, stores every run's history (the doctor's
fields), its kept completions (4 per step) and both doctors' verdicts, with the
command, the package commit, the machine and its load; ``invocations`` lists every
invocation that trained runs of the cache (wall time, load, runs made), since a
record re-made from its cache after a change to the rules trains nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import contextlib
import json
import math
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RecordRun, open_cache, write_atomic  # noqa: E402
from grpo_tutorial.chapters.run_record import json_safe  # noqa: E402
from grpo_tutorial.chapters.doctor_zoo import CASES, Starts, ZooSettings, as_run, run_case  # noqa: E402
from grpo_tutorial.doctor import DOCTOR_VERSION, FAULTS, diagnose, live_findings, trl_rows  # noqa: E402
from grpo_tutorial.doctor.reading import run_from_trl  # noqa: E402
from grpo_tutorial.run.progress import progress_bar  # noqa: E402
from grpo_tutorial.stats import clopper_pearson  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "grpo_tutorial" / "data" / "doctor_zoo.json.gz"
SEEDS = tuple(range(15))
TUNING_SEEDS = tuple(range(5))
QUICK_SEEDS = (0, 1)

#: rldoctor's detectors (and advantage_collapse's regime) that name each of our faults; the faults not here have
#: no detector of rldoctor's (reward_bug, extraction_mismatch and tool_never_called need the completions or a tool's
#: columns; sampler_mismatch needs the sampler's log-probs, which TRL logs only with vLLM).
RLDOCTOR_NAMES: dict[str, tuple[str, ...]] = {
    "truncation": ("length_pathology",),
    "zero_variance_too_hard": ("advantage_collapse:too_hard",),
    "zero_variance_too_easy": ("advantage_collapse:saturated",),
    "kl_explosion": ("kl_drift",),
    "entropy_collapse": ("entropy_collapse",),
    "non_finite": ("gradient_pathology",),
    "lr_too_high": ("gradient_pathology",),
    "format_only": ("reward_composition", "reward_hacking"),
    "plateau": ("plateau",),
}
#: rldoctor's simulated scenarios, and the fault of ours each one shows (None: healthy; "-": none of ours).
SCENARIO_FAULTS: dict[str, str | None] = {
    "healthy": None, "entropy_collapse": "entropy_collapse", "saturated_groups": "zero_variance_too_easy",
    "too_hard": "zero_variance_too_hard", "reward_hacking": "-", "length_hacking": "-", "truncation": "truncation",
    "kl_blowup": "kl_explosion", "clip_saturation": "-", "grad_spikes": "-", "plateau": "plateau",
    "format_domination": "format_only",
}
SCENARIO_SEEDS = tuple(range(5))


# ---------------------------------------------------------------------------
# Running the zoo
# ---------------------------------------------------------------------------


def _seed_runs(settings: ZooSettings, cases: Sequence[str], seed: int, folder: str, quick: bool) -> list[dict]:
    """Every case of one seed: from ``folder`` where an earlier invocation finished it, else run and kept there.
    One torch thread per process (the tiny model gains nothing from a second, and two processes share the cores)."""
    import torch

    torch.set_num_threads(1)
    starts = Starts(folder, quick=quick)
    out = []
    for name in cases:
        path = Path(folder) / "runs" / f"{name}_seed{seed}.json"
        if path.exists():
            out.append(json.loads(path.read_text()))
            continue
        result = run_case(name, seed, settings, starts)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(json_safe(result)))
        result["made_here"] = True
        print(f"  seed {seed:2d} {name:28s} {result['seconds']:6.1f} s" + (
            f"  (stopped: {result['crashed'][:60]})" if result["crashed"] else ""), flush=True)
        out.append(result)
    return out


# ---------------------------------------------------------------------------
# The two doctors
# ---------------------------------------------------------------------------


def ours(run: dict) -> dict:
    """Our doctor's verdict on a stored run: its findings (name, severity) and its primary."""
    diagnosis = diagnose(as_run(run))
    primary = diagnosis.primary
    return {"findings": [[f.name, f.severity] for f in diagnosis.findings],
            "primary": None if primary is None else [primary.name, primary.severity],
            "skipped": [s.check for s in diagnosis.skipped]}


def trl_config(settings: dict) -> dict:
    """A run's settings in TRL's names, as a config line for rldoctor's JSONL reader."""
    return {"num_generations": settings.get("group_size"), "learning_rate": settings.get("learning_rate"),
            "beta": settings.get("beta"), "max_completion_length": settings.get("max_new_tokens"),
            "epsilon": settings.get("clip_eps"),
            "epsilon_high": settings.get("clip_eps_high") or settings.get("clip_eps"),
            "loss_type": "grpo", "model_name": "tiny-qwen2"}


def _rldoctor_name(finding: Any) -> str:
    regime = (finding.metrics or {}).get("regime")
    return f"{finding.detector}:{regime}" if finding.detector == "advantage_collapse" and regime else finding.detector


def rldoctor(rows: list[dict], config: dict | None) -> dict:
    """rldoctor's verdict on rows in TRL's names, read by its own JSONL reader: its problems at WARNING or worse
    (``[name, severity]``, worst first, as its ``problems`` orders them) and its first."""
    from rl_doctor import diagnose as rl_diagnose
    from rl_doctor.detectors.base import Severity
    from rl_doctor.ingest.base import load_jsonl

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.jsonl"
        lines = ([json.dumps({"config": config})] if config else []) + [json.dumps(json_safe(r)) for r in rows]
        path.write_text("\n".join(lines) + "\n")
        result = rl_diagnose(load_jsonl(str(path)))
    problems = [[_rldoctor_name(f), f.severity.name] for f in result.problems if f.severity >= Severity.WARNING]
    return {"problems": problems, "first": problems[0] if problems else None}


def rldoctor_names(verdict: dict) -> list[str]:
    """Our fault names for rldoctor's problems (a problem with no fault of ours is left out)."""
    names = []
    for detector, _ in verdict["problems"]:
        names += [fault for fault, theirs in RLDOCTOR_NAMES.items() if detector in theirs]
    return names


def rldoctor_first(verdict: dict) -> list[str]:
    if verdict["first"] is None:
        return []
    return [fault for fault, theirs in RLDOCTOR_NAMES.items() if verdict["first"][0] in theirs]


def live(run: dict) -> list[list]:
    """What the trainer would have warned of, replayed step by step: ``[step, name, severity]`` for each finding's
    first warning (:func:`grpo_tutorial.doctor.live_findings` on the rows and kept completions up to that step)."""
    first: dict[str, list] = {}
    for i, row in enumerate(run["history"]):
        kept = [c for c in run["completions"] if c["step"] <= row["step"]]
        for finding in live_findings(run["history"][: i + 1], kept, run["settings"]):
            first.setdefault(finding.name, [row["step"], finding.name, finding.severity])
    return sorted(first.values())


def diagnose_all(runs: list[dict]) -> None:
    """Both doctors' verdicts, into each run (``ours``, ``live``, ``rldoctor``)."""
    for run in runs:
        run["ours"] = ours(run)
        run["live"] = live(run)
        run["rldoctor"] = rldoctor(trl_rows(run["history"]), trl_config(run["settings"]))


# ---------------------------------------------------------------------------
# Counting
# ---------------------------------------------------------------------------


def _count(k: int, n: int) -> dict:
    lo, hi = clopper_pearson(k, n) if n else (math.nan, math.nan)
    return {"k": k, "n": n, "share": k / n if n else math.nan, "lo": lo, "hi": hi}


def confusion(runs: list[dict], doctor: str) -> dict:
    """Planted fault ("healthy" for none) x the doctor's primary name ("none" when it names no fault or warning),
    each cell a count with its Clopper-Pearson 95% interval; recall per fault; false alarms on healthy runs."""
    rows: dict[str, dict[str, int]] = {}
    recall: dict[str, dict] = {}
    for run in runs:
        planted = run["fault"] or "healthy"
        if doctor == "ours":
            primary = run["ours"]["primary"]
            column = primary[0] if primary else "none"
            hit = bool(primary) and primary[0] == planted and primary[1] == "fault"
            alarm = any(sev in ("fault", "warning") for _, sev in run["ours"]["findings"])
        else:
            first = rldoctor_first(run["rldoctor"])
            column = first[0] if first else (run["rldoctor"]["first"][0] if run["rldoctor"]["first"] else "none")
            hit = planted in first
            alarm = bool(run["rldoctor"]["problems"])
        rows.setdefault(planted, {}).setdefault(column, 0)
        rows[planted][column] += 1
        recall.setdefault(planted, {"k": 0, "n": 0, "alarms": 0, "named": 0, "live": 0})
        recall[planted]["n"] += 1
        recall[planted]["k"] += hit
        recall[planted]["alarms"] += alarm
        if doctor == "ours":  # the trainer's live warnings: an alarm on a healthy run, the planted name on a broken one
            warned = [name for _, name, _ in run.get("live", [])]
            recall[planted]["live"] += bool(warned) if planted == "healthy" else planted in warned
        if doctor == "rldoctor":
            recall[planted]["named"] += planted in rldoctor_names(run["rldoctor"])
    matrix = {planted: {col: _count(k, sum(cols.values())) for col, k in sorted(cols.items())}
              for planted, cols in rows.items()}
    per_fault = {}
    for planted, r in recall.items():
        entry = {"primary": _count(r["k"], r["n"])} if planted != "healthy" else {
            "false_alarms": _count(r["alarms"], r["n"])}
        if doctor == "rldoctor" and planted != "healthy":
            entry["named_anywhere"] = _count(r["named"], r["n"])
        if doctor == "ours":
            entry["live"] = _count(r["live"], r["n"])  # healthy: runs warned of; a fault: runs warned of it
        per_fault[planted] = entry
    return {"matrix": matrix, "per_fault": per_fault}


def simulated() -> dict:
    """Both doctors on rldoctor's simulated scenarios (its 400-step runs, seeds :data:`SCENARIO_SEEDS`)."""
    from rl_doctor.simulate import SCENARIOS, simulate

    out: dict[str, Any] = {}
    for scenario in SCENARIOS:
        entries = []
        for seed in SCENARIO_SEEDS:
            records, config = simulate(scenario, seed=seed)
            run = run_from_trl(records, {"beta": config.get("beta"), "learning_rate": config.get("learning_rate")})
            diagnosis = diagnose(run)
            mine = diagnosis.primary
            theirs = rldoctor(records, config)
            entries.append({"seed": seed, "ours": None if mine is None else [mine.name, mine.severity],
                            "ours_all": [[f.name, f.severity] for f in diagnosis.findings],
                            "rldoctor": theirs["first"], "rldoctor_all": theirs["problems"]})
        out[scenario] = {"fault": SCENARIO_FAULTS.get(scenario, "-"), "runs": entries}
    return out


def summarize(runs: list[dict], tuning: Sequence[int]) -> dict:
    held = [r for r in runs if r["seed"] not in tuning]
    tuned = [r for r in runs if r["seed"] in tuning]
    both = [f for f in FAULTS if f in RLDOCTOR_NAMES]
    return {
        "held_out": {"ours": confusion(held, "ours"), "rldoctor": confusion(held, "rldoctor"),
                     "runs": len(held), "seeds": sorted({r["seed"] for r in held})},
        "tuning": {"ours": confusion(tuned, "ours"), "runs": len(tuned), "seeds": sorted(tuning)},
        "both_observe": both,
        "only_ours": [f for f in FAULTS if f not in RLDOCTOR_NAMES],
    }


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.doctor_zoo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default 0-14)")
    parser.add_argument("--tuning-seeds", type=int, nargs="+", default=None,
                        help="the seeds that chose the thresholds (default 0-4); the others are held out")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--jobs", type=int, default=2, help="seeds run in parallel processes (default 2)")
    parser.add_argument("--quick", action="store_true", help="seconds-long runs of the test recipes (prove nothing)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-simulated", action="store_true", help="leave out rldoctor's simulated scenarios")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="default: %(default)s")
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep each finished run here, and take it again (default: a temporary folder)")
    return parser


def _stamp(settings: ZooSettings, quick: bool) -> dict:
    return {"settings": settings.to_dict(), "quick": quick}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    settings = ZooSettings.quick() if args.quick else ZooSettings()
    seeds = tuple(args.seeds or (QUICK_SEEDS if args.quick else SEEDS))
    tuning = tuple(args.tuning_seeds if args.tuning_seeds is not None else (
        QUICK_SEEDS[:1] if args.quick else TUNING_SEEDS))
    with RecordRun("python -m benchmarks.doctor_zoo", argv) as run, contextlib.ExitStack() as stack:
        print(f"{run.command}: {len(seeds)} seeds x {len(args.cases)} cases, jobs={args.jobs}\n  {run.uptime_start}",
              flush=True)
        stamp = SimpleNamespace(to_dict=lambda: _stamp(settings, args.quick))  # zoo.json: the caches made so far
        folder = open_cache(args.cache, stamp, stack, stamp_file="zoo.json")
        runs: list[dict] = []
        bar = progress_bar(total=len(seeds), desc="seeds", enabled=not args.no_progress)
        with futures.ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            pending = [pool.submit(_seed_runs, settings, args.cases, seed, folder, args.quick) for seed in seeds]
            for done in futures.as_completed(pending):
                runs += done.result()
                bar.update(1)
        bar.close()
        train_seconds = run.elapsed()
        runs.sort(key=lambda r: (r["seed"], list(CASES).index(r["case"])))
        made_here = sum(1 for r in runs if r.pop("made_here", False))
        diagnose_all(runs)
        header = run.header(quick=args.quick, jobs=args.jobs, threads=1, doctor_version=DOCTOR_VERSION,
                            rldoctor_version=_rldoctor_version())
    invocations = _invocations(args.cache, {
        "started": header["created"], "command": run.command, **run.code, "wall_seconds": train_seconds,
        "runs_made": made_here, "load": header["load"], "jobs": args.jobs})
    out = {
        **header,
        "train_seconds": train_seconds,
        "run_seconds": sum(r["seconds"] for r in runs),
        "invocations": invocations,
        "settings": settings.to_dict(),
        "seeds": list(seeds),
        "tuning_seeds": list(tuning),
        "cases": {name: {"fault": c.fault, "task": c.task, "cause": c.cause} for name, c in CASES.items()
                  if name in args.cases},
        "summary": summarize(runs, tuning),
        "simulated": None if args.no_simulated else simulated(),
        "runs": runs,
    }
    run.write(args.out, out, compact=True)  # .gz: 300 runs' histories and kept completions, 19 MB as text, 2 MB gzipped
    report(out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")
    return out


def _invocations(cache: Path | None, this: dict) -> list[dict]:
    """Every invocation that trained runs of this cache (its command, commit, wall time, load and how many runs it
    made), this one appended when it made any: the record's runs may come from several, after an interruption."""
    if cache is None:
        return [this]
    path = cache / "invocations.json"
    made = json.loads(path.read_text()) if path.exists() else []
    if this["runs_made"]:
        made.append(json_safe(this))
        write_atomic(path, json.dumps(made, indent=1))
    return made


def _rldoctor_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("rldoctor")
    except Exception:  # not installed
        return None


def report(out: dict) -> None:
    summary = out["summary"]["held_out"]
    print(f"\nheld-out runs: {summary['runs']} (seeds {summary['seeds']}); wall {out['wall_seconds'] / 60:.1f} min")
    print(f"{'planted':24s} {'ours: primary':>18s} {'rldoctor: first':>18s} {'rldoctor: named':>16s}")
    for planted, entry in summary["ours"]["per_fault"].items():
        theirs = summary["rldoctor"]["per_fault"].get(planted, {})
        if planted == "healthy":
            mine, other, named = entry["false_alarms"], theirs.get("false_alarms"), None
            label = "healthy (alarms)"
        else:
            mine, other, named = entry["primary"], theirs.get("primary"), theirs.get("named_anywhere")
            label = planted
        fmt = lambda c: "" if c is None else f"{c['k']}/{c['n']} [{c['lo']:.2f},{c['hi']:.2f}]"
        print(f"{label:24s} {fmt(mine):>18s} {fmt(other):>18s} {fmt(named):>16s}")


if __name__ == "__main__":
    main()

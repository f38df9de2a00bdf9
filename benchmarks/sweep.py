"""Part e: how the cost of a GRPO step grows with the work, for both trainers.

Around a base point (SmolLM2, B=1 prompt, G=8 completions, 32 new tokens), one
setting at a time is varied: G over {2, 4, 8, 16}, the completion length over
{8, 16, 32, 64}, B over {1, 2, 4}. Each point runs both trainers in fresh worker
processes (benchmarks/trainers.py) and records the seconds of every phase.

For each setting, each trainer and each phase, a straight line is fitted to
log(seconds) against log(setting): its slope says how the phase grows. A slope
of 1 is linear growth (twice the work, twice the time); below 1, the phase has a
fixed cost or gets more efficient with size (a bigger batch fills the matrix
units better); above 1, it grows faster than the work (attention over longer
sequences, or memory pressure).
"""

from __future__ import annotations

import math
import sys
from typing import Any, Sequence

from . import common

BASE = {"prompts_per_step": 1, "group_size": 8, "max_new_tokens": 32}
AXES = {
    "group_size": (2, 4, 8, 16),
    "max_new_tokens": (8, 16, 32, 64),
    "prompts_per_step": (1, 2, 4),
}
QUICK_AXES = {"group_size": (2, 8), "max_new_tokens": (8, 32), "prompts_per_step": (1, 2)}
PHASES = ("generate", "rewards", "score_no_grad", "forward", "backward", "optimizer", "other", "step")
FLAGS = {"prompts_per_step": "--prompts-per-step", "group_size": "--group-size", "max_new_tokens": "--max-new-tokens"}


def points(axes: dict[str, Sequence[int]]) -> list[dict[str, int]]:
    """Every distinct setting the one-at-a-time sweep visits, base point first."""
    seen: list[dict[str, int]] = [dict(BASE)]
    for name, values in axes.items():
        for value in values:
            point = {**BASE, name: value}
            if point not in seen:
                seen.append(point)
    return seen


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log(y) against log(x); NaN with fewer than two usable points."""
    pairs = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pairs) < 2:
        return math.nan
    mx = sum(a for a, _ in pairs) / len(pairs)
    my = sum(b for _, b in pairs) / len(pairs)
    sxx = sum((a - mx) ** 2 for a, _ in pairs)
    if sxx == 0:
        return math.nan
    return sum((a - mx) * (b - my) for a, b in pairs) / sxx


def _median_phases(worker: dict[str, Any]) -> dict[str, float]:
    rows = worker["phase_steps"]
    out = {name: common.summarize([row[name] for row in rows])["median"] for name in PHASES if name != "step"}
    out["step"] = common.summarize(worker["step_seconds"])["median"]
    return out


def slopes(measured: list[dict[str, Any]], axes: dict[str, Sequence[int]]) -> dict[str, dict[str, dict[str, float]]]:
    """slope[axis][engine][phase] over the points that vary ``axis`` alone."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for axis, values in axes.items():
        on_axis = [m for m in measured if all(m["point"][k] == BASE[k] for k in BASE if k != axis)
                   and m["point"][axis] in values]
        out[axis] = {}
        for engine in ("ours", "trl"):
            xs = [m["point"][axis] for m in on_axis]
            out[axis][engine] = {
                phase: loglog_slope(xs, [m[engine][phase] for m in on_axis]) for phase in PHASES
            }
    return out


def run(model: str, threads: int, quick: bool, repeats: int) -> dict[str, Any]:
    axes = QUICK_AXES if quick else AXES
    measured = []
    for point in points(axes):
        entry: dict[str, Any] = {"point": point}
        for engine in ("ours", "trl"):
            print(f"  sweep: {engine} at {point} ...", file=sys.stderr, flush=True)
            flags = [arg for key, value in point.items() for arg in (FLAGS[key], str(value))]
            worker = common.run_worker(
                "benchmarks.trainers",
                ["--engine", engine, "--model", model, "--threads", str(threads), "--repeats", str(repeats),
                 "--warmup", "0" if quick else "1", *flags],
                threads=threads,
                timeout=1200,
            )
            entry[engine] = _median_phases(worker)
        entry["ratio"] = entry["ours"]["step"] / entry["trl"]["step"]
        measured.append(entry)
    return {"model": model, "threads": threads, "base": BASE, "axes": {k: list(v) for k, v in axes.items()},
            "points": measured, "slopes": slopes(measured, axes)}

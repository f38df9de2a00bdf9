"""Shared pieces of the benchmarks: statistics, the machine record, subprocess workers, and the driver every record
command runs under (:class:`RecordRun`: the commit, the command line, the load, the header, the atomic write;
:func:`run_seeds`: seeds one after another or in parallel processes)."""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import datetime as dt
import gzip
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results.json"
#: The marker before the JSON line a worker subprocess prints last.
WORKER_PREFIX = "BENCHMARK-RESULT "


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """Median, min and max of repeated measurements (and the raw values).

    >>> summarize([3.0, 1.0, 2.0])["median"]
    2.0
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise ValueError(f"values must be a non-empty list of numbers, got {values!r:.80}")
    xs = [float(v) for v in values]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs), "values": xs}


def ratio(numerator: dict, denominator: dict) -> dict[str, float]:
    """The ratio of two summaries: of their medians, and the widest range their extremes allow."""
    return {
        "median": numerator["median"] / denominator["median"],
        "min": numerator["min"] / denominator["max"],
        "max": numerator["max"] / denominator["min"],
    }


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Wall-clock seconds of one call, and its result."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (what else runs on the machine)."""
    return [round(x, 2) for x in os.getloadavg()]


def cpu_model() -> str:
    """The CPU's model name (:func:`grpo_tutorial.env.cpu_name`: /proc/cpuinfo, else platform.processor())."""
    from grpo_tutorial.env import cpu_name

    return cpu_name()


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MiB.

    Read from ``VmHWM`` in /proc/self/status, the high-water mark of this program's
    own memory. ``getrusage(...).ru_maxrss`` would be wrong in a worker: Linux
    carries the parent's resident size at ``fork`` over into the child's maximum,
    so a worker started by a parent that holds SmolLM2 would report SmolLM2's size.
    The kernel updates VmHWM lazily, so the current RSS is taken if it is higher.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return max(int(line.split()[1]) / 1024, current_rss_mb())  # kB -> MiB
    except OSError:
        pass
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # not Linux: the best we have
    return kib / 1024 if sys.platform != "darwin" else kib / 2**20


def current_rss_mb() -> float:
    """This process's resident set size now, in MiB."""
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:  # pragma: no cover - psutil ships with TRL
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def machine(threads: int) -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch
    import transformers

    import grpo_tutorial
    from grpo_tutorial.env import describe_kernels

    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": threads,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # what tests/test_records.py compares before it asks for the same bits
        "kernels": describe_kernels(threads),
        "transformers": transformers.__version__,
        "grpo_tutorial": grpo_tutorial.__version__,
    }
    for name in ("trl", "accelerate", "datasets"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    return info


def set_threads(threads: int) -> None:
    """Use ``threads`` intra-op threads (and one inter-op thread) in this process."""
    import torch

    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    torch.set_num_threads(threads)


def worker_env(threads: int) -> dict[str, str]:
    """Environment of a worker subprocess: offline, quiet, ``threads`` OpenMP threads."""
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": str(threads),
        }
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_worker(module: str, args: Sequence[str], threads: int, timeout: float) -> dict[str, Any]:
    """Run ``python -m module args`` in a fresh process and return the JSON it reports.

    The worker prints its result as one line starting with :data:`WORKER_PREFIX`.
    A failing worker raises ``RuntimeError`` with the end of its stderr.
    """
    cmd = [sys.executable, "-m", module, *args]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=worker_env(threads), capture_output=True, text=True, timeout=timeout
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(WORKER_PREFIX)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        raise RuntimeError(f"worker {' '.join(cmd[2:])} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1][len(WORKER_PREFIX) :])


def report(result: dict[str, Any]) -> None:
    """What a worker does last: print its result for :func:`run_worker`."""
    print(WORKER_PREFIX + json.dumps(result), flush=True)


class LoadSampler:
    """Samples the 1-minute load average every ``every`` seconds in a background thread."""

    def __init__(self, every: float = 5.0) -> None:
        if not every > 0:
            raise ValueError(f"every must be a positive number of seconds, got {every!r}")
        self.every = every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.every)

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        return summarize(self.samples) | {"every_seconds": self.every}


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text, or bytes) to ``path`` through a temporary file and a rename, so that an interrupted
    run never leaves half a file (in the cache, or a record in the package data)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data)
    tmp.replace(path)


def uptime() -> str:
    """``uptime``'s line (the load averages), or the load averages alone where there is no ``uptime``."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


class RecordRun:
    """What every record command does around its runs, once: ``with RecordRun("python -m benchmarks.lab", argv) as
    run:``.

    At the start: the package commit (the code that runs, whatever changes while it runs), the command line as
    typed (``program`` and the arguments), the time and ``uptime``, and the 1-minute load sampled every 10 s until
    the block ends. :meth:`header` is the first fields of every record (created, command, package commit, quick,
    wall seconds, jobs, load, machine), :meth:`write` writes the record atomically (a half-written record never
    replaces the last one), JSON without NaN.
    """

    def __init__(self, program: str, argv: Sequence[str] | None) -> None:
        from grpo_tutorial.chapters.run_record import package_commit

        self.code = package_commit()
        self.command = (program + " " + " ".join(
            shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))).strip()
        self.started = dt.datetime.now(dt.timezone.utc)
        self.uptime_start = uptime()
        self.t0 = time.perf_counter()
        self.sampler = LoadSampler(every=10.0)

    def __enter__(self) -> "RecordRun":
        self.t0 = time.perf_counter()
        self.sampler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sampler.__exit__(*exc)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def header(self, *, quick: bool, jobs: int, threads: int, **after_code: Any) -> dict[str, Any]:
        """The record's first fields; ``after_code`` (e.g. ``cpu_capability``) goes right after the commit."""
        return {
            "created": self.started.isoformat(timespec="seconds"),
            "command": self.command,
            **self.code,
            **after_code,
            "quick": quick,
            "wall_seconds": self.elapsed(),
            "jobs": jobs,
            "load": {"uptime_start": self.uptime_start, "uptime_end": uptime(), "during": self.sampler.summary(),
                     "end": load_average()},
            "machine": machine(threads),
        }

    def write(self, path: Path, record: dict[str, Any], indent: int | None = 1, compact: bool = False) -> None:
        """``record`` as JSON (numbers only: no NaN) at ``path``, atomically; ``compact``: no spaces, no indent; a
        ``.gz`` path gets that JSON gzipped with no time stamp (the same record, the same bytes)."""
        from grpo_tutorial.chapters.run_record import json_safe

        path.parent.mkdir(parents=True, exist_ok=True)
        shape = {"separators": (",", ":")} if compact else {"indent": indent}
        text = json.dumps(json_safe(record), allow_nan=False, **shape) + "\n"
        write_atomic(path, gzip.compress(text.encode("utf-8"), mtime=0) if path.name.endswith(".gz") else text)


def add_record_arguments(parser: Any, out: Path, jobs: int = 2,
                         jobs_help: str = "seeds run in parallel processes") -> None:
    """The options every record command takes: ``--jobs``, ``--quick``, ``--no-progress``, ``--out``."""
    parser.add_argument("--jobs", type=int, default=jobs, help=f"{jobs_help} (default {jobs})")
    parser.add_argument("--quick", action="store_true", help="the seconds-long test recipe (proves nothing)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--out", type=Path, default=out, help="default: %(default)s")


def run_seeds(seeds: Sequence[int], one_seed: Callable[[int, bool], dict], *, jobs: int, progress: bool,
              run: RecordRun) -> list[dict]:
    """``one_seed(seed, progress)`` for every seed, in this process (``jobs`` 1: each seed shows its own progress)
    or in ``jobs`` processes (a bar over the seeds); each finished seed is printed with its seconds. Sorted by seed.
    ``one_seed`` must pickle for ``jobs`` > 1 (a module-level function or a ``functools.partial`` of one)."""
    results: list[dict] = []

    def done(result: dict) -> None:
        results.append(result)
        print(f"seed {result['seed']} done: {result['seconds']:.0f} s (total {run.elapsed():.0f} s)", flush=True)

    if jobs <= 1:
        for seed in seeds:
            done(one_seed(seed, progress))
    else:
        from grpo_tutorial.run.progress import progress_bar

        bar = progress_bar(total=len(seeds), desc="seeds", enabled=progress)
        with futures.ProcessPoolExecutor(max_workers=jobs) as pool:
            for finished in futures.as_completed([pool.submit(one_seed, seed, False) for seed in seeds]):
                bar.update(1)
                done(finished.result())
        bar.close()
    return sorted(results, key=lambda r: r["seed"])


def open_cache(cache: Path | None, recipe: Any, stack: contextlib.ExitStack, stamp_file: str = "recipe.json") -> str:
    """The folder for warm starts and finished runs: ``cache`` (checked against the recipe it was made with, whose
    ``to_dict()`` it keeps in ``stamp_file``) or a temporary one."""
    if cache is None:
        return stack.enter_context(tempfile.TemporaryDirectory())
    cache.mkdir(parents=True, exist_ok=True)
    stamp, made = cache / stamp_file, json.dumps(recipe.to_dict(), sort_keys=True)
    if stamp.exists() and stamp.read_text() != made:
        raise SystemExit(f"error: {cache} holds runs of another recipe; give another --cache or empty it")
    stamp.write_text(made)
    return str(cache)

"""Chapter 9's run record: one self-describing JSON file a learner can share, and the records others shared.

The book's build has no GPU, so the number that matters most, what Qwen2.5-0.5B
learns in one Colab session, can only come from a learner's run. Chapter 9
writes it down in one file, ``run_record.json`` in the run's folder
(:func:`build_run_record`, :func:`write_run_record`): the GPU and its driver, the
library versions, the package commit, every setting, the seconds per step and
per part of the notebook, the peak GPU memory, the before/after evaluation
with both scorers, standard errors and paired gains, and (schema 2, issue 43) the
sampler that wrote the rollouts with its milliseconds per decoding step and compile
time, and the estimate the notebook showed before the run, so that the first real
T4 record tests that estimate.

Shared records live in the package, in ``grpo_tutorial/data/community/`` (one
file each, added by pull request); :func:`community_records` reads them and
``tests/test_run_record.py`` checks every one against :func:`validate_run_record`.
Chapter 9 prints them beside its estimates, each labelled with the device and
date the record itself carries: they are contributed measurements, never the
book's own.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import numbers
import os
import platform
import subprocess
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from ..run.disk import write_durably

__all__ = [
    "COMMUNITY_FOLDER",
    "RECORD_FILE",
    "RECORD_KIND",
    "SCHEMA_VERSION",
    "build_run_record",
    "community_records",
    "json_safe",
    "package_commit",
    "read_run_record",
    "record_lines",
    "validate_run_record",
    "write_run_record",
]

#: What every record says it is.
RECORD_KIND = "grpo-tutorial chapter 9 run"
#: The layout of a record; raise it (and teach :func:`validate_run_record` the old one) when it changes.
#: 2 (issue 43) added ``sampler`` and ``estimate``; a record of schema 1 is still read.
SCHEMA_VERSION = 2
#: The file a run's record is written to, in its run folder.
RECORD_FILE = "run_record.json"
#: The package-data folder of shared records (``grpo_tutorial/data/community/``).
COMMUNITY_FOLDER = "community"

_NUMBER = (int, float)
_OPTIONAL_STR = (str, type(None))
_OPTIONAL_NUMBER = (int, float, type(None))
_SCORE = {"before": _NUMBER, "before_se": _NUMBER, "after": _NUMBER, "after_se": _NUMBER, "gain": _NUMBER,
          "gain_se": _NUMBER}
_SHARE = {"before": _NUMBER, "after": _NUMBER}
#: Every key a record must have, with its type (a dict: a nested record of its own).
SCHEMA: dict[str, Any] = {
    "kind": str,
    "schema_version": int,
    "created": str,
    "contributor": _OPTIONAL_STR,
    "package_version": str,
    "package_commit": _OPTIONAL_STR,
    "device": {"kind": str, "name": str, "driver": _OPTIONAL_STR, "memory_bytes": (int, type(None))},
    "software": {"python": str, "torch": str, "transformers": _OPTIONAL_STR, "peft": _OPTIONAL_STR,
                 "cuda": _OPTIONAL_STR},
    "model": str,
    "data": str,
    "steps": int,
    "resumed_from": int,
    "settings": dict,
    "seconds": {"per_step_mean": _NUMBER, "per_step_median": _NUMBER, "parts": dict},
    "peak_memory": {"allocated": (int, type(None)), "reserved": (int, type(None))},
    "evaluation": {"n": int, "strict": _SCORE, "lenient": _SCORE, "boxed": _SHARE, "truncated": _SHARE},
}
#: What schema 2 adds: the sampler (``chapters.gsm8k.SAMPLER_LABELS``' names; its median milliseconds per decoding
#: step over the steps, the seconds of its compiling calls, its float16 fallbacks: None where the sampler did not
#: measure them) and the estimate shown before the run (``chapters.gsm8k.chapter9_estimate``'s ``shown``: minutes
#: low and high, or None where the GPU record gave none; the sampler it read; the GPU record's commit), or None.
SCHEMA_2 = {
    "sampler": {"name": str, "decode_ms_median": _OPTIONAL_NUMBER, "compile_seconds": _OPTIONAL_NUMBER,
                "fallbacks": (int, type(None))},
}
ESTIMATE = {"minutes": (list, type(None)), "sampler": _OPTIONAL_STR, "gpu_record": _OPTIONAL_STR, "steps": int,
            "n_eval": int}


def package_commit() -> dict[str, Any]:
    """The git commit of the package's code and whether it had uncommitted changes: ``package_commit`` and
    ``package_dirty``, as every record stores them (chapter 9's run record keeps the commit alone).

    pip's record of a ``git+`` install gives the commit (clean: pip built that commit); else the checkout the
    package lies in gives its HEAD, dirty when ``grpo_tutorial/`` or ``benchmarks/`` differ from it (records being
    written into ``grpo_tutorial/data/`` do not count). Both None when neither says: an install from a wheel, a
    copy without git, or a package installed into a folder inside some other checkout (a virtual environment
    within the repository: that HEAD is not the installed code's).
    """
    try:
        direct = metadata.distribution("grpo-tutorial").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        direct = None
    if direct:
        commit = json.loads(direct).get("vcs_info", {}).get("commit_id")
        if commit:
            return {"package_commit": commit, "package_dirty": False}
    here = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != here:
        return {"package_commit": None, "package_dirty": None}
    status = git("status", "--porcelain", "--", "grpo_tutorial", "benchmarks", ":(exclude)grpo_tutorial/data")
    return {"package_commit": git("rev-parse", "HEAD"), "package_dirty": None if status is None else bool(status)}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _device() -> dict:
    """The device the run used: the first CUDA GPU (name, driver from ``nvidia-smi``, memory), or the CPU."""
    import torch

    from ..env import cpu_name, gpu_name

    if not torch.cuda.is_available():
        return {"kind": "cpu", "name": f"{cpu_name()} ({os.cpu_count()} cores)", "driver": None, "memory_bytes": None}
    driver = None
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10)
        driver = done.stdout.strip().splitlines()[0].strip() if done.returncode == 0 and done.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        driver = None
    memory = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_initialized() else None
    return {"kind": "cuda", "name": gpu_name(), "driver": driver, "memory_bytes": memory}


def _peak_memory() -> dict:
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {"allocated": None, "reserved": None}
    return {"allocated": int(torch.cuda.max_memory_allocated()), "reserved": int(torch.cuda.max_memory_reserved())}


def json_safe(value: Any) -> Any:
    """``value`` as strict JSON, for every record: NaN and infinities become None, tuples lists, keys strings,
    numbers of other types (numpy's) Python numbers, and anything else its repr.

    >>> json_safe({"a": (1.5, float("nan")), 2: {"b": None, "c": True}})
    {'a': [1.5, None], '2': {'b': None, 'c': True}}
    """
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    return repr(value)


def sampler_summary(config: Any, history: list[dict], on_gpu: bool) -> dict:
    """The record's ``sampler``: its name (``chapters.gsm8k.sampler_name``) and what its history rows measured."""
    from .gsm8k import sampler_name

    decode = sorted(float(row["sampler/decode_ms"]) for row in history if "sampler/decode_ms" in row)
    compile_rows = [float(row["sampler/compile_seconds"]) for row in history if "sampler/compile_seconds" in row]
    fallbacks = [row["sampler/fallbacks"] for row in history if "sampler/fallbacks" in row]
    return {"name": sampler_name(config, on_gpu), "decode_ms_median": _median(decode) if decode else None,
            "compile_seconds": sum(compile_rows) if compile_rows else None,
            "fallbacks": int(sum(fallbacks)) if fallbacks else None}


def _median(values: list[float]) -> float:
    values = sorted(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def build_run_record(result: dict, *, model: str, data: str, parts_seconds: dict[str, float],
                     contributor: str | None = None, estimate: dict | None = None) -> dict:
    """The record of one chapter 9 run, from :func:`~grpo_tutorial.chapters.gsm8k.gsm8k_run`'s result.

    Args:
        result: ``gsm8k_run``'s dict (it must have evaluated: ``scores`` not None).
        model: the model's name (``"Qwen/Qwen2.5-0.5B-Instruct"``).
        data: where the problems came from (``gsm8k_data``'s ``source``).
        parts_seconds: the notebook's parts and their seconds (``{"load model":
            ..., "probe": ..., "evaluation before": ..., "training": ...,
            "evaluation after": ...}``), as this session measured them.
        contributor: a name to credit, if the learner wants one.
        estimate: the estimate the notebook showed before the run
            (``chapters.gsm8k.chapter9_estimate``'s ``shown``), or None.

    The device, versions and package commit are read here; the sampler from the
    config and the history's ``sampler/...`` fields (:func:`sampler_summary`); the peak memory is
    PyTorch's since the process started (``max_memory_allocated`` and
    ``max_memory_reserved``; None on a CPU). The record passes
    :func:`validate_run_record`.
    """
    scores = result.get("scores")
    if scores is None:
        raise ValueError("the run has no evaluation (gsm8k_run without eval_rows): a record needs before and after")
    history = result["history"]
    step_seconds = sorted(float(row["step_seconds"]) for row in history if "step_seconds" in row)
    median = _median(step_seconds) if step_seconds else 0.0
    import torch
    import grpo_tutorial

    device = _device()

    record = {
        "kind": RECORD_KIND,
        "schema_version": SCHEMA_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "contributor": contributor,
        "package_version": grpo_tutorial.__version__,
        "package_commit": package_commit()["package_commit"],
        "device": device,
        "software": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": _version("transformers"), "peft": _version("peft"), "cuda": torch.version.cuda},
        "model": model,
        "data": data,
        "steps": len(history),
        "resumed_from": int(result["resumed_from"]),
        "settings": json_safe(dataclasses.asdict(result["config"])),
        "seconds": {"per_step_mean": sum(step_seconds) / len(step_seconds) if step_seconds else 0.0,
                    "per_step_median": median,
                    "parts": {str(k): float(v) for k, v in parts_seconds.items()}},
        "peak_memory": _peak_memory(),
        "evaluation": json_safe(scores),
        "sampler": sampler_summary(result["config"], history, on_gpu=device["kind"] == "cuda"),
        "estimate": None if estimate is None else json_safe(estimate),
    }
    return validate_run_record(record)


def validate_run_record(record: Any, where: str = "record") -> dict:
    """``record`` itself when it has every key of :data:`SCHEMA` with the right type and sane values; else ValueError.

    Beyond the types: ``kind`` and ``schema_version`` are this module's,
    ``created`` is an ISO date, accuracies and shares lie in [0, 1], standard
    errors and seconds are not negative, and ``n`` and ``steps`` are positive.
    The error names every problem, each by its key path.
    """
    problems: list[str] = []
    _check(record, SCHEMA, "", problems)
    if not problems and record["schema_version"] >= 2:
        _check(record, SCHEMA_2, "", problems)
        if "estimate" not in record:
            problems.append("estimate is missing")
        elif record["estimate"] is not None:
            _check(record["estimate"], ESTIMATE, "estimate", problems)
    if not problems:
        if record["kind"] != RECORD_KIND:
            problems.append(f"kind is {record['kind']!r}, expected {RECORD_KIND!r}")
        if record["schema_version"] not in (1, SCHEMA_VERSION):
            problems.append(f"schema_version is {record['schema_version']}, this package reads 1 and {SCHEMA_VERSION}")
        try:
            datetime.datetime.fromisoformat(record["created"].replace("Z", "+00:00"))
        except ValueError:
            problems.append(f"created is {record['created']!r}, not an ISO date")
        evaluation = record["evaluation"]
        for scorer in ("strict", "lenient"):
            for key in ("before", "after"):
                _in_unit(evaluation[scorer][key], f"evaluation.{scorer}.{key}", problems)
            for key in ("before_se", "after_se", "gain_se"):
                if not evaluation[scorer][key] >= 0:
                    problems.append(f"evaluation.{scorer}.{key} is {evaluation[scorer][key]}, a standard error is >= 0")
            if not -1 <= evaluation[scorer]["gain"] <= 1:
                problems.append(f"evaluation.{scorer}.gain is {evaluation[scorer]['gain']}, outside [-1, 1]")
        for share in ("boxed", "truncated"):
            for key in ("before", "after"):
                _in_unit(evaluation[share][key], f"evaluation.{share}.{key}", problems)
        for key, value in (("evaluation.n", evaluation["n"]), ("steps", record["steps"])):
            if value < 1:
                problems.append(f"{key} is {value}, expected at least 1")
        for part, seconds in record["seconds"]["parts"].items():
            if not isinstance(seconds, _NUMBER) or isinstance(seconds, bool) or seconds < 0:
                problems.append(f"seconds.parts.{part} is {seconds!r}, expected seconds >= 0")
        if record["schema_version"] >= 2:
            _check_sampler_and_estimate(record, problems)
    if problems:
        raise ValueError(f"{where} is not a chapter 9 run record: " + "; ".join(problems))
    return record


def _check_sampler_and_estimate(record: dict, problems: list[str]) -> None:
    """Schema 2's values: the sampler's timings and counts not negative; the estimate's minutes a (low, high) pair."""
    for key in ("decode_ms_median", "compile_seconds", "fallbacks"):
        value = record["sampler"][key]
        if value is not None and value < 0:
            problems.append(f"sampler.{key} is {value}, expected a number >= 0 (or null where not measured)")
    estimate = record["estimate"]
    if estimate is None:
        return
    minutes = estimate["minutes"]
    if minutes is not None and not (len(minutes) == 2 and all(isinstance(m, _NUMBER) and not isinstance(m, bool)
                                                              for m in minutes) and 0 <= minutes[0] <= minutes[1]):
        problems.append(f"estimate.minutes is {minutes!r}, expected [low, high] with 0 <= low <= high (or null)")
    for key in ("steps", "n_eval"):
        if estimate[key] < 1:
            problems.append(f"estimate.{key} is {estimate[key]}, expected at least 1")


def _check(value: Any, schema: Any, path: str, problems: list[str]) -> None:
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            problems.append(f"{path or 'the record'} is {type(value).__name__}, expected an object")
            return
        for key, sub in schema.items():
            name = f"{path}.{key}" if path else key
            if key not in value:
                problems.append(f"{name} is missing")
            else:
                _check(value[key], sub, name, problems)
        return
    types = schema if isinstance(schema, tuple) else (schema,)
    if isinstance(value, bool) and bool not in types:
        problems.append(f"{path} is a bool, expected {' or '.join(t.__name__ for t in types)}")
    elif not isinstance(value, types):
        problems.append(f"{path} is {type(value).__name__}, expected {' or '.join(t.__name__ for t in types)}")


def _in_unit(value: float, name: str, problems: list[str]) -> None:
    if not 0 <= value <= 1:
        problems.append(f"{name} is {value}, expected a share in [0, 1]")


def write_run_record(path: str | os.PathLike, record: dict) -> Path:
    """Validate ``record`` and write it to ``path`` (a file, or a run folder: then its :data:`RECORD_FILE`)."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_FILE
    validate_run_record(record)
    write_durably(path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    return path


def read_run_record(path: str | os.PathLike) -> dict:
    """A record from ``path`` (a file, or a run folder holding :data:`RECORD_FILE`), validated."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no run record at {str(path)!r}")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{str(path)!r} is not JSON ({err.msg})") from None
    return validate_run_record(record, where=str(path))


def community_records(folder: str | os.PathLike | None = None) -> list[tuple[str, dict]]:
    """The shared records: ``(file name, record)``, oldest first, each validated.

    ``folder`` None: the package's ``grpo_tutorial/data/community/`` (what
    chapter 9 prints); else that folder. Files other than ``*.json`` are skipped.
    """
    folder = resources.files("grpo_tutorial.data").joinpath(COMMUNITY_FOLDER) if folder is None else Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            try:
                record = json.loads(entry.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                raise ValueError(f"community record {entry.name!r} is not JSON ({err.msg})") from None
            found.append((entry.name, validate_run_record(record, where=f"community record {entry.name!r}")))
    return sorted(found, key=lambda item: item[1]["created"])


def record_lines(record: dict, label: str | None = None) -> list[str]:
    """A record in a few printed lines, labelled with who ran it, on what and when (never as the book's number)."""
    device, settings, evaluation = record["device"], record["settings"], record["evaluation"]
    who = f"by {record['contributor']}, " if record.get("contributor") else ""
    adapters = f"LoRA r={settings.get('lora_r')}" if settings.get("use_peft") else "full fine-tuning"
    lines = [
        f"{label or record['model']}: {who}{device['name']}"
        f"{', driver ' + device['driver'] if device.get('driver') else ''}, {record['created'][:10]}, "
        f"package {(record['package_commit'] or record['package_version'])[:10]}",
        f"  {record['steps']} steps, {adapters}, lr {settings.get('learning_rate')}, "
        f"{settings.get('max_new_tokens')} new tokens; {record['seconds']['per_step_mean']:.1f} s a step; "
        + ", ".join(f"{part} {_duration(seconds)}" for part, seconds in record["seconds"]["parts"].items()),
    ]
    for scorer in ("strict", "lenient"):
        s = evaluation[scorer]
        lines.append(f"  {scorer:<8} {s['before']:.3f} -> {s['after']:.3f}, gain {s['gain']:+.3f} ± "
                     f"{s['gain_se']:.3f} (paired, n = {evaluation['n']})")
    peak = record["peak_memory"]["reserved"]
    if peak is not None:
        lines.append(f"  peak GPU memory reserved {peak / 2**30:.2f} GiB")
    sampler, estimate = record.get("sampler"), record.get("estimate")
    if sampler is not None:
        timings = [f"{sampler['decode_ms_median']:.1f} ms a decoding step (median)"] if sampler[
            "decode_ms_median"] is not None else []
        timings += [f"compile {sampler['compile_seconds']:.0f} s"] if sampler["compile_seconds"] else []
        timings += [f"{sampler['fallbacks']} float16 fallbacks"] if sampler["fallbacks"] is not None else []
        lines.append(f"  sampler {sampler['name']}" + (": " + ", ".join(timings) if timings else ""))
    if estimate is not None and estimate["minutes"] is not None:
        low, high = estimate["minutes"]
        session = sum(record["seconds"]["parts"].values()) / 60
        verdict = "within it" if low <= session <= high else "below it" if session < low else "ABOVE it"
        lines.append(f"  estimate shown before the run: {low:.0f} to {high:.0f} min (sampler {estimate['sampler']}, "
                     f"GPU record {str(estimate['gpu_record'])[:10]}); the parts measured: {session:.0f} min, "
                     f"{verdict}")
    return lines



def _duration(seconds: float) -> str:
    """``42 s`` under two minutes, ``3.5 min`` above."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"

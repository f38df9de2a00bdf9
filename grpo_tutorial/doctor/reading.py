"""What the doctor reads: a run's steps, its kept completions and the settings it knows, from wherever they are.

Four kinds of source give one :class:`Run`:

- this package's run folder (``history.jsonl``, ``completions.jsonl``, the
  checkpoint's ``trainer_state.json`` or ``run.json`` for the settings), whole or
  still being written: a last line cut by a kill is left out and the reading is
  *partial*; a damaged line in the middle is skipped and named;
- a trainer (:class:`~grpo_tutorial.trainer.GRPOTrainer`) in memory, or a list of
  history rows;
- TRL's ``trainer_state.json`` (its ``log_history``; a TRL output folder's last
  ``checkpoint-N/``), told apart from this package's checkpoint file by its keys,
  with the completions TRL saved (``completions/completions_*.parquet``, with
  ``log_completions=True``) when pandas can read them; a JSONL file of rows in
  TRL's names (what :func:`trl_rows` writes) reads the same way;
- TensorBoard event files (ours, ``train/<key>``, or TRL's, ``train/reward``),
  with the ``tensorboard`` package.

Every key becomes this package's history name (:data:`TRL_KEYS`), so one set of
rules reads them all. What a source cannot say (TRL logs no accuracy, no
completion's reference answer, no settings) is missing, and the rules that need
it are skipped, by name, with what they needed.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["RunUnreadable", "Run", "TRL_KEYS", "read_run", "run_from_trl", "trl_rows"]

#: TRL's logged names (``GRPOTrainer.log``, TRL 1.16) -> this package's history names.
TRL_KEYS: dict[str, str] = {
    "reward": "reward_mean",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "frac_zero_std",
    "completions/clipped_ratio": "frac_truncated",
    "completions/mean_length": "completion_len_mean",
    "completions/max_length": "completion_len_max",
    "kl": "kl",
    "entropy": "entropy",
    "clip_ratio/region_mean": "clip_frac",
    "clip_ratio/low_mean": "clip_frac_low",
    "clip_ratio/high_mean": "clip_frac_high",
    "grad_norm": "grad_norm",
    "loss": "loss",
    "learning_rate": "lr",
    "tools/call_frequency": "tool_call_frequency",
    "tools/failure_frequency": "tool_failure_frequency",
    "sampling/sampling_logp_difference/mean": "mismatch/logp_diff_mean",
    "sampling/sampling_logp_difference/max": "mismatch/logp_diff_max",
    "eval/accuracy": "eval_accuracy",
}
_OURS_TO_TRL = {ours: trl for trl, ours in TRL_KEYS.items()}
#: Names that only TRL's logs use: a TensorBoard or JSONL source holding one of them is read as TRL's.
_TRL_ONLY = {"reward", "frac_reward_zero_std", "completions/clipped_ratio", "completions/mean_length"}

HISTORY_FILE, COMPLETIONS_FILE, CHECKPOINT, CHECKPOINT_OLD, CRASH_FILE = (
    "history.jsonl", "completions.jsonl", "checkpoint", "checkpoint.old", "crash.json")


class RunUnreadable(ValueError):
    """The source holds nothing the doctor can read (the message says what it looked for)."""


@dataclass
class Run:
    """One run as the rules read it.

    Attributes:
        steps: one dict per logged step, in this package's history names, in step order (``step`` in each).
        completions: kept completion rows (:mod:`grpo_tutorial.run.completions`; TRL's: fewer fields).
        settings: the run's settings where the source records them (``GRPOConfig`` fields), else {}.
        source: ``"grpo_tutorial"``, ``"trl"``, ``"tensorboard"``, ``"memory"``, or ``"probe"`` (chapter 9's
            probe: one step's sampling without an update, read at its one step as advice before a run).
        partial: the reading left something out (a cut last line, a damaged line, a run still being written).
        notes: what was left out, in words.
        where: the path read (None in memory).
        crash: the error that ended the run (``step``, ``error``, ``message``: this package's ``crash.json``),
            else None.
    """

    steps: list[dict]
    completions: list[dict] = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    source: str = "memory"
    partial: bool = False
    notes: list[str] = field(default_factory=list)
    where: str | None = None
    crash: dict | None = None

    def values(self, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` for every step that logged a finite-or-not number under ``key`` (None: left out)."""
        out = []
        for row in self.steps:
            value = row.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            out.append((int(row["step"]), float(value)))
        return out

    def has(self, key: str) -> bool:
        return any(math.isfinite(v) for _, v in self.values(key))

    def setting(self, name: str, default: Any = None) -> Any:
        return self.settings.get(name, default)


# ---------------------------------------------------------------------------
# Reading one line at a time, leaving out what cannot be read
# ---------------------------------------------------------------------------


def _jsonl(path: Path, notes: list[str]) -> tuple[list[dict], bool]:
    """The JSON objects of a JSONL file, and whether something was left out (a cut last line, a damaged one)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise RunUnreadable(f"cannot read {path}: {err.strerror or err}") from None
    rows, partial = [], False
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            partial = True
            if number == len(lines) and not line.endswith("\n"):
                notes.append(f"{path.name}: the last line is cut short (a run being written, or killed); left out")
            else:
                notes.append(f"{path.name}: line {number} is not JSON; left out")
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            partial = True
            notes.append(f"{path.name}: line {number} is not a JSON object; left out")
    return rows, partial


def _number(value: Any) -> Any:
    """A logged value as a float where it is a number (None stays None: a value not computed)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)  # "NaN", "Infinity" in some writers
        except ValueError:
            return value
    return value


def _clean_steps(rows: Iterable[Mapping], notes: list[str]) -> list[dict]:
    """Rows with an integer ``step``, one per step (the last written wins: a resumed run redoes steps), in order."""
    by_step: dict[int, dict] = {}
    missing = 0
    for row in rows:
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(float(step)):
            missing += 1
            continue
        by_step[int(step)] = {**{k: _number(v) for k, v in row.items()}, "step": int(step)}
    if missing:
        notes.append(f"{missing} rows without a step number left out")
    return [by_step[s] for s in sorted(by_step)]


# ---------------------------------------------------------------------------
# The sources
# ---------------------------------------------------------------------------


def _our_settings(root: Path) -> dict:
    """The config of this package's run folder: its checkpoint's (either copy), else the command line's ``run.json``."""
    for candidate in (root / CHECKPOINT / "trainer_state.json", root / CHECKPOINT_OLD / "trainer_state.json",
                      root / "run.json"):
        try:
            data = json.loads(candidate.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("config"), dict):
            return dict(data["config"])
    return {}


def _read_our_folder(root: Path) -> Run:
    notes: list[str] = []
    rows, partial = _jsonl(root / HISTORY_FILE, notes)
    steps = _clean_steps(rows, notes)
    if not steps:
        raise RunUnreadable(f"{root / HISTORY_FILE} holds no finished step yet" + (
            f" ({'; '.join(notes)})" if notes else "") + "; run the doctor once a step has ended")
    completions: list[dict] = []
    if (root / COMPLETIONS_FILE).exists():
        completions, cut = _jsonl(root / COMPLETIONS_FILE, notes)
        partial = partial or cut
        last = steps[-1]["step"]
        later = [c for c in completions if isinstance(c.get("step"), int) and c["step"] > last]
        if later:  # written for a step whose history line is not there yet: the run is being written
            partial = True
            notes.append(f"completions of {len({c['step'] for c in later})} steps past the history's last; left out")
            completions = [c for c in completions if c not in later]
    return Run(steps, completions, _our_settings(root), "grpo_tutorial", partial, notes, str(root), _crash(root))


def _crash(root: Path) -> dict | None:
    """``crash.json`` (:mod:`grpo_tutorial.run.crash`), read here without importing the run machinery."""
    try:
        data = json.loads((root / CRASH_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no crash, or a file cut while written: nothing to add
        return None
    if isinstance(data, dict) and isinstance(data.get("step"), int) and isinstance(data.get("error"), str):
        return {"step": data["step"], "error": data["error"], "message": str(data.get("message", ""))}
    return None


def _is_trl_state(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("log_history"), list)


def trl_rows(rows: Sequence[Mapping], *, keep_unknown: bool = False) -> list[dict]:
    """This package's history rows in TRL's logged names (:data:`TRL_KEYS`), as TRL 1.16 would log the same
    numbers: what another tool that reads TRL's logs sees of a run. A key TRL does not log is left out
    (``keep_unknown=True`` keeps it), and ``reward/<fn>`` becomes ``rewards/<fn>/mean``."""
    out = []
    for row in rows:
        trl: dict[str, Any] = {"step": row["step"]}
        for key, value in row.items():
            if key in _OURS_TO_TRL:
                trl[_OURS_TO_TRL[key]] = value
            elif key.startswith("reward/"):
                trl[f"rewards/{key.removeprefix('reward/')}/mean"] = value
            elif keep_unknown and key != "step":
                trl[key] = value
        out.append(trl)
    return out


def _from_trl(row: Mapping) -> dict:
    """One TRL log row in this package's names."""
    ours: dict[str, Any] = {}
    for key, value in row.items():
        if key in TRL_KEYS:
            ours[TRL_KEYS[key]] = value
        elif key.startswith("rewards/") and key.endswith("/mean"):
            ours[f"reward/{key[len('rewards/'):-len('/mean')]}"] = value
        elif key.startswith("train/"):
            continue
        else:
            ours[key] = value
    return ours


def run_from_trl(rows: Sequence[Mapping], settings: Mapping | None = None) -> Run:
    """A :class:`Run` from rows in TRL's logged names (TRL's ``log_history``, rldoctor's simulated runs)."""
    notes: list[str] = []
    steps = _clean_steps((_from_trl(r) for r in rows), notes)
    if not steps:
        raise RunUnreadable("no rows with a step number")
    return Run(steps, [], dict(settings or {}), "trl", bool(notes), notes, None)


def _trl_completions(folder: Path, notes: list[str]) -> list[dict]:
    """TRL's saved completions (``completions/completions_<step>.parquet``) as kept rows, when pandas reads them."""
    files = sorted((folder / "completions").glob("completions_*.parquet")) if (folder / "completions").is_dir() else []
    if not files:
        return []
    try:
        import pandas as pd
    except ImportError:
        notes.append("TRL's completions are parquet files and pandas is not installed; read without them")
        return []
    rows: list[dict] = []
    fixed = {"step", "prompt", "completion", "advantage"}
    for path in files:
        try:
            frame = pd.read_parquet(path)
        except Exception as err:  # pyarrow missing, a file cut short: leave it out, say so
            notes.append(f"{path.name} could not be read ({type(err).__name__}); left out")
            continue
        for record in frame.to_dict("records"):
            rewards = {k: _number(v) for k, v in record.items() if k not in fixed}
            rewards = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rewards.items()
                       if isinstance(v, (int, float)) or v is None}
            rows.append({"step": int(record.get("step", 0)), "prompt": record.get("prompt"),
                         "completion": record.get("completion"), "rewards": rewards,
                         "advantage": _number(record.get("advantage"))})
    return rows


def _read_trl_state(path: Path, data: dict) -> Run:
    notes: list[str] = []
    logged = [row for row in data["log_history"] if isinstance(row, dict) and "reward" in row]
    steps = _clean_steps((_from_trl(row) for row in logged), notes)
    if not steps:
        raise RunUnreadable(f"{path}: TRL's log_history holds no training step with a reward (logging_steps, or a "
                            "run stopped before its first log)")
    folder = path.parent.parent if path.parent.name.startswith("checkpoint-") else path.parent
    completions = _trl_completions(folder, notes)
    settings = {}
    max_steps = data.get("max_steps")
    if isinstance(max_steps, int) and steps[-1]["step"] < max_steps:
        notes.append(f"TRL's state stops at step {steps[-1]['step']} of max_steps={max_steps}")
    return Run(steps, completions, settings, "trl", bool(notes), notes, str(path))


def _latest_trl_state(root: Path) -> Path | None:
    """A TRL output folder's newest ``checkpoint-N/trainer_state.json``."""
    best = None
    for child in root.glob("checkpoint-*"):
        suffix = child.name.removeprefix("checkpoint-")
        if suffix.isdigit() and (child / "trainer_state.json").is_file():
            if best is None or int(suffix) > best[0]:
                best = (int(suffix), child / "trainer_state.json")
    return None if best is None else best[1]


def _event_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path] if path.name.startswith("events.out.tfevents") else []
    return sorted(p for p in path.rglob("events.out.tfevents*") if p.is_file())


def _read_tensorboard(path: Path) -> Run:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise RunUnreadable(f"{path} holds TensorBoard event files; reading them needs the tensorboard package "
                            "(pip install tensorboard)") from None
    folder = path if path.is_dir() else path.parent
    by_step: dict[int, dict] = {}
    notes: list[str] = []
    folders = sorted({p.parent for p in _event_files(path)})
    for events in folders:
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})  # 0: keep every point
        try:
            accumulator.Reload()
        except Exception as err:  # a damaged event file: what was read before it stays
            notes.append(f"{events}: {type(err).__name__} while reading; read up to it")
        for tag in accumulator.Tags().get("scalars", []):
            key = tag.removeprefix("train/")
            for event in accumulator.Scalars(tag):
                by_step.setdefault(int(event.step), {"step": int(event.step)})[key] = float(event.value)
    rows = [by_step[s] for s in sorted(by_step)]
    if not rows:
        raise RunUnreadable(f"the TensorBoard events under {folder} hold no scalars yet")
    if any(_TRL_ONLY & set(row) for row in rows):
        rows = [_from_trl(row) | {"step": row["step"]} for row in rows]
        source = "trl"
    else:
        source = "tensorboard"
    steps = _clean_steps(rows, notes)
    return Run(steps, [], {}, source, bool(notes), notes, str(path))


def _read_jsonl_rows(path: Path) -> Run:
    """A JSONL file of step rows: this package's ``history.jsonl`` (read with its folder), or rows in TRL's names."""
    if path.name == HISTORY_FILE:
        return _read_our_folder(path.parent)
    notes: list[str] = []
    rows, partial = _jsonl(path, notes)
    trl = any(_TRL_ONLY & set(row) for row in rows)
    steps = _clean_steps((_from_trl(r) if trl else r for r in rows), notes)
    if not steps:
        raise RunUnreadable(f"{path} holds no rows with a step number")
    return Run(steps, [], {}, "trl" if trl else "grpo_tutorial", partial, notes, str(path))


def read_run(source: Any) -> Run:
    """A :class:`Run` from a path (a run folder, TRL's output folder or ``trainer_state.json``, TensorBoard
    events, a JSONL of rows), a trainer, or a list of history rows. Raises :class:`RunUnreadable`, with what
    it looked for, when there is nothing to read."""
    if isinstance(source, Run):
        return source
    if hasattr(source, "history") and hasattr(source, "config") and not isinstance(source, (str, os.PathLike)):
        config = source.config.to_dict() if hasattr(source.config, "to_dict") else {}
        notes: list[str] = []
        steps = _clean_steps(source.history, notes)
        if not steps:
            raise RunUnreadable("the trainer has taken no step yet")
        return Run(steps, list(getattr(source, "completions", [])), config, "memory", False, notes, None)
    if isinstance(source, (list, tuple)):
        notes = []
        steps = _clean_steps(source, notes)
        if not steps:
            raise RunUnreadable("no history rows with a step number")
        return Run(steps, [], {}, "memory", False, notes, None)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"read_run takes a path, a trainer or a list of history rows, got {type(source).__name__}")
    path = Path(source)
    if not path.exists():
        raise RunUnreadable(f"{path} does not exist")
    if path.is_file():
        if path.name.startswith("events.out.tfevents"):
            return _read_tensorboard(path)
        if path.suffix == ".jsonl":
            return _read_jsonl_rows(path)
        if path.name == "trainer_state.json" or path.suffix == ".json":
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as err:
                raise RunUnreadable(f"{path} is not readable JSON ({err}); was it cut short?") from None
            if _is_trl_state(data):
                return _read_trl_state(path, data)
            if isinstance(data, dict) and "config" in data and "step" in data:  # this package's checkpoint file
                root = path.parent.parent if path.parent.name in (CHECKPOINT, CHECKPOINT_OLD) else path.parent
                if (root / HISTORY_FILE).exists():
                    return _read_our_folder(root)
                raise RunUnreadable(f"{path} is this package's checkpoint, which keeps no history; the steps are "
                                    f"in the run folder's {HISTORY_FILE}, not found in {root}")
        raise RunUnreadable(f"{path} is not a file the doctor reads (history.jsonl, completions rows, TRL's "
                            "trainer_state.json, TensorBoard events)")
    if (path / HISTORY_FILE).exists():
        return _read_our_folder(path)
    trl_state = path / "trainer_state.json"
    if trl_state.is_file():
        return read_run(trl_state)
    latest = _latest_trl_state(path)
    if latest is not None:
        return read_run(latest)
    if _event_files(path):
        return _read_tensorboard(path)
    raise RunUnreadable(f"{path} holds no run: no {HISTORY_FILE} (this package's), no trainer_state.json or "
                        "checkpoint-N/ (TRL's), no TensorBoard events")

"""Kill -9 a training run, resume it, and get exactly the uninterrupted history.

Issue 6: a run killed with SIGKILL at any moment, then resumed, must produce a
history identical to an uninterrupted run with the same seed (on CPU), with no
step duplicated or missing. Only the wall-clock fields (TIMING_KEYS) may differ.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_tutorial.trainer import TIMING_KEYS

STEPS = 12
ARGS = [
    "train", "--model", "tiny", "--task", "addition", "--digits", "1",
    "--steps", str(STEPS), "--checkpoint-every", "2",
    "--prompts-per-step", "4", "--group-size", "4", "--n-train", "200", "--n-eval", "20",
    "--sft-steps", "0",  # from the untrained model: this is about resuming, not learning
    # partial credit gives a random model varied rewards, so every step really updates
    "--reward", "partial_credit", "--beta", "0.05", "--seed", "3",
    "--threads", "1", "--no-progress",
]
ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")


def _start(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_tutorial", *ARGS, "--out", str(out), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )


def _complete_rows(path: Path) -> int:
    if not path.exists():
        return 0
    return path.read_text(encoding="utf-8").count("\n")


def _kill_after(proc: subprocess.Popen, history: Path, rows: int, timeout: float = 120) -> int:
    """SIGKILL ``proc`` once ``history`` has at least ``rows`` complete rows; return the count seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = _complete_rows(history)
        if seen >= rows:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            return seen
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before it could be killed:\n{proc.stderr.read()}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"no {rows} history rows within {timeout} s")


def _finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out


def _comparable(path: Path) -> list[str]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [json.dumps({k: v for k, v in r.items() if k not in TIMING_KEYS}, sort_keys=True) for r in rows]


@pytest.mark.slow
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path):
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    reference = _start(reference_dir)  # runs alongside the killed one
    victim = _start(killed_dir)
    history = killed_dir / "history.jsonl"

    seen = _kill_after(victim, history, rows=5)
    assert victim.returncode == -signal.SIGKILL and seen >= 5

    printed = _finish(_start(killed_dir, "--resume"))
    _finish(reference)
    assert "resuming from" in printed  # it really continued from a checkpoint
    step = int(printed.split("at step ")[1].split()[0])
    assert step >= 4 and step % 2 == 0 and step <= seen

    expected = _comparable(reference_dir / "history.jsonl")
    got = _comparable(history)
    assert [json.loads(r)["step"] for r in got] == list(range(1, STEPS + 1))  # none missing or doubled
    assert got == expected
    rows = [json.loads(r) for r in expected]
    assert sum(r["reward_std"] > 0 for r in rows) >= STEPS // 2  # the runs had a learning signal
    assert all(r["kl"] >= 0 for r in rows) and rows[-1]["kl"] > 0  # and the policy moved


@pytest.mark.slow
def test_five_sigkills_at_random_moments_then_resume_match_an_uninterrupted_run(tmp_path):
    """Issue 15: kill -9 five times (after a random number of rows, plus a random delay
    that lands anywhere in a step or a checkpoint save), resuming after each kill."""
    import random

    rng = random.Random(15)
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    reference = _start(reference_dir)
    history = killed_dir / "history.jsonl"
    thresholds = sorted(rng.sample(range(2, STEPS), 5))
    kills = 0
    for i, rows in enumerate(thresholds):
        victim = _start(killed_dir, *(["--resume"] if i else []))
        deadline = time.monotonic() + 120
        while _complete_rows(history) < rows and victim.poll() is None:
            assert time.monotonic() < deadline, f"no {rows} history rows within 120 s"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))
        if victim.poll() is None:
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(timeout=30)
            assert victim.returncode == -signal.SIGKILL
            kills += 1
        else:  # it finished before the kill landed: nothing left to interrupt
            assert victim.returncode == 0, victim.stderr.read()
            break
    _finish(_start(killed_dir, "--resume"))
    _finish(reference)
    assert kills >= 4  # the moments really interrupted the run
    got, expected = _comparable(history), _comparable(reference_dir / "history.jsonl")
    assert [json.loads(r)["step"] for r in got] == list(range(1, STEPS + 1))
    assert got == expected

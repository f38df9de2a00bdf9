"""Issue 6, items 2 and 4: the same seed gives the same run in two processes; nothing is lost on a kill.

The determinism test goes through the command line, as a learner would run it:
one run in a fresh subprocess (its own PYTHONHASHSEED) and the same command in
this pytest process, after whatever other tests have done to its global state.
It covers the warm start, GRPO with a reference model, checkpoints and the final
evaluation. Only the wall-clock fields may differ. A third run with another seed
must differ. (tests/test_trainer.py checks the same through the Python API.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from grpo_tutorial.__main__ import main
from grpo_tutorial.tasks import make_arithmetic_dataset
from grpo_tutorial.trainer import TIMING_KEYS, GRPOConfig, GRPOTrainer, GRPOWarning, find_checkpoint, read_history

from conftest import SMALL_SHAPE
from helpers import length_reward, small_model

STEPS = 4
ARGS = [
    "train", "--model", "tiny", "--task", "addition", "--digits", "1",
    "--steps", str(STEPS), "--checkpoint-every", "2",
    "--prompts-per-step", "4", "--group-size", "4", "--num-iterations", "2",
    "--minibatch-size", "none",  # one update per pass over the 16 completions
    "--n-train", "64", "--n-eval", "16", "--sft-steps", "3", "--sft-target-accuracy", "none", "--eval-after",
    # partial credit gives a random model varied rewards, so every step updates
    "--reward", "partial_credit", "--beta", "0.05",
    "--threads", "1", "--no-progress",
]


def _start(out: Path, seed: int) -> subprocess.Popen:
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="12345",
        PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_tutorial", *ARGS, "--seed", str(seed), "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )


def _run_here(out: Path, seed: int) -> None:
    """The same command, run by main() inside this process."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*ARGS, "--seed", str(seed), "--out", str(out)]) == 0


def _without_timing(row: dict) -> str:
    return json.dumps({k: v for k, v in row.items() if k not in TIMING_KEYS}, sort_keys=True)


def _record(out: Path) -> dict:
    """What a run leaves behind, minus wall-clock times: history, evaluation and final weights."""
    evals = json.loads((out / "eval.json").read_text(encoding="utf-8"))
    state = torch.load(out / "checkpoint" / "state.pt", map_location="cpu", weights_only=True)
    return {
        "history": [_without_timing(r) for r in read_history(out)],
        "eval_after": json.dumps({k: v for k, v in evals["after"].items() if k != "seconds"}, sort_keys=True),
        "sft_steps": evals["sft"]["steps"],
        "weights": state["model"],
    }


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_same_seed_same_run_across_processes_and_another_seed_differs(tmp_path, restore_threads, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    proc = _start(tmp_path / "a", seed=0)  # runs while this process does the other two
    _run_here(tmp_path / "b", seed=0)
    _run_here(tmp_path / "c", seed=1)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"the subprocess run failed:\n{err}"
    a, b, c = (_record(tmp_path / name) for name in "abc")

    assert len(a["history"]) == STEPS and a["sft_steps"] == 3
    assert [json.loads(r)["step"] for r in a["history"]] == list(range(1, STEPS + 1))
    rows = [json.loads(r) for r in a["history"]]
    assert all(r["reward_std"] > 0 for r in rows) and rows[-1]["kl"] > 0  # the policy really moved

    # same seed, two processes: every logged number, the evaluation and the weights agree exactly
    assert a["history"] == b["history"]
    assert a["eval_after"] == b["eval_after"]
    assert _same_weights(a["weights"], b["weights"])

    # another seed: a different run
    assert a["history"][0] != c["history"][0] and a["history"][-1] != c["history"][-1]
    assert not _same_weights(a["weights"], c["weights"])


def test_history_file_holds_every_finished_step_while_training(run_dir, small_policy):
    """history.jsonl is flushed after each step, so a kill loses at most the step in progress."""
    out = run_dir
    seen_on_disk = []

    def watching_reward(completions, **kwargs):
        # called during step k (stage 2): steps 1..k-1 must already be readable
        path = out / "history.jsonl"
        seen_on_disk.append([r["step"] for r in read_history(path)] if path.exists() else None)
        return [float(len(c)) for c in completions]

    model, tok = small_policy
    config = GRPOConfig(group_size=4, prompts_per_step=2, max_new_tokens=3, output_dir=str(out))
    trainer = GRPOTrainer(model, tok, watching_reward, config)
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(8)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        history = trainer.train(rows, 3, progress=False)
    assert seen_on_disk == [[], [1], [1, 2]]
    # the file holds exactly what train returned, timings included (NaN compares equal as text)
    assert [json.dumps(r, sort_keys=True) for r in read_history(out)] == [json.dumps(r, sort_keys=True) for r in history]


# ---------------------------------------------------------------------------
# SIGKILL in the middle of writing a checkpoint
# ---------------------------------------------------------------------------

DIES_WHILE_SAVING = textwrap.dedent(
    """
    import io, os, signal, sys, warnings
    import torch
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from grpo_tutorial.models import build_tiny_policy
    from grpo_tutorial.tasks import make_arithmetic_dataset
    from grpo_tutorial.trainer import GRPOConfig, GRPOTrainer

    def length_reward(completions, **kwargs):
        return [float(len(c)) for c in completions]

    real_save, saves = torch.save, []

    def dying_save(obj, path):
        saves.append(path)
        if len(saves) == 2:  # the second checkpoint: write half of state.pt, then die
            buffer = io.BytesIO()
            real_save(obj, buffer)
            half = buffer.getvalue()[: len(buffer.getvalue()) // 2]
            if hasattr(path, "write"):  # the package saves into an open file
                fh = path
                fh.write(half)
                fh.flush()
                os.fsync(fh.fileno())
            else:
                with open(path, "wb") as fh:
                    fh.write(half)
                    fh.flush()
                    os.fsync(fh.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        real_save(obj, path)

    torch.save = dying_save
    model, tok = build_tiny_policy(**SMALL_SHAPE, seed=0)
    cfg = GRPOConfig(group_size=4, prompts_per_step=2, max_new_tokens=3, beta=0.05,
                     checkpoint_every=2, output_dir=sys.argv[1])
    GRPOTrainer(model, tok, length_reward, cfg).train(make_arithmetic_dataset(16, 0, digits=1), 6, progress=False)
    """
)


def _small_run(steps: int, out: Path | None = None, resume: bool = False) -> list[dict]:
    model, tok = small_model(seed=0)
    cfg = GRPOConfig(
        group_size=4, prompts_per_step=2, max_new_tokens=3, beta=0.05,
        checkpoint_every=2, output_dir=None if out is None else str(out),
    )
    trainer = GRPOTrainer(model, tok, length_reward, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        return trainer.train(make_arithmetic_dataset(16, 0, digits=1), steps, resume=resume, progress=False)


@pytest.mark.slow
def test_sigkill_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, run_dir):
    out = run_dir
    script = tmp_path / "dies.py"
    script.write_text(f"SMALL_SHAPE = {SMALL_SHAPE!r}\n{DIES_WHILE_SAVING}")
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, str(script), str(out)], stderr=subprocess.PIPE, text=True, env=env)
    uninterrupted = _small_run(6)  # meanwhile, in this process
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err

    # killed half-way through state.pt of the step-4 checkpoint: the step-2 one is intact
    partial = out / "checkpoint.tmp" / "state.pt"
    assert partial.exists() and not (out / "checkpoint.tmp" / "trainer_state.json").exists()
    with pytest.raises(Exception):
        torch.load(partial, weights_only=True)  # really a torn file
    assert find_checkpoint(out) == out / "checkpoint"
    assert json.loads((out / "checkpoint" / "trainer_state.json").read_text())["step"] == 2
    assert [r["step"] for r in read_history(out)] == [1, 2, 3, 4]  # rows 3-4 were logged, not checkpointed

    resumed = _small_run(6, out, resume=True)
    assert [_without_timing(r) for r in resumed] == [_without_timing(r) for r in uninterrupted]
    assert [_without_timing(r) for r in read_history(out)] == [_without_timing(r) for r in uninterrupted]
    assert not (out / "checkpoint.tmp").exists()
    assert json.loads((out / "checkpoint" / "trainer_state.json").read_text())["step"] == 6

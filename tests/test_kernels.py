"""The kernel fingerprint: what decides whether a record or a golden run can be compared bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_tutorial.env import KERNEL_VARIABLES, describe_kernels, kernel_fingerprint

ROOT = Path(__file__).resolve().parent.parent


def _fingerprint_in_subprocess(**variables: str) -> str:
    env = {**os.environ, **variables, "CUDA_VISIBLE_DEVICES": ""}  # this process's kernel variables, and these
    code = "from grpo_tutorial.env import kernel_fingerprint; print(kernel_fingerprint())"
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_fingerprint_repeats_and_leaves_threads_and_rng_alone():
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    first = kernel_fingerprint()
    assert torch.equal(torch.rand(3), want), "the probe moved the global RNG"
    assert torch.get_num_threads() == threads
    assert kernel_fingerprint() == first and len(first) == 16
    int(first, 16)  # hex


def test_fingerprint_is_the_same_in_a_fresh_process():
    assert _fingerprint_in_subprocess() == kernel_fingerprint()


@pytest.mark.slow
def test_fingerprint_changes_with_the_kernels_when_the_cpu_name_does_not():
    """Unvectorised ATen kernels round differently; PyTorch's capability is the only thing that says so.

    The probe also tells apart what the capability cannot see (measured on an Intel
    Xeon, capability AVX512 throughout: MKL_ENABLE_INSTRUCTIONS=AVX2 alone changes the
    fingerprint), but that depends on the BLAS the machine has, so only the ATen switch,
    which every x86 and ARM build honours, is asserted.
    """
    if torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "default"):
        pytest.skip("this CPU already runs PyTorch's unvectorised kernels: there is no other set to switch to")
    assert _fingerprint_in_subprocess(ATEN_CPU_CAPABILITY="default") != kernel_fingerprint()


def test_describe_kernels_names_the_fingerprint_and_the_variables(monkeypatch):
    for name in KERNEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_CBWR", "AUTO")
    info = describe_kernels(threads=1)
    assert info["fingerprint"] == kernel_fingerprint(1) and info["threads"] == 1
    assert info["variables"] == {"MKL_CBWR": "AUTO"}
    assert info["torch"] == torch.__version__ and info["cpu"]
    json.dumps(info)  # stored in records as it is


def test_threads_are_checked():
    with pytest.raises((TypeError, ValueError), match="threads"):
        kernel_fingerprint(0)

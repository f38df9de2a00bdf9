"""The kernel fingerprint: what decides whether a record or a golden run can be compared bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_tutorial.env import KERNEL_VARIABLES, describe_kernels, kernel_fingerprint, kernel_variables

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


def test_describe_kernels_names_the_fingerprint_and_the_variables():
    # The variables come from a mapping, not from this process's environment: a test that changed the kernel
    # variables in its own process before the kernels started would change the kernels of every test after it
    # (issue 52's flake; test_kernel_variables_are_obeyed_only_at_the_start below).
    env = {"MKL_CBWR": "AUTO", "PATH": "/bin", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    info = describe_kernels(threads=1, env=env)
    assert info["fingerprint"] == kernel_fingerprint(1) and info["threads"] == 1
    assert info["variables"] == {"MKL_CBWR": "AUTO", "ONEDNN_MAX_CPU_ISA": "AVX2"} == kernel_variables(env)
    assert describe_kernels(threads=1)["variables"] == kernel_variables() == {
        k: os.environ[k] for k in KERNEL_VARIABLES if k in os.environ}
    assert info["torch"] == torch.__version__ and info["cpu"]
    json.dumps(info)  # stored in records as it is


#: What a test that changed the kernel variables in its own process did (test_kernels.py before issue 52): unset
#: them, set MKL_CBWR, compute, put them back. Run as the first thing in a fresh process, with or without
#: conftest's start_kernels() before it.
LEAK = """
import os, sys
sys.path.insert(0, {tests!r})
from grpo_tutorial.env import KERNEL_VARIABLES, kernel_fingerprint
if {start}:
    from conftest import start_kernels
    start_kernels()
saved = dict(os.environ)
for name in KERNEL_VARIABLES:
    os.environ.pop(name, None)
os.environ["MKL_CBWR"] = "AUTO"
kernel_fingerprint()
os.environ.clear()
os.environ.update(saved)
print(kernel_fingerprint())
"""


@pytest.mark.slow
def test_kernel_variables_are_obeyed_only_at_the_start():
    """Issue 52's flake, at its cause: the kernel variables choose the kernels when a process first runs them.

    In the kernel-variant pass a worker whose first test unset the variables ran every later test on the
    machine's default kernels, while the subprocess of tests/test_determinism.py ran on the variant's: the two
    runs differed from step 1. conftest's ``start_kernels`` starts ATen's dispatch, MKL and oneDNN when a test
    process starts, so no test can choose them again.
    """
    variables = {"ATEN_CPU_CAPABILITY": "default"}  # honoured on every x86 and ARM build
    if torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "default"):
        pytest.skip("this CPU already runs PyTorch's unvectorised kernels: there is no other set to switch to")
    wanted = _fingerprint_in_subprocess(**variables)
    assert wanted != _fingerprint_in_subprocess()

    def run(start: bool) -> str:
        env = {**os.environ, **variables, "CUDA_VISIBLE_DEVICES": ""}
        code = LEAK.format(tests=str(ROOT / "tests"), start=start)
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip().splitlines()[-1]

    assert run(start=False) != wanted  # the leak: the variables put back, but no longer obeyed
    assert run(start=True) == wanted  # started first: the variables the process began with hold


def test_threads_are_checked():
    with pytest.raises((TypeError, ValueError), match="threads"):
        kernel_fingerprint(0)

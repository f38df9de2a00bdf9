"""Print the kernel variables `make test-kernels` runs under: ones that change this machine's kernels.

The first choice stands in for another kind of CPU while keeping the machine's vector
width for PyTorch's own kernels' neighbours: AVX2 for ATen, MKL and oneDNN. On a CPU where
that changes nothing (an AVX2 machine), ATen's unvectorised kernels are added. The pass
would prove nothing if its fingerprint were this machine's default one, so that is an error.
"""

from __future__ import annotations

import os
import subprocess
import sys

CHOICES = (
    {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
)
CODE = "from grpo_tutorial.env import kernel_fingerprint; print(kernel_fingerprint({}))"
#: The thread counts records are made at: the default kernels' fingerprint at each goes to the variant pass
#: as GRPO_MAIN_PASS_KERNELS, so that tests/test_records.py knows which records the first pass compared
#: bit for bit (it re-runs only those).
RECORD_THREADS = (1, 2)


def fingerprint(variables: dict[str, str], threads: int | None = None) -> str:
    env = {**os.environ, **variables}
    code = CODE.format("" if threads is None else threads)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def main() -> None:
    default = fingerprint({})
    for variables in CHOICES:
        other = fingerprint(variables)
        if other != default:
            print(f"kernel variant: fingerprint {other} (default kernels here: {default})", file=sys.stderr)
            main_pass = ",".join(f"{t}:{fingerprint({}, t)}" for t in RECORD_THREADS)
            print(" ".join(f"{k}={v}" for k, v in variables.items()) + f" GRPO_MAIN_PASS_KERNELS={main_pass}")
            return
    sys.exit(f"no kernel variables change this machine's kernels (fingerprint {default}): the pass would prove nothing")


if __name__ == "__main__":
    main()

"""What `make test-kernels` runs under, and which chapters it re-runs.

``python .ci/kernel_variant.py`` prints the kernel variables that change this machine's
kernels. The first choice stands in for another kind of CPU while keeping the machine's
vector width for PyTorch's own kernels' neighbours: AVX2 for ATen, MKL and oneDNN. On a
CPU where that changes nothing (an AVX2 machine), ATen's unvectorised kernels are added.
The pass would prove nothing if its fingerprint were this machine's default one, so that
is an error. With them goes ``GRPO_MAIN_PASS_KERNELS``, the default kernels' fingerprints,
so that tests/test_records.py re-runs only the records the first pass compared bit for bit.

``python .ci/kernel_variant.py --notebooks`` prints the chapters to re-run for the same
reason: a chapter that replays a committed record (chapter 8 the tiny-learning seeds,
chapter 15 the mismatch sweep, ...) shows that record's exact numbers where this machine's
kernels are the record's, and there only the variant pass shows that its claims hold on
other kernels. Everywhere else `make test` already ran it on kernels other than its
record's, and a second run under the variables would add minutes and nothing new.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHOICES = (
    {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
)
CODE = "from grpo_tutorial.env import kernel_fingerprint; print(kernel_fingerprint({}))"
#: The thread counts records are made at: the default kernels' fingerprint at each goes to the variant pass
#: as GRPO_MAIN_PASS_KERNELS.
RECORD_THREADS = (1, 2)
#: The chapters whose live runs replay a committed record, and those records (package data).
REPLAYS = {
    "notebooks/07_one_training_step.ipynb": ("step_policy.safetensors",),
    "notebooks/08_tiny_transformer.ipynb": ("tiny_learning.json",),
    "notebooks/12_grpo_lab.ipynb": ("lab_results.json",),
    "notebooks/13_thinking_longer.ipynb": ("thinking_results.json",),
    "notebooks/14_lora.ipynb": ("lora_regret.json", "lora_regret_lower.json"),
    "notebooks/15_sampler_mismatch.ipynb": ("sampler_mismatch.json",),
    "notebooks/16_tools_in_the_loop.ipynb": ("tool_results.json",),
}


def fingerprint(variables: dict[str, str], threads: int | None = None) -> str:
    env = {**os.environ, **variables}
    code = CODE.format("" if threads is None else threads)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def record_kernels(name: str) -> dict | None:
    """The kernels a record was made with (None for a record made before fingerprints)."""
    path = ROOT / "grpo_tutorial" / "data" / name
    if name.endswith(".safetensors"):
        import struct

        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            metadata = json.loads(f.read(n)).get("__metadata__", {})
        return json.loads(metadata["kernels"]) if "kernels" in metadata else None
    record = json.loads(path.read_text(encoding="utf-8"))
    return record.get("kernels") or (record.get("machine") or {}).get("kernels")


def replayed_here(threads_fingerprints: dict[int, str]) -> list[str]:
    """The chapters one of whose records carries this machine's default fingerprint."""
    chosen = []
    for notebook, records in REPLAYS.items():
        for name in records:
            kernels = record_kernels(name)
            if kernels and threads_fingerprints.get(kernels["threads"]) == kernels["fingerprint"]:
                chosen.append(notebook)
                break
    return chosen


def main(argv: list[str]) -> None:
    default = {t: fingerprint({}, t) for t in RECORD_THREADS}
    if argv == ["--notebooks"]:
        chosen = replayed_here(default)
        print(f"kernel variant: chapters whose record has this machine's kernels: {chosen or 'none'}", file=sys.stderr)
        print(" ".join(chosen))
        return
    if argv:
        sys.exit(f"usage: {sys.argv[0]} [--notebooks]")
    here = fingerprint({})
    for variables in CHOICES:
        other = fingerprint(variables)
        if other != here:
            print(f"kernel variant: fingerprint {other} (default kernels here: {here})", file=sys.stderr)
            main_pass = ",".join(f"{t}:{fp}" for t, fp in default.items())
            print(" ".join(f"{k}={v}" for k, v in variables.items()) + f" GRPO_MAIN_PASS_KERNELS={main_pass}")
            return
    sys.exit(f"no kernel variables change this machine's kernels (fingerprint {here}): the pass would prove nothing")


if __name__ == "__main__":
    main(sys.argv[1:])

"""`make test-portability`: the kernel-sensitive tests under every kernel set this machine can be told to use.

A diagnostic (issue 52), not a CI phase. It tries the kernel variables' values (ATen's capability,
MKL's reproducibility mode and instruction set, oneDNN's instruction-set cap), computes each
combination's kernel fingerprint (`grpo_tutorial.env.kernel_fingerprint`, at one and two threads)
in a fresh process, keeps one combination per distinct fingerprint (the one with the fewest
variables: four aliases of one kernel set count once), and runs under each

- the record, golden, inspection, determinism and kernel tests (`make test-kernels`' list), every
  record test on its other-kernel path where the set is not the record's, and
- with ``--notebooks``, the chapters that replay a record (`.ci/kernel_variant.py`'s REPLAYS),

with ``GRPO_FLOAT_CHECK_LOG`` set, so that every float check of `tests/allowances.py` (and the
record tests' seed checks) writes what it saw. With ``--python`` it does the same with other
environments' interpreters (`make colab-env`'s `.venv-colab`, the torch-latest venv), at their
default kernels and the same variable sets. It writes ``runs/portability/portability.json`` (every
variant, its fingerprint, pytest's summary, every check it logged) and ``table.md``: one row per
variant, then each float check's largest share of its margin used, over the variants, so the
sensitive checks stand out. The remedy for a sensitive check is its category (CONTRIBUTING.md,
"Floats and seeds in tests"), never a wider allowance.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / ".ci"))

from kernel_variant import REPLAYS  # noqa: E402

#: The values tried for each variable (None: unset). MKL_CBWR's modes and MKL's and oneDNN's instruction sets
#: each pick other kernels on x86; a value the CPU lacks falls back or is refused, and the fingerprint says which.
VALUES = {
    "ATEN_CPU_CAPABILITY": (None, "default", "avx2", "avx512"),
    "MKL_CBWR": (None, "COMPATIBLE", "AVX2", "AVX512"),
    "MKL_ENABLE_INSTRUCTIONS": (None, "AVX2", "SSE4_2"),
    "ONEDNN_MAX_CPU_ISA": (None, "AVX2", "SSE41"),
}
QUICK_VALUES = {"ATEN_CPU_CAPABILITY": (None, "default", "avx2"), "MKL_CBWR": (None, "COMPATIBLE"),
                "MKL_ENABLE_INSTRUCTIONS": (None, "AVX2"), "ONEDNN_MAX_CPU_ISA": (None,)}
TESTS = ("tests/test_records.py", "tests/test_golden.py", "tests/test_inspection.py", "tests/test_kernels.py",
         "tests/test_determinism.py")
FINGERPRINT = "from grpo_tutorial.env import kernel_fingerprint as k; print(k(1), k(2))"
#: Whether a variable set runs bfloat16 attention at 64 tokens and more (chapter 15's bfloat16 sampler scores such
#: sequences). Capping ATen below what the CPU has, while oneDNN is left uncapped, is no CPU that exists: on a CPU with
#: AMX, PyTorch's flash-attention kernel then picks its bfloat16 path from the hardware and calls a packing routine
#: built only into ATen's AVX512 kernels ("pack_vnni2 is only supported when avx512 is supported"). Capping oneDNN
#: too (as `.ci/kernel_variant.py` always does) gives a consistent set with the same fingerprint.
CONSISTENT = ("import torch; q = torch.zeros(1, 1, 64, 8, dtype=torch.bfloat16); "
              "torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True); print('consistent')")


def clean_env(variables: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in VALUES and k != "GRPO_MAIN_PASS_KERNELS"}
    env.update(variables, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", MPLBACKEND="Agg")
    return env


def fingerprints(python: str, variables: dict[str, str]) -> tuple[str, str] | None:
    done = subprocess.run([python, "-c", FINGERPRINT], env=clean_env(variables), cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        return None
    one, two = done.stdout.split()[-2:]
    return one, two


def consistent(python: str, variables: dict[str, str]) -> bool:
    """Whether the set runs everything the suite runs (:data:`CONSISTENT`)."""
    done = subprocess.run([python, "-c", CONSISTENT], env=clean_env(variables), cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    return done.returncode == 0 and done.stdout.strip().endswith("consistent")


def kernel_sets(python: str, values: dict) -> list[dict]:
    """One entry per distinct fingerprint: the variables with the fewest settings, and every alias."""
    sets: dict[tuple[str, str], dict] = {}
    for combo in itertools.product(*values.values()):
        variables = {k: v for k, v in zip(values, combo) if v is not None}
        fps = fingerprints(python, variables)
        print(f"portability: {variables or 'default'}: {fps or 'refused'}", flush=True)
        if fps is None:
            continue
        entry = sets.setdefault(fps, {"fingerprint": fps[0], "fingerprint_2_threads": fps[1], "aliases": []})
        entry["aliases"].append(variables)
    for entry in sets.values():
        # the alias with the fewest variables among the consistent ones (each alias tried in that order)
        ordered = sorted(entry["aliases"], key=len)
        entry["variables"] = next((v for v in ordered if consistent(python, v)), None)
        if entry["variables"] is None:  # no alias runs bfloat16 attention: run it anyway, and say so
            entry["variables"], entry["inconsistent"] = ordered[0], True
    return sorted(sets.values(), key=lambda e: len(e["variables"]))


def run_tests(python: str, variables: dict[str, str], log: Path, notebooks: bool, workers: int) -> dict:
    targets = list(TESTS) + (list(REPLAYS) if notebooks else [])
    env = clean_env(variables)
    env["GRPO_FLOAT_CHECK_LOG"] = str(log)
    with tempfile.TemporaryDirectory() as cache:
        env["GRPO_WARM_START_CACHE"] = cache
        parallel = ["-p", "no:xdist"] if workers == 0 else ["-n", str(workers), "--dist", "loadscope"]
        start = time.perf_counter()
        done = subprocess.run([python, "-m", "pytest", "-q", *parallel, "-m", "not rerun", "--nbmake",
                               "--nbmake-kernel=python3", *targets], env=env, cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    lines = done.stdout.strip().splitlines()
    failed = [line for line in lines if line.startswith("FAILED")]
    return {"returncode": done.returncode, "summary": lines[-1] if lines else done.stderr[-500:],
            "failed": failed, "seconds": round(seconds, 1)}


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def table(variants: list[dict]) -> str:
    lines = ["| python | variables | fingerprint (1 / 2 threads) | aliases | pytest | s |", "|---|---|---|---|---|---|"]
    for v in variants:
        variables = " ".join(f"{k}={x}" for k, x in v["variables"].items()) or "(default)"
        lines.append(f"| {v['python_label']} | {variables} | {v['fingerprint']} / {v['fingerprint_2_threads']} | "
                     f"{len(v['aliases'])} | {v['tests']['summary']} | {v['tests']['seconds']:.0f} |")
    worst: dict[str, tuple[float, str, str]] = {}
    failures: dict[str, list[str]] = {}
    unasserted: set[str] = set()
    for v in variants:
        name = " ".join(f"{k}={x}" for k, x in v["variables"].items()) or "(default)"
        for check in v["checks"]:
            key = f"{check.get('category')}: {check.get('check')}"
            used = check.get("used")
            if check.get("passed") is False:
                failures.setdefault(key, []).append(name)
            if check.get("passed") is None:  # logged, not asserted (a planted bound under its seeds' gate)
                unasserted.add(key)
                continue
            if isinstance(used, (int, float)) and (key not in worst or used > worst[key][0]):
                worst[key] = (used, name, f"{check.get('value')} vs {check.get('honest')}")
    lines += ["", f"{len(worst)} asserted float checks logged ({len(unasserted)} more logged but not asserted: "
                  "planted bounds whose margin is under their seeds' gate); the 25 that used the largest share of "
                  "their margin (|value - honest| / margin; 1 fails):", "",
              "| check | largest share used | where | value vs honest |", "|---|---|---|---|"]
    for key, (used, name, what) in sorted(worst.items(), key=lambda kv: -kv[1][0])[:25]:
        lines.append(f"| {key[:110]} | {used:.3f} | {name} | {what[:40]} |")
    if failures:
        lines += ["", "Checks that failed:", ""] + [f"- {k}: {', '.join(v)}" for k, v in sorted(failures.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python .ci/portability.py", description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", default=[],
                        help="another environment's interpreter to run too (e.g. .venv-colab/bin/python)")
    parser.add_argument("--notebooks", action="store_true", help="also the chapters that replay a record")
    parser.add_argument("--quick", action="store_true", help="fewer variable values (ATen and MKL's first modes)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per variant (0: one process)")
    parser.add_argument("--sets", type=Path, default=None, help="reuse the kernel sets of an earlier portability.json")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "portability")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    pythons = [sys.executable] + [str(Path(p).absolute()) for p in args.python]
    values = QUICK_VALUES if args.quick else VALUES
    variants = []
    earlier = json.loads(args.sets.read_text())["variants"] if args.sets else None
    for python in pythons:
        label = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                               text=True, cwd=ROOT).stdout.strip()
        sets = ([v for v in earlier if v["python"] == python] if earlier else None) or kernel_sets(python, values)
        for i, entry in enumerate(sets):
            log = args.out / f"checks_{len(variants):02d}.jsonl"
            log.unlink(missing_ok=True)
            print(f"portability: torch {label}, {entry['variables'] or 'default'} "
                  f"({entry['fingerprint']}): running", flush=True)
            tests = run_tests(python, entry["variables"], log, args.notebooks, args.workers)
            print(f"portability:   {tests['summary']} in {tests['seconds']:.0f} s", flush=True)
            variants.append({**{k: entry[k] for k in ("fingerprint", "fingerprint_2_threads", "aliases", "variables")},
                             "python": python, "python_label": f"torch {label}", "tests": tests,
                             "checks": read_log(log)})
            (args.out / "portability.json").write_text(json.dumps({"variants": variants}, indent=1) + "\n")
            (args.out / "table.md").write_text(table(variants))
    print((args.out / "table.md").read_text())
    return 0 if all(v["tests"]["returncode"] == 0 for v in variants) else 1


if __name__ == "__main__":
    sys.exit(main())

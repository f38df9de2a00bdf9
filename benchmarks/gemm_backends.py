"""Which matrix-multiply library does the decoding step run on, and how fast is it?

A float32 ``torch.nn.functional.linear`` on a CPU goes to the BLAS that PyTorch was
built with (MKL in the x86 wheels). PyTorch also ships oneDNN, which its compiler
(inductor, with ``freezing``) uses for linear layers whose weights are constants: the
weight is reordered once into a blocked layout for the expected number of rows, and
every later call multiplies against that layout. This script times both on the
shapes of SmolLM2-135M's decoding step (hidden 576, MLP 1536, keys and values 192,
vocabulary 49,152), for one row (the per-completion loop) and 32 rows (the batched
rollout of the benchmark), and on the 2048 x 2048 product that ``benchmarks/mfu.py``
takes as its peak. It prints milliseconds and GFLOP/s for each.

The package's generation uses the packed layout (``grpo_tutorial/speedups.py``); this
script shows why, one shape at a time. Each shape multiplies one weight over and over,
so the weight stays in the CPU's caches: the per-step totals are lower bounds, which
leave out the cost of streaming a real model's 0.5 GB of weights from memory (that
cost is most of the one-row step of the loop).

Run it as::

    python -m benchmarks.gemm_backends            # one thread
    python -m benchmarks.gemm_backends --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from grpo_tutorial.speedups import onednn_available as packed_linear_available

#: the size of the square product that ``benchmarks/mfu.py`` takes as its peak
PEAK_N = 2048

#: (name, output features, input features, layers of the model that have this shape)
SMOLLM2_LINEARS = (
    ("q, o projections", 576, 576, 60),
    ("k, v projections", 192, 576, 60),
    ("MLP gate, up", 1536, 576, 60),
    ("MLP down", 576, 1536, 30),
    ("output layer", 49152, 576, 1),
)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first-call allocations and library set-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_linear(out_features: int, in_features: int, rows: int, repeats: int) -> dict[str, float]:
    """Seconds of one ``F.linear`` (the build's BLAS) and of oneDNN's packed linear, same inputs."""
    weight = torch.randn(out_features, in_features)
    x = torch.randn(rows, in_features)
    with torch.no_grad():
        dense = median_seconds(lambda: F.linear(x, weight), repeats)
        packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        packed = median_seconds(
            lambda: torch.ops.mkldnn._linear_pointwise(x, packed_weight, None, "none", [], ""), repeats
        )
        same = torch.ops.mkldnn._linear_pointwise(x, packed_weight, None, "none", [], "")
        gap = (same - F.linear(x, weight)).abs().max().item()
    return {"blas": dense, "onednn_packed": packed, "max_abs_difference": gap}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gemm_backends", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per shape (median is reported)")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.repeats < 1:
        parser.error("--threads and --repeats must be >= 1")
    if not packed_linear_available():
        print("this PyTorch build has no oneDNN packed linear (torch.ops.mkldnn); nothing to compare")
        return 0
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} thread(s), load average {os.getloadavg()[0]:.2f}")
    for rows in (1, 32):
        print(f"\n{rows} row(s) per call (the decoding step of {'the loop' if rows == 1 else 'the batched rollout'}):")
        print(f"  {'shape':18} {'BLAS ms':>8} {'oneDNN ms':>10} {'BLAS GFLOP/s':>13} {'oneDNN GFLOP/s':>15}")
        step = {"blas": 0.0, "onednn_packed": 0.0}
        for name, n_out, n_in, count in SMOLLM2_LINEARS:
            t = time_linear(n_out, n_in, rows, args.repeats)
            flops = 2 * rows * n_out * n_in
            for key in step:
                step[key] += count * t[key]
            print(f"  {name:18} {1e3 * t['blas']:8.3f} {1e3 * t['onednn_packed']:10.3f} "
                  f"{flops / t['blas'] / 1e9:13.1f} {flops / t['onednn_packed'] / 1e9:15.1f}"
                  f"   (largest difference {t['max_abs_difference']:.1e})")
        print(f"  all linear layers of one decoding step (weights cache-warm, a lower bound): BLAS {1e3 * step['blas']:.1f} ms, "
              f"oneDNN {1e3 * step['onednn_packed']:.1f} ms ({step['blas'] / step['onednn_packed']:.2f}x)")
    n = PEAK_N
    a, b = torch.randn(n, n), torch.randn(n, n)
    with torch.no_grad():
        blas = median_seconds(lambda: torch.mm(a, b), max(3, args.repeats // 4))
        packed_b = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), n)
        onednn = median_seconds(
            lambda: torch.ops.mkldnn._linear_pointwise(a, packed_b, None, "none", [], ""), max(3, args.repeats // 4)
        )
    flops = 2 * n**3
    print(f"\n{n} x {n} product (the size of benchmarks/mfu.py's peak): torch.mm {flops / blas / 1e9:.1f} GFLOP/s, "
          f"oneDNN packed {flops / onednn / 1e9:.1f} GFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

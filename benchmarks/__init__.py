"""Performance benchmarks of the grpo_tutorial package, next to TRL's GRPOTrainer.

Run from the repository root::

    python -m benchmarks            # everything, about 10 minutes on a 2-core CPU
    python -m benchmarks --quick    # a smoke run of every part, a few minutes
    python -m benchmarks --parts rollout,mfu

It prints a table and writes ``benchmarks/results.json``, which the book's
Performance appendix (``book/performance.md``) reads. The parts:

rollout (:mod:`benchmarks.rollout`)
    Generated tokens per second: all B*G completions in one batched ``generate``
    call against one call per completion, on SmolLM2-135M-Instruct.
train (:mod:`benchmarks.trainers`)
    Seconds per GRPO step of the package's trainer and of TRL's, at a matched
    configuration, on the tiny model and on SmolLM2, with a breakdown by phase
    and the peak resident memory of each (each run in its own subprocess).
mfu (:mod:`benchmarks.mfu`)
    Model FLOPs utilisation of the package's forward and backward pass: the
    model's FLOPs per second over this CPU's measured float32 matmul peak.

Every figure is the median of repeated measurements, with the min and max, all
taken in one run of the command. The machine (CPU, cores, threads, versions) and
the load average during the run are recorded with the results. Nothing here is a
test: the benchmarks report numbers, the tests in ``tests/`` check behaviour.
"""

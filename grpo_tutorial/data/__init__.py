"""Records of committed runs that the chapters show, shipped inside the package.

Each record names the command that wrote it and the package commit it was made
at; ``tests/test_records.py`` re-runs the first step of each command.

A notebook opened on its own (in Colab, say) has the installed package and
nothing else: no repository around it and maybe no network. So the logs the
book plots are package data, read with :mod:`importlib.resources` through
:func:`read_data`, and ``pip install`` brings them along.

=============================== ==================================================
file                            what it is (who writes it)
=============================== ==================================================
``smollm2_history.jsonl``       chapter 9's committed CPU run, one history row a
                                step (``benchmarks/smollm2_run.py``, seed 0)
``smollm2_history_seed1.jsonl`` the same run with seed 1
``smollm2_history_seed2.jsonl`` the same run with seed 2
``smollm2_eval.json``           that run's before/after evaluation and the list of
                                every setting tried (``benchmarks/smollm2_run.py``'s
                                summary, with the list added by hand)
``tiny_learning.json``          chapter 8's benchmark record, seeds 0 to 7
                                (``benchmarks/tiny_learning.py``)
``lab_results.json``            chapter 12's lab: every method and both controls,
                                3 seeds, pass@k before/after GRPO
                                (``python -m benchmarks.lab``)
``thinking_results.json``      chapter 13's runs: every variant, 5 seeds, the
                                held-out curves (``python -m benchmarks.thinking``)
``thinking_warm_start.          the same command's warm start of seed 0, which
safetensors``                   chapter 13 trains live (weights, not readable
                                with ``read_data``: ``chapters.thinking.load_warm_start``)
``step_policy.safetensors``     chapter 7's policy: the tiny Qwen2 after 100
                                supervised steps, so that every machine samples
                                the batch the chapter describes
                                (``python -m benchmarks.step_policy``; weights,
                                read with ``chapters.inspection.load_step_policy``,
                                provenance in the file's metadata)
``logprob_memory.json``         chapter 9's peak memory of one micro-batch's
                                scoring and backward, before and after the
                                block-wise scorer
                                (``python -m benchmarks.logprob_memory --publish``)
``gpu_proof.json``              chapter 9's GPU path measured on a lent CUDA GPU:
                                the CUDA tests, one step of the T4 preset at
                                Qwen2.5-0.5B's size under a T4-sized memory cap,
                                stage by stage, the samplers, chapter 16's
                                run with tools, and the tiny recipe learning
                                (``make gpu-proof``, i.e.
                                ``python -m benchmarks.gpu_proof``)
``lora_regret.json``            chapter 14's experiment: full fine-tuning against
                                LoRA adapters (ranks 1, 4, 16, attention only) over
                                learning-rate grids, 5 seeds, the held-out curves
                                (``python -m benchmarks.lora_regret``)
``lora_regret_lower.json``      the same experiment's LoRA grid extended to lower
                                learning rates, the same seeds (the same command
                                with ``--lora-lrs``; ``chapters.low_rank.combine_sweeps``)
``sampler_mismatch.json``       chapter 15's experiment: the on-policy baseline and
                                bfloat16, stale (1, 4, 16 updates) and top-p 0.8
                                samplers, uncorrected and with TRL's token_truncate
                                and sequence_mask, 6 seeds, held-out curves and each
                                sampler's measured mismatch
                                (``python -m benchmarks.mismatch``)
``rollout_speed.json``          chapter 9's table of samplers on a lent H100 and
                                H200 (2026-11-28): Hugging Face ``generate`` on
                                Qwen2.5-0.5B's architecture, ms per decoding step
                                for eager, unmerged and merged LoRA, static cache
                                and float16 copies (two small scripts beside the
                                GPU record of that day, their JSON unchanged)
``tool_results.json``           chapter 16's runs: the calculator, switched off,
                                its tokens left in the loss, sometimes wrong; 5
                                seeds, the held-out curves
                                (``python -m benchmarks.tool_use``)
``no_critic_results.json``      chapter 17's runs: GRPO, RLOO, PPO with a value
                                model, Monte Carlo values; 5 seeds, 10 steps
                                each, the held-out curves, the advantages'
                                variance, the critic's explained variance, memory
                                and seconds per step (``python -m benchmarks.no_critic``)
``doctor_zoo.json.gz``       chapter 18's zoo: runs with one planted fault
                                each and healthy runs, 15 seeds, their histories
                                and kept completions, and both doctors' verdicts
                                (``python -m benchmarks.doctor_zoo``)
``community/``                  chapter 9's run records shared by readers, one
                                ``run_record.json`` each (written by the notebook on
                                their GPU; ``chapters.run_record.community_records``
                                reads them, ``tests/test_run_record.py`` checks
                                each against the schema): their measurements, not
                                the book's
=============================== ==================================================
"""

from __future__ import annotations

import gzip
import json
from importlib import resources
from typing import Any

__all__ = ["DATA_FILES", "read_data"]

#: Every file shipped here.
DATA_FILES = (
    "smollm2_eval.json",
    "smollm2_history.jsonl",
    "smollm2_history_seed1.jsonl",
    "smollm2_history_seed2.jsonl",
    "tiny_learning.json",
    "lab_results.json",
    "logprob_memory.json",
    "thinking_results.json",
    "thinking_warm_start.safetensors",
    "step_policy.safetensors",
    "gpu_proof.json",
    "lora_regret.json",
    "lora_regret_lower.json",
    "sampler_mismatch.json",
    "rollout_speed.json",
    "tool_results.json",
    "no_critic_results.json",
    "doctor_zoo.json.gz",
)


def read_data(name: str) -> Any:
    """The content of the shipped file ``name``: a ``.json`` file's value (gzip-compressed for ``.json.gz``, a
    record too large to ship as text), or a ``.jsonl`` file's list of rows.

    >>> read_data("tiny_learning.json")["runs"][0]["seed"]
    0
    """
    if name.endswith(".safetensors") and name in DATA_FILES:
        raise ValueError(f"{name} holds model weights, not a record; load it with "
                         "grpo_tutorial.chapters.thinking.load_warm_start()")
    if name not in DATA_FILES:
        raise ValueError(f"no committed data file named {name!r}; the package ships {list(DATA_FILES)}")
    if name.endswith(".json.gz"):
        return json.loads(gzip.decompress(resources.files(__name__).joinpath(name).read_bytes()).decode("utf-8"))
    text = resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)

"""``python -m benchmarks.thinking``: chapter 13's runs, every variant for several seeds.

For each seed, one warm start (:func:`grpo_tutorial.chapters.thinking.warm_start`),
then every variant of :data:`~grpo_tutorial.chapters.thinking.VARIANTS` from a copy
of it for the same number of steps, with the held-out statistics every
``eval_every`` steps. The per-seed results and the summary across seeds (mean and
95% t interval at every point of every curve, and each variant's final values
against GRPO's, paired by seed) go into ONE file inside the package data,
``grpo_tutorial/data/thinking_results.json``, which chapter 13 reads. The file also
records the command, the package commit, the CPU, the wall time and the machine's load.

``--jobs``, ``--cache`` and ``--quick`` are :mod:`benchmarks.variant_runs`' (the runner
chapter 16's record shares).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import variant_runs  # noqa: E402
from benchmarks.variant_runs import DATA_DIR, Chapter  # noqa: E402
from grpo_tutorial.chapters.thinking import (  # noqa: E402
    VARIANTS, WARM_START_FILE, ThinkingRecipe, build_thinking_model, make_thinking_data, run_variant, save_warm_start,
    summarize_thinking, warm_start,
)

DEFAULT_OUT = DATA_DIR / "thinking_results.json"
DEFAULT_WARM_START = DATA_DIR / WARM_START_FILE

#: The trainer's history keys kept per step (the rest stays out of the package data).
HISTORY_KEYS = ("step", "reward_mean", "accuracy", "completion_len_mean", "frac_zero_std", "frac_truncated",
                "entropy")

CHAPTER = Chapter(
    command="python -m benchmarks.thinking", recipe=ThinkingRecipe, make_data=make_thinking_data,
    build_model=build_thinking_model, warm_start=warm_start, run_variant=run_variant, summarize=summarize_thinking,
    variants=VARIANTS, third_name="reward", out=DEFAULT_OUT, history_keys=HISTORY_KEYS, style="worked_share",
    warm_start_file=DEFAULT_WARM_START, save_warm_start=save_warm_start,
)


#: ``build_parser()`` (tests/test_records.py parses the record's command with it), ``main(argv=None)`` and
#: ``recipe_for(args)``.
build_parser, main, recipe_for = variant_runs.command(CHAPTER, __doc__)


if __name__ == "__main__":
    main()

"""``python -m benchmarks.tool_use``: chapter 16's runs, every variant for several seeds.

For each seed, one warm start (:func:`grpo_tutorial.chapters.tool_use.warm_start`),
then every variant of :data:`~grpo_tutorial.chapters.tool_use.VARIANTS` (the
calculator; switched off; its tokens left in the loss; sometimes wrong) from a copy
of it for the same number of steps, with the held-out statistics every
``eval_every`` steps, into ONE file inside the package data,
``grpo_tutorial/data/tool_results.json``, which chapter 16 reads. ``--jobs``,
``--cache`` and ``--quick`` are :mod:`benchmarks.variant_runs`' (the runner chapter
13's record shares).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import variant_runs  # noqa: E402
from benchmarks.variant_runs import DATA_DIR, Chapter  # noqa: E402
from grpo_tutorial.chapters.tool_use import (  # noqa: E402
    VARIANTS, ToolRecipe, build_tool_model, make_tool_data, run_variant, summarize_tool_use, warm_start,
)

DEFAULT_OUT = DATA_DIR / "tool_results.json"

#: The trainer's history keys kept per step (the rest stays out of the package data).
HISTORY_KEYS = ("step", "reward_mean", "accuracy", "completion_len_mean", "frac_zero_std", "frac_truncated",
                "entropy", "tool_call_count", "tool_failure_count", "tool_call_share")

CHAPTER = Chapter(
    command="python -m benchmarks.tool_use", recipe=ToolRecipe, make_data=make_tool_data,
    build_model=build_tool_model, warm_start=warm_start, run_variant=run_variant, summarize=summarize_tool_use,
    variants=VARIANTS, third_name="tool", out=DEFAULT_OUT, history_keys=HISTORY_KEYS, style="tool_share",
)


#: ``build_parser()`` (tests/test_records.py parses the record's command with it), ``main(argv=None)`` and
#: ``recipe_for(args)``.
build_parser, main, recipe_for = variant_runs.command(CHAPTER, __doc__)


if __name__ == "__main__":
    main()

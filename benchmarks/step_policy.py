"""Chapter 7's policy, shipped as package data: ``python -m benchmarks.step_policy``.

Chapter 7 takes one GRPO step by hand from a tiny Qwen2 trained for 100
supervised steps. Those steps take two seconds, but they amplify the last-bit
differences between machines' floating-point kernels (an AMD and an Intel CPU, or
one CPU under ``MKL_ENABLE_INSTRUCTIONS=AVX2``) until the batch the policy samples
can differ, and with it every sentence the chapter writes about that batch. So the
weights are made once, by this command, and shipped in ``grpo_tutorial/data/``
with their provenance as safetensors metadata: the command, the package commit
(and whether the code had uncommitted changes), the kernel fingerprint of the
machine (:func:`grpo_tutorial.env.describe_kernels`), and the warm start's first
and last losses. ``tests/test_records.py`` re-runs it: bit for bit where the
fingerprint matches, and to the losses' stated tolerances elsewhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.common import ROOT
from grpo_tutorial.chapters.run_record import package_commit

COMMAND = "python -m benchmarks.step_policy"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write the weights (default: the package's data folder)")
    return parser


def make(out: Path) -> dict[str, str]:
    """Train the policy at one thread and write it to ``out``; return the metadata written."""
    import torch
    from safetensors.torch import save_model

    from grpo_tutorial.chapters.inspection import make_step_policy
    from grpo_tutorial.env import describe_kernels

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, _, history = make_step_policy()
        kernels = describe_kernels(threads=1)
    finally:
        torch.set_num_threads(previous)
    provenance = package_commit()
    metadata = {
        "command": COMMAND,
        "package_commit": str(provenance["package_commit"]),
        "package_dirty": json.dumps(provenance["package_dirty"]),
        "kernels": json.dumps(kernels),
        "sft_steps": str(len(history)),
        "first_loss": repr(history[0]["loss"]),
        "final_loss": repr(history[-1]["loss"]),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    save_model(model, str(out), metadata=metadata)  # tied embeddings are stored once
    return metadata


def main(argv: list[str] | None = None) -> None:
    from grpo_tutorial.chapters.inspection import STEP_POLICY_FILE

    args = build_parser().parse_args(argv)
    out = args.out or ROOT / "grpo_tutorial" / "data" / STEP_POLICY_FILE
    metadata = make(out)
    print(f"wrote {out}: {json.dumps(metadata, indent=1)}", file=sys.stderr)


if __name__ == "__main__":
    main()

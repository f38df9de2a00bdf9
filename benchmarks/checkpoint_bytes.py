"""Bytes a run writes into its checkpoints, for a long tiny-model run.

    python -m benchmarks.checkpoint_bytes --steps 1000 --every 10
    python -m benchmarks.checkpoint_bytes --steps 20 --every 10 --shape tiny --beta 0.04             # full
    python -m benchmarks.checkpoint_bytes --steps 20 --every 10 --shape tiny --beta 0.04 --use-peft  # LoRA

Wraps ``GRPOTrainer.save_checkpoint`` (present in every version of the package)
and adds up the size of the checkpoint directory after each save. With the
history stored inside each checkpoint (format 1) the total grows with the square
of the number of steps; with the history only in ``history.jsonl`` (format 2) it
grows linearly, like the weights.

``--use-peft`` (with ``--lora-r``) trains LoRA adapters on every linear layer
instead (issue 32): the checkpoint then holds the adapters and their AdamW
state, not the base (nor, with ``--beta`` > 0, the full run's frozen reference
copy). ``--shape tiny`` is the 0.8M-weight tiny model of the chapters (the
default ``small`` is 32 wide, one layer). The result also gives the last
checkpoint's bytes, the weights AdamW holds and the median seconds per step.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import torch


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


#: The models: ``small`` (32 wide, one layer; the default) and ``tiny`` (the chapters' 0.8M-weight model).
SHAPES = {"small": dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), "tiny": {}}


def measure(steps: int, every: int, *, shape: str = "small", beta: float = 0.0, use_peft: bool = False,
            lora_r: int = 16) -> dict:
    from grpo_tutorial import GRPOConfig, GRPOTrainer, build_tiny_policy, make_arithmetic_dataset
    from grpo_tutorial.rewards import partial_credit_reward

    torch.set_num_threads(1)
    model, tok = build_tiny_policy(**SHAPES[shape], seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = GRPOConfig(prompts_per_step=2, group_size=2, max_new_tokens=2, checkpoint_every=every, output_dir=tmp,
                         beta=beta, use_peft=use_peft, lora_r=lora_r)
        trainer = GRPOTrainer(model, tok, partial_credit_reward, cfg)
        saves: list[dict] = []
        real = trainer.save_checkpoint

        def counting(output_dir=None):
            path = real(output_dir)
            meta = json.loads((Path(path) / "trainer_state.json").read_text())
            saves.append({"step": meta["step"], "bytes": _dir_bytes(Path(path)),
                          "meta_bytes": (Path(path) / "trainer_state.json").stat().st_size})
            return path

        trainer.save_checkpoint = counting
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train(make_arithmetic_dataset(64, seed=0, digits=1), steps, progress=False)
        seconds = time.perf_counter() - start
        history_bytes = (Path(tmp) / "history.jsonl").stat().st_size
    step_seconds = sorted(row["step_seconds"] for row in trainer.history)
    return {
        "shape": shape,
        "use_peft": use_peft,
        "lora_r": lora_r if use_peft else None,
        "beta": beta,
        "model_weights": sum(p.numel() for n, p in trainer.model.named_parameters() if "lora_" not in n),
        "trained_weights": sum(p.numel() for group in trainer.optimizer.param_groups for p in group["params"]),
        "checkpoint_bytes_last": saves[-1]["bytes"],
        "seconds_per_step_median": round(step_seconds[len(step_seconds) // 2], 4),
        "steps": steps,
        "checkpoint_every": every,
        "saves": len(saves),
        "checkpoint_bytes_total": sum(s["bytes"] for s in saves),
        "meta_bytes_first": saves[0]["meta_bytes"],
        "meta_bytes_last": saves[-1]["meta_bytes"],
        "history_jsonl_bytes": history_bytes,
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--beta", type=float, default=0.0, help="KL weight (> 0: the full run keeps a reference copy)")
    parser.add_argument("--use-peft", action="store_true", help="LoRA adapters on every linear layer (pip install peft)")
    parser.add_argument("--lora-r", type=int, default=16)
    args = parser.parse_args()
    print(json.dumps(measure(args.steps, args.every, shape=args.shape, beta=args.beta, use_peft=args.use_peft,
                             lora_r=args.lora_r), indent=1))


if __name__ == "__main__":
    main()

"""TRL's ``GRPOTrainer`` in several processes, with the package's rewards (chapter 11).

Each process is one rank of a data-parallel run. On a CPU, ``torchrun`` starts
the ranks and accelerate runs them in its ``MULTI_CPU`` mode (gloo backend); on
GPUs the same script runs with ``--device cuda`` under ``accelerate launch``
(one rank per GPU, optionally with a DeepSpeed ZeRO config)::

    torchrun --nproc_per_node 2 -m grpo_tutorial.chapters.trl_multiprocess --out runs/trl2
    accelerate launch --num_processes 8 -m grpo_tutorial.chapters.trl_multiprocess --out runs/trl8 --device cuda

Only the first command has been run (on a CPU, in the tests and in chapter 11).

Every rank writes ``rank{R}.json`` into ``--out``: the rewards its reward
function saw (its own completions only), TRL's log history, and a SHA-256 digest
of its parameters after training. :func:`launch` runs the command with a time
limit and a free port; :func:`summarize` checks the two things data parallelism
promises: the ranks end with identical parameters, and the logged reward is the
mean over the completions of all ranks (TRL gathers the rewards across ranks
before it normalises them per group and logs them).

The model is a tiny random Qwen2 from :func:`grpo_tutorial.models.build_tiny_policy`,
saved to ``--out``/model first, so that TRL loads it from a local folder as it
would a hub model; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["launch", "main", "parameter_digest", "summarize", "torchrun_command"]

GROUP = 4  # num_generations: completions per prompt
COMPLETIONS_PER_RANK = 8  # per_device_train_batch_size counts completions
MAX_TOKENS = 6
BREVITY_WEIGHT = 0.5  # the second reward's weight; correctness has 1


def parameter_digest(model: Any) -> str:
    """SHA-256 over every parameter's name, shape and float32 bytes, in name order."""
    import torch

    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def brevity_reward(completions: list, **kwargs: Any) -> list[float]:
    """1 for an empty completion down to 0 for MAX_TOKENS characters: a signal an untrained model already has."""
    return [1.0 - min(len(c), MAX_TOKENS) / MAX_TOKENS for c in completions]  # plain-text prompts: strings


def _recorded(fn: Any, seen: list[dict]) -> Any:
    """``fn`` unchanged (same name, same result); each call's completions and rewards go into ``seen``."""

    def wrapped(completions: list, **kwargs: Any) -> list:
        out = fn(completions, **kwargs)
        seen.append({
            "prompts": [str(p) for p in kwargs.get("prompts", [])],
            "completions": [str(c) for c in completions],
            "rewards": [float(r) for r in out],
        })
        return out

    wrapped.__name__ = fn.__name__
    return wrapped


def _checkpointing_off(config_cls: Any) -> dict:
    """transformers 5 renamed ``gradient_checkpointing`` to ``activation_checkpointing``."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": False}


def run(out: Path, steps: int = 2, seed: int = 0, device: str = "cpu") -> dict:
    """One rank's part of the run (called by every process that torchrun starts).

    ``device="cpu"``: gloo between the ranks (accelerate's ``MULTI_CPU``);
    ``"cuda"``: one GPU per rank and accelerate's own choice of backend (NCCL).
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    import datasets
    import torch
    import trl
    from transformers import AutoTokenizer

    from ..models import build_tiny_policy
    from ..rewards import correctness_reward
    from ..tasks import make_arithmetic_dataset

    if device == "cpu":
        torch.set_num_threads(1)  # one core per rank
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    out.mkdir(parents=True, exist_ok=True)
    model_dir = out / "model"
    if rank == 0 and not (model_dir / "config.json").exists():
        model, tokenizer = build_tiny_policy(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=seed)
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
    args = trl.GRPOConfig(
        output_dir=str(out / "trl"),
        use_cpu=device == "cpu",
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        max_steps=steps,
        seed=seed,
        per_device_train_batch_size=COMPLETIONS_PER_RANK,
        num_generations=GROUP,
        max_completion_length=MAX_TOKENS,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        beta=0.0,
        reward_weights=[1.0, BREVITY_WEIGHT],
        ddp_backend="gloo" if device == "cpu" else None,
        ddp_find_unused_parameters=False,  # every parameter takes part in the loss
        **_checkpointing_off(trl.GRPOConfig),
    )
    # creating the config set up the process group; the others wait here until rank 0 has saved the model
    from accelerate import PartialState

    state = PartialState()
    state.wait_for_everyone()
    seen: list[dict] = []
    trainer = trl.GRPOTrainer(
        model=str(model_dir),  # loaded from the local folder, like a hub id
        reward_funcs=[_recorded(correctness_reward, seen), brevity_reward],
        args=args,
        train_dataset=datasets.Dataset.from_list(make_arithmetic_dataset(64, seed, digits=1)),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    before = parameter_digest(trainer.model)
    t0 = time.perf_counter()
    trainer.train()
    result = {
        "rank": rank,
        "world_size": world,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "backend": str(getattr(state, "backend", None)),
        "digest_before": before,
        "digest_after": parameter_digest(trainer.accelerator.unwrap_model(trainer.model)),
        "seconds": time.perf_counter() - t0,
        "correctness_calls": seen,
        "brevity_calls": [{"rewards": brevity_reward(call["completions"])} for call in seen],
        "log_history": [row for row in trainer.state.log_history if "reward" in row],
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(
        f"rank {rank}/{world} ({result['distributed_type']}, {result['backend']}): {len(seen)} steps, "
        f"{'+'.join(str(len(c['rewards'])) for c in seen)} completions scored here, "
        f"parameters {result['digest_after'][:12]}",
        flush=True,
    )
    return result


def free_port() -> int:
    """A TCP port nobody listens on right now (for torchrun's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(out: str | os.PathLike, nproc: int = 2, steps: int = 2, port: int | None = None) -> list[str]:
    """The launch command: ``torchrun`` (as ``python -m torch.distributed.run``) on this module."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(port or free_port()),
        "-m", "grpo_tutorial.chapters.trl_multiprocess", "--out", os.fspath(out), "--steps", str(steps),
    ]


def launch(out: str | os.PathLike, nproc: int = 2, steps: int = 2, timeout: float = 600.0) -> dict:
    """Run the script in ``nproc`` CPU processes; return the command, its output and every rank's record.

    Raises ``RuntimeError`` with the output's tail when the run fails, and
    ``subprocess.TimeoutExpired`` (after killing the ranks) when it takes longer
    than ``timeout`` seconds.
    """
    out = Path(out)
    cmd = torchrun_command(out, nproc, steps)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    t0 = time.perf_counter()
    # a new session, so that a timeout kills torchrun and every rank it started
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited with {proc.returncode}; last output:\n" + "\n".join(output.splitlines()[-30:]))
    ranks = [json.loads((out / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(nproc)]
    shown = ["torchrun", *cmd[cmd.index("--nproc_per_node"):]]
    shown[shown.index("--master_port") + 1] = "PORT"
    return {"command": " ".join(shown), "output": output, "seconds": seconds, "ranks": ranks}


def _without_time(row: dict) -> dict:
    return {k: v for k, v in row.items() if "time" not in k}


def summarize(ranks: list[dict]) -> dict:
    """What the ranks' records show, step by step.

    ``identical_parameters``: every rank ends with the same digest (and it differs
    from the start: training moved the weights). Per step: the mean correctness
    reward over each rank's own completions, over all ranks' completions together,
    and what TRL logged (the same on every rank).
    """
    digests = {r["digest_after"] for r in ranks}
    steps = []
    for i, row in enumerate(ranks[0]["log_history"]):
        per_rank = [r["correctness_calls"][i]["rewards"] for r in ranks]
        brevity = [r["brevity_calls"][i]["rewards"] for r in ranks]
        everything = [x for rewards in per_rank for x in rewards]
        total = [c + BREVITY_WEIGHT * b for rc, rb in zip(per_rank, brevity) for c, b in zip(rc, rb)]
        steps.append({
            "step": row["step"],
            "completions_per_rank": [len(x) for x in per_rank],
            "correctness_mean_per_rank": [sum(x) / len(x) for x in per_rank],
            "correctness_mean_all_ranks": sum(everything) / len(everything),
            "correctness_logged": row["rewards/correctness_reward/mean"],
            "reward_mean_all_ranks": sum(total) / len(total),
            "reward_logged": row["reward"],
            # every logged number but the local wall time is the same on every rank (TRL gathers them)
            "logged_same_on_every_rank": all(_without_time(r["log_history"][i]) == _without_time(row) for r in ranks),
        })
    return {
        "world_size": ranks[0]["world_size"],
        "distributed_type": ranks[0]["distributed_type"],
        "identical_parameters": len(digests) == 1,
        "parameters_moved": all(r["digest_after"] != r["digest_before"] for r in ranks),
        "steps": steps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the model and each rank's rank{R}.json")
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: gloo; cuda: one GPU per rank")
    args = parser.parse_args(argv)
    run(Path(args.out), steps=args.steps, seed=args.seed, device=args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())

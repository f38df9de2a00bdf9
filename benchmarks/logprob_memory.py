"""Peak memory of one micro-batch's scoring and backward, before and after the block-wise scorer.

    python -m benchmarks.logprob_memory --publish  # the T4 preset's shapes (needs ~16 GB of RAM)
    python -m benchmarks.logprob_memory --quick    # small shapes, seconds

``--publish`` writes the result into ``grpo_tutorial/data/logprob_memory.json``,
the record chapter 9 reads.

Chapter 9's GPU run scores a micro-batch of ``micro_batch_size = 8`` completions
of up to 512 tokens (the preset's, read from it) after a GSM8K prompt (about 150 tokens) under
Qwen2.5-0.5B-Instruct, whose vocabulary has 151,936 entries, with gradient
checkpointing on. The trainer's on-policy step computes the log-probs with
gradient and, in the same pass, the entropy without. This script does exactly
that, then ``grpo_loss`` and ``backward``, twice, each in a fresh process:

- ``before``: the scoring code the package had until issue 21 (kept below,
  verbatim, as :func:`score_before`): the logits sliced to the completion
  positions, ``gather - logsumexp`` over the whole ``[8, 512, V]`` tensor, and
  the entropy's own logsumexp and softmax over the whole tensor;
- ``after``: the package's :func:`grpo_tutorial.logprobs.completion_logprobs`,
  which scores blocks of at most :data:`~grpo_tutorial.speedups.CHUNK_ELEMENTS`
  logits with one logsumexp for both, and writes the gradient into one tensor.

**How memory is measured.** There is no GPU here, so this is the CPU, and the
number is the operating system's: the peak resident set size of the process
(Linux ``VmHWM``, reset to the current size through ``/proc/self/clear_refs``
just before the call) minus its resident size at that moment. It counts every
byte the scoring, the loss and the backward pass touched, including the weight
gradients, which both variants allocate alike. The worker sets glibc's
``MALLOC_MMAP_THRESHOLD_`` to 1 MiB, so every tensor of that size or more comes
from ``mmap`` and goes back to the system when freed: the peak is the peak of
live tensors, not of a heap that keeps freed blocks. The CUDA caching allocator of a GPU adds its own
fragmentation on top (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``,
which chapter 9 sets, limits it).

The model is Qwen2.5-0.5B's architecture (``Qwen2Config`` of chapter 9) with
random weights and, by default, 2 of its 24 layers: the change is in the output
layer and the scoring after it, which do not depend on the depth; the layers'
own activations under checkpointing add the same amount to both variants.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: Qwen2.5-0.5B's architecture (chapter 9 builds the same config on the meta device).
QWEN_SHAPES = dict(
    vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_attention_heads=14,
    num_key_value_heads=2, tie_word_embeddings=True,
)
def _t4_shapes() -> dict[str, int]:
    """The T4 preset's micro-batch (``micro_batch_size`` completions of ``max_new_tokens``) after a ~150-token prompt."""
    from grpo_tutorial.chapters.gsm8k import GSM8K_PRESET
    from grpo_tutorial.presets import get_preset

    preset = get_preset(GSM8K_PRESET)
    return dict(rows=preset.micro_size, prompt_tokens=150, completion_tokens=preset.max_new_tokens)


#: The T4 preset's micro-batch: 8 completions, a 512-token budget, a ~150-token prompt (read from the preset).
T4_SHAPES = _t4_shapes()
#: Seconds-long shapes for tests: Qwen's vocabulary (so that the scorer works in blocks), a small model.
QUICK = dict(rows=2, prompt_tokens=16, completion_tokens=128, hidden_size=64, intermediate_size=128,
             num_attention_heads=2, num_key_value_heads=1)
VARIANTS = ("before", "after")
DATA_FILE = Path(__file__).resolve().parent.parent / "grpo_tutorial" / "data" / "logprob_memory.json"
MARKER = "LOGPROB-MEMORY "


def score_before(model, input_ids, attention_mask, completion_length: int):
    """The package's scoring before issue 21, verbatim in substance (``completion_logprobs``
    with ``return_entropy=True``, ``entropy_grad=False``, temperature 1, full pass)."""
    import torch

    position_ids = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                logits_to_keep=completion_length + 1, use_cache=False)
    logits = out.logits[:, :-1, :]  # [N, Tc, V]
    tokens = input_ids[:, -completion_length:]  # [N, Tc]
    picked = torch.gather(logits, -1, tokens.long().unsqueeze(-1)).squeeze(-1)  # [N, Tc]
    logp = picked - torch.logsumexp(logits, dim=-1)  # [N, Tc]
    with torch.no_grad():  # the old token_entropy
        z = logits.float()
        log_z = torch.logsumexp(z, dim=-1, keepdim=True)  # [N, Tc, 1]
        probs = torch.exp(z - log_z)  # [N, Tc, V]
        entropy = log_z.squeeze(-1) - (probs * z).sum(dim=-1)  # [N, Tc]
    return logp, entropy


def score_after(model, input_ids, attention_mask, completion_length: int):
    """What the trainer's on-policy gradient pass calls now."""
    from grpo_tutorial.logprobs import completion_logprobs

    return completion_logprobs(model, input_ids, attention_mask, completion_length, return_entropy=True)


def _rss_bytes() -> int:
    return _status_kib("VmRSS") * 1024


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key} (this benchmark needs Linux)")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux >= 4.0: VmHWM := VmRSS


def measure(variant: str, shapes: dict[str, Any], layers: int, threads: int) -> dict[str, Any]:
    """Build the model and the micro-batch, then measure one scoring + loss + backward (this process)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_tutorial.loss import grpo_loss

    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    arch = {k: shapes.get(k, v) for k, v in QWEN_SHAPES.items()}
    config = Qwen2Config(**arch, num_hidden_layers=layers, max_position_embeddings=4096, use_sliding_window=False)
    model = Qwen2ForCausalLM(config)  # float32, random weights
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()  # as gsm8k_run does
    model.train()
    n, tp, tc = shapes["rows"], shapes["prompt_tokens"], shapes["completion_tokens"]
    ids = torch.randint(0, arch["vocab_size"], (n, tp + tc))  # [N, Tp+Tc]
    mask = torch.ones_like(ids)  # [N, Tp+Tc]
    advantages = torch.randn(n)  # [N]
    completion_mask = torch.ones(n, tc)  # [N, Tc]
    scorer = score_before if variant == "before" else score_after
    for p in model.parameters():  # the weight gradients exist before the step in a training loop
        p.grad = torch.zeros_like(p)
    _reset_peak()
    base = _rss_bytes()
    logp, entropy = scorer(model, ids, mask, tc)
    loss, _ = grpo_loss(logp, logp.detach(), advantages, completion_mask)
    loss.backward()
    peak = _status_kib("VmHWM") * 1024
    return {
        "variant": variant,
        "peak_bytes_above_start": peak - base,
        "logits_bytes": n * (tc + 1) * arch["vocab_size"] * 4,  # one [N, Tc+1, V] float32 tensor
        "loss": float(loss),
        "entropy_mean": float(entropy.mean()),
        "logp_sum": float(logp.detach().sum()),
    }


def run_variant(variant: str, shapes: dict[str, Any], layers: int, threads: int) -> dict[str, Any]:
    """:func:`measure` in a fresh Python process (so neither variant inherits the other's memory)."""
    code = (
        "import json, sys; from benchmarks.logprob_memory import measure, MARKER; "
        f"print(MARKER + json.dumps(measure({variant!r}, {shapes!r}, {layers}, {threads})))"
    )
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           # glibc: every allocation of 1 MiB or more from mmap, so a freed block leaves the resident set at once
           "MALLOC_MMAP_THRESHOLD_": str(2**20)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root)
    if done.returncode != 0:
        raise RuntimeError(f"the {variant} worker failed:\n{done.stderr[-2000:]}")
    line = [ln for ln in done.stdout.splitlines() if ln.startswith(MARKER)][-1]
    return json.loads(line[len(MARKER):])


def compare(shapes: dict[str, Any], layers: int = 2, threads: int = 1) -> dict[str, Any]:
    """Both variants, each in its own process, and their ratio."""
    results = {v: run_variant(v, shapes, layers, threads) for v in VARIANTS}
    before, after = results["before"], results["after"]
    return {
        "shapes": shapes,
        "layers": layers,
        "threads": threads,
        "load_average": list(os.getloadavg()),
        "before": before,
        "after": after,
        "saved_bytes": before["peak_bytes_above_start"] - after["peak_bytes_above_start"],
        "ratio": after["peak_bytes_above_start"] / before["peak_bytes_above_start"],
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line; tests/test_records.py parses the record's command with it."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.logprob_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (seconds), for tests")
    parser.add_argument("--layers", type=int, default=2, help="transformer layers of the stand-in model (default 2)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    parser.add_argument("--publish", action="store_true", help=f"write the result to {DATA_FILE} (chapter 9 reads it)")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    from benchmarks.common import write_atomic
    from grpo_tutorial.chapters.run_record import package_commit

    args = build_parser().parse_args(argv)
    code = package_commit()  # at the start: the code that runs, whatever changes while it runs
    shapes = {**T4_SHAPES} if not args.quick else dict(QUICK)
    result = compare(shapes, args.layers, args.threads)
    result["command"] = "python -m benchmarks.logprob_memory " + " ".join(sys.argv[1:] if argv is None else argv)
    result.update(code)
    result["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    result["torch"] = torch.__version__
    unit = result["before"]["logits_bytes"]
    print(f"micro-batch [{shapes['rows']}, {shapes['prompt_tokens']} + {shapes['completion_tokens']}], "
          f"{args.layers} layers; one [N, Tc+1, V] float32 logits tensor = {unit:,} bytes")
    for v in VARIANTS:
        b = result[v]["peak_bytes_above_start"]
        print(f"  {v:<7} peak {b:>15,} bytes above the start ({b / unit:.2f} logits tensors)")
    print(f"  saved   {result['saved_bytes']:>15,} bytes; after/before = {result['ratio']:.2f} "
          f"(load {result['load_average'][0]:.1f})")
    for path in [args.out] + ([DATA_FILE] if args.publish else []):
        if path is not None:
            write_atomic(path, json.dumps(result, indent=1) + "\n")  # an interrupted run leaves the last record
            print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()

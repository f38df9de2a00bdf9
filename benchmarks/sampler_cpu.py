"""Issue 43's samplers on the CPU: milliseconds per decoding step, so the CPU defaults rest on a measurement.

``GRPOConfig.merge_adapters_for_sampling`` and ``GRPOConfig.static_cache`` default
to "on where the policy is on a CUDA GPU" (:mod:`grpo_tutorial.sampling.fast`). This
script measures whether they would help on this CPU, at the shapes the CPU runs
sample (chapter 14's tiny LoRA runs, the tiny recipe's 32 prompts x 8 with 4 new
tokens; chapter 9's SmolLM2 run, 2 prompts x 8 with 8 new tokens), and at a longer
budget where decoding dominates. Every completion runs to the budget (the stop
tokens are suppressed), and each sampler is timed ``--repeats`` times after one
warm-up call: the median and range of the milliseconds per decoding step (the
call's seconds over its new tokens, the prompt's encoding included). It prints a
table and the load average (other jobs on the machine slow every row alike)::

    python -m benchmarks.sampler_cpu                 # the tiny model and SmolLM2
    python -m benchmarks.sampler_cpu --models tiny --repeats 1 --new-tokens 4

Samplers: ``plain`` (every weight trained: the policy itself, the dynamic cache),
``lora`` (the PEFT policy, adapters unmerged), ``lora_merged`` (the merged copy),
``static`` and ``lora_merged_static`` (the same with a static KV cache, which is
not compiled on a CPU), ``float16`` (a float16 copy).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks.common import load_average  # noqa: E402
from benchmarks.rollout import NoStopTokens  # noqa: E402

SAMPLERS = ("plain", "lora", "lora_merged", "static", "lora_merged_static", "float16")
#: model -> (preset, LoRA rank, prompts)
MODELS = {
    "tiny": ("tiny-cpu", 16, [f"{a}+{b}=" for a in range(10, 42) for b in (7,)]),
    "smollm2-135m-instruct": ("smollm2-cpu", 16, ["What is 7 * 3?", "What is 9 - 4?"]),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sampler_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: %(default)s")
    parser.add_argument("--samplers", default=",".join(SAMPLERS), help="comma-separated: %(default)s")
    parser.add_argument("--new-tokens", default=None,
                        help="comma-separated budgets (default: the preset's, and 32)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per sampler (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    return parser


def samplers_for(model: Any, tokenizer: Any, rank: int) -> dict[str, tuple[Any, bool]]:
    """Each sampler's model and whether it uses the static cache."""
    from grpo_tutorial.config import GRPOConfig
    from grpo_tutorial.sampling.fast import merged_copy
    from grpo_tutorial.lora import wrap_with_adapters

    out: dict[str, tuple[Any, bool]] = {"plain": (model, False), "static": (model, True),
                                         "float16": (merged_copy(model, torch.float16), False)}
    peft_model = wrap_with_adapters(merged_copy(model), GRPOConfig(use_peft=True, lora_r=rank, lora_dropout=0.0))
    with torch.no_grad():  # trained-looking adapters: B is 0 at initialisation
        generator = torch.Generator().manual_seed(0)
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.01 * torch.randn(param.shape, generator=generator))
    merged = merged_copy(peft_model)
    out.update(lora=(peft_model, False), lora_merged=(merged, False), lora_merged_static=(merged, True))
    return out


def measure(model: Any, tokenizer: Any, prompts: list[str], group_size: int, new_tokens: int, static: bool,
            repeats: int) -> dict[str, Any]:
    """ms per decoding step: one warm-up call, then ``repeats`` timed calls."""
    from grpo_tutorial.rollout import generate_rollouts, stop_token_ids

    no_stop = NoStopTokens(stop_token_ids(model, tokenizer))

    def once(seed: int) -> float:
        start = time.perf_counter()
        rollout = generate_rollouts(model, tokenizer, prompts, group_size=group_size, max_new_tokens=new_tokens,
                                    generator_seed=seed, static_cache=static, logits_processor=(no_stop,))
        seconds = time.perf_counter() - start
        assert rollout.completion_ids.shape[1] == new_tokens
        return 1000 * seconds / new_tokens

    once(0)
    ms = [once(seed) for seed in range(1, repeats + 1)]
    return {"median": statistics.median(ms), "min": min(ms), "max": max(ms)}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    from grpo_tutorial.pretrained import load_policy
    from grpo_tutorial.presets import get_preset

    print(f"load average before: {load_average()}; torch {torch.__version__}, {args.threads} thread(s)")
    names = [s for s in args.samplers.split(",") if s]
    for model_name in [m for m in args.models.split(",") if m]:
        preset_name, rank, prompts = MODELS[model_name]
        preset = get_preset(preset_name)
        model, tokenizer = load_policy(model_name, dtype="float32")
        model.eval()
        prompts = prompts[: preset.prompts_per_step]
        budgets = ([int(b) for b in args.new_tokens.split(",")] if args.new_tokens
                   else [preset.max_new_tokens, 32])
        samplers = samplers_for(model, tokenizer, rank)
        for budget in budgets:
            rows = len(prompts) * preset.group_size
            print(f"\n{model_name}: {rows} rows ({len(prompts)} prompts x {preset.group_size}), {budget} new tokens; "
                  "ms per decoding step, median [min, max]")
            for name in names:
                sampler_model, static = samplers[name]
                got = measure(sampler_model, tokenizer, prompts, preset.group_size, budget, static, args.repeats)
                print(f"  {name:<20}{got['median']:8.2f}  [{got['min']:.2f}, {got['max']:.2f}]", flush=True)
    print(f"\nload average after: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Named runs: the one registry of complete :class:`~grpo_tutorial.config.GRPOConfig` s.

In the spirit of nanoGPT's CPU and GPU command lines: one small setting that runs
on a laptop CPU, and the scale-up values for a GPU, each written down once, here.
The command line (``python -m grpo_tutorial train --preset NAME``), the chapters
(the tiny recipe of chapters 0, 8 and 12, chapter 9's two runs) and the benchmarks
all take their settings from :func:`get_preset`.

- ``"tiny-cpu"``: the tiny character-level Qwen2 learning 2-digit addition on a
  CPU, after a supervised warm start: the GRPO phase of chapter 8's calibrated
  recipe (:class:`~grpo_tutorial.chapters.recipes.TinyAdditionRecipe`), and what
  ``python -m grpo_tutorial train --out DIR`` runs with no other flag. 32 prompts
  per step, G = 8, one pass over each batch (mu = 1) in two minibatches of 128
  completions, so two optimizer updates per step. The first calibration (16
  prompts, mu = 2; GRPOConfig's defaults keep it, with mu = 1) learned less for
  the same CPU time: a second pass over a batch costs as much as a fresh batch and
  teaches less, and more prompts per step average out the gradient's noise. The
  second minibatch is scored after the first update, so its ratios differ from
  1 and clipping has something to do. Raising the learning rate instead does not
  work: at 2e-4 the gain was a fraction of the gain at 1e-4, and 1e-3 collapses
  the policy (chapter 8 shows it).
- ``"smollm2-cpu"``: SmolLM2-135M-Instruct on a 2-core CPU, one-digit arithmetic,
  an 8-token answer budget and a two-word system prompt. The settings of the
  committed CPU run in ``grpo_tutorial/data/smollm2_history.jsonl`` (see
  ``benchmarks/smollm2_run.py`` and chapter 9).
- ``"long-addition-cpu"``: chapter 13's runs, the tiny model on 6-digit sums that it
  may guess or work out (:mod:`grpo_tutorial.chapters.thinking`): the package's
  GRPO defaults (16 prompts, G = 8, lr 1e-4, one update per step), with a budget of
  72 new tokens, which fits a worked-out sum (49-66 tokens with its EOS).
- ``"tool-use-cpu"``: chapter 16's runs, the tiny model calling a calculator
  (:mod:`grpo_tutorial.chapters.tool_use`): the package's GRPO defaults, with a budget of
  28 new tokens, the calculator's included (a call, its answer and the copy take 17-21),
  and at most 2 rounds of calls (``max_tool_calling_iterations``).
- ``"qwen2.5-0.5b-colab-t4"``: Qwen2.5-0.5B-Instruct on a free Colab T4 (16 GB,
  no bfloat16), with GSM8K-length answers, training LoRA adapters (rank 32 on
  every linear layer, alpha 32, learning rate 3e-5: verl's Qwen2.5-0.5B GRPO-LoRA
  run and its LoRA guide, and "LoRA Without Regret"'s rule of about ten times
  full fine-tuning's rate; chapter 9 gives the sources). The frozen base stays in
  float32: a T4 has no bfloat16, and float16 weights are the dtype whose overflow
  Qwen's large activations risk. The reference of any KL term is the base with the
  adapters off (:mod:`grpo_tutorial.lora`). The B*G = 64 completions go through
  the model 8 at a time (``micro_batch_size``), with their gradients accumulated
  into ONE optimizer update per generation batch: on-policy, as with a bigger
  GPU. Its rewards are ``chapters.gsm8k.GSM8K_REWARDS`` with weights 1 and 0.1.
  A warmup of 2 steps (a tenth of chapter 9's 20), and evaluations in batches of
  250 problems (chapter 9 evaluates 500: two calls of one shape, so a static KV
  cache compiles once).
  Every 10 steps it prints 4 of the step's completions with their rewards
  (``log_completions``), and saves them in ``output_dir/completions.jsonl``. A
  checkpoint holds the adapters and their AdamW moments (about 0.2 GB), saved
  every 5 steps.
- ``"qwen2.5-0.5b-colab-t4-full"``: the same run with every weight trained
  (``use_peft=False``), at the full-weight rate 5e-6; a checkpoint is ~6 GB, so
  it saves every 20 steps, and it evaluates 125 problems at a time for memory.

:func:`get_preset` returns a fresh copy, with any fields overridden.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from .config import GRPOConfig

__all__ = ["PRESETS", "QWEN_SYSTEM_PROMPT", "SMOLLM2_SYSTEM_PROMPT", "get_preset"]

#: The CPU run's system prompt: two words (5 tokens with SmolLM2's tokenizer),
#: instead of the ~20-token default system prompt the chat template would add.
SMOLLM2_SYSTEM_PROMPT = "Be brief."

#: The GPU run's system prompt: reason briefly, then give a number that
#: ``extract_answer`` can find (it reads ``\boxed{...}`` first).
QWEN_SYSTEM_PROMPT = (
    "Solve the problem step by step, briefly. Put the final number in \\boxed{}."
)

#: Every named run, by name. Use :func:`get_preset`, which returns a copy.
PRESETS: dict[str, GRPOConfig] = {
    # Chapter 8's recipe; the committed records in grpo_tutorial/data/ and tests/test_golden.py
    # were made with these values (the reasons are in the module docstring).
    "tiny-cpu": GRPOConfig(
        group_size=8,
        prompts_per_step=32,
        max_new_tokens=4,
        temperature=1.0,
        learning_rate=1e-4,
        warmup_steps=0,
        beta=0.0,
        clip_eps=0.2,
        num_iterations=1,
        minibatch_size=128,  # two optimizer updates per step of B*G = 256 completions
        loss_type="grpo",
        max_grad_norm=1.0,
        eval_batch_size=250,
    ),
    "smollm2-cpu": GRPOConfig(
        group_size=8,
        prompts_per_step=2,
        max_new_tokens=8,
        temperature=1.0,
        learning_rate=3e-5,
        num_iterations=1,
        beta=0.0,
        clip_eps=0.2,
        loss_type="grpo",
        max_grad_norm=1.0,
        system_prompt=SMOLLM2_SYSTEM_PROMPT,
        eval_batch_size=50,
    ),
    # Chapter 13: GRPOConfig's defaults, and room for a worked-out 6-digit sum.
    "long-addition-cpu": GRPOConfig(max_new_tokens=72, eval_batch_size=200),
    # Chapter 16: GRPOConfig's defaults, room for a call, the calculator's answer and the copy, two rounds of calls.
    "tool-use-cpu": GRPOConfig(max_new_tokens=28, max_tool_calling_iterations=2, eval_batch_size=100),
    # Chapter 9's GPU run; the values and their sources are in the chapter (section 9.6): LoRA
    # rank 32, alpha 32 on every linear layer at 3e-5 (verl's Qwen2.5-0.5B GRPO-LoRA row and
    # LoRA guide; about ten times the full-weight rate, "LoRA Without Regret"), no dropout
    # (it would make the scoring pass differ from the sampling one), TRL's GRPO defaults
    # (G = 8, beta = 0, clip 0.2, mu = 1), 512 new tokens (GSM8K reasoning; 256 cut off many
    # of this model's answers in published runs), a 10% warmup, ReFT's 0.1 format reward.
    # Issue 43: 20 steps and 500 held-out problems (chapters.gsm8k), so that the session fits an
    # hour on a T4 by the measured LoRA step (gpu_proof.json).
    "qwen2.5-0.5b-colab-t4": GRPOConfig(
        group_size=8,
        prompts_per_step=8,
        max_new_tokens=512,
        temperature=1.0,
        learning_rate=3e-5,
        warmup_steps=2,  # a tenth of chapter 9's 20 steps
        num_iterations=1,
        micro_batch_size=8,  # memory: 8 completions per forward/backward, one update per batch of 64
        beta=0.0,
        clip_eps=0.2,
        loss_type="grpo",
        max_grad_norm=1.0,
        use_peft=True,
        lora_r=32,
        lora_alpha=32.0,
        lora_dropout=0.0,
        lora_target_modules="all-linear",
        reward_weights=[1.0, 0.1],  # correctness_reward, boxed_reward (chapters.gsm8k.GSM8K_REWARDS)
        system_prompt=QWEN_SYSTEM_PROMPT,
        checkpoint_every=5,  # adapters + their AdamW moments: ~0.2 GB, so a disconnect costs at most 5 steps
        eval_batch_size=250,  # greedy: chapter 9's 500 held-out problems in 2 calls of one shape (one compile)
        log_completions=True,  # show what the model writes: 4 of the 64 completions every 10 steps
        num_completions_to_print=4,
        log_every=10,
    ),
}
# The switch chapter 9 offers: every weight trained, at the full-weight rate; a ~6 GB checkpoint
# (float32 weights + AdamW), saved less often; half the evaluation batch, for memory.
PRESETS["qwen2.5-0.5b-colab-t4-full"] = dataclasses.replace(
    PRESETS["qwen2.5-0.5b-colab-t4"], use_peft=False, learning_rate=5e-6, checkpoint_every=20, eval_batch_size=125,
)


def get_preset(name: str, **overrides: Any) -> GRPOConfig:
    """A copy of the preset ``name``, with ``overrides`` applied (and validated).

    >>> get_preset("smollm2-cpu", learning_rate=1e-5).learning_rate
    1e-05
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a preset name (a str), got {type(name).__name__}: {name!r}")
    if name not in PRESETS:
        raise ValueError(f"unknown preset name={name!r}; expected one of {sorted(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"overrides {unknown} are not GRPOConfig fields; expected some of {sorted(fields)}")
    # dataclasses.replace re-runs GRPOConfig's validation on the new values
    return dataclasses.replace(copy.deepcopy(PRESETS[name]), **overrides)

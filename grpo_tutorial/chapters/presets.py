"""Named GRPO settings for real LLMs, and a memory estimate to size a GPU run.

A preset is a complete :class:`~grpo_tutorial.trainer.GRPOConfig` with a name,
in the spirit of nanoGPT's CPU and GPU command lines: one small setting that runs
on a laptop CPU, and the scale-up values for a GPU, written down once.

- ``"smollm2-cpu"``: SmolLM2-135M-Instruct on a 2-core CPU, one-digit arithmetic,
  an 8-token answer budget and a two-word system prompt. The settings of the
  committed CPU run in ``grpo_tutorial/data/smollm2_history.jsonl`` (see
  ``benchmarks/smollm2_run.py`` and chapter 9).
- ``"qwen2.5-0.5b-colab-t4"``: Qwen2.5-0.5B-Instruct on a free Colab T4 (16 GB,
  no bfloat16), with GSM8K-length answers. Weights, gradients and Adam states
  stay in float32; see :func:`training_memory_bytes` for why that fits and why
  pure float16 weights would not train. The B*G = 64 completions go through the
  model 8 at a time (``micro_batch_size``), with their gradients accumulated into
  ONE optimizer update per generation batch: on-policy, as with a bigger GPU.
  Its rewards are ``chapters.gsm8k.GSM8K_REWARDS`` with weights 1 and 0.1.
  Every 10 steps it prints 4 of the step's completions with their rewards
  (``log_completions``), and saves them in ``output_dir/completions.jsonl``.

:func:`get_preset` returns a fresh copy, with any fields overridden.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

from grpo_tutorial.tasks import train_test_split_arithmetic
from grpo_tutorial.config import GRPOConfig

__all__ = [
    "PRESETS",
    "SMOLLM2_SYSTEM_PROMPT",
    "QWEN_SYSTEM_PROMPT",
    "get_preset",
    "smollm2_cpu_data",
    "training_memory_bytes",
    "rl_step_cost",
    "logits_memory_bytes",
]

#: The CPU run's system prompt: two words (5 tokens with SmolLM2's tokenizer),
#: instead of the ~20-token default system prompt the chat template would add.
SMOLLM2_SYSTEM_PROMPT = "Be brief."

#: The GPU run's system prompt: reason briefly, then give a number that
#: ``extract_answer`` can find (it reads ``\boxed{...}`` first).
QWEN_SYSTEM_PROMPT = (
    "Solve the problem step by step, briefly. Put the final number in \\boxed{}."
)

PRESETS: dict[str, GRPOConfig] = {
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
    # Chapter 9's GPU run; the values and their sources are in the chapter (section 9.6):
    # TRL's GRPO defaults (G = 8, beta = 0, clip 0.2, mu = 1), a learning rate above the
    # 1e-6 of runs with 50-100x more samples per update (verl, TRL, DeepSeekMath) so that
    # 50 updates can move the weights, a 10% warmup, and ReFT's 0.1 format reward.
    "qwen2.5-0.5b-colab-t4": GRPOConfig(
        group_size=8,
        prompts_per_step=8,
        max_new_tokens=256,
        temperature=1.0,
        learning_rate=5e-6,
        warmup_steps=5,
        num_iterations=1,
        micro_batch_size=8,  # memory: 8 completions per forward/backward, one update per batch of 64
        beta=0.0,
        clip_eps=0.2,
        loss_type="grpo",
        max_grad_norm=1.0,
        reward_weights=[1.0, 0.1],  # correctness_reward, boxed_reward (chapters.gsm8k.GSM8K_REWARDS)
        system_prompt=QWEN_SYSTEM_PROMPT,
        checkpoint_every=25,  # one checkpoint is ~6 GB (float32 weights + Adam): twice in a 50-step run
        eval_batch_size=64,
        log_completions=True,  # show what the model writes: 4 of the 64 completions every 10 steps
        num_completions_to_print=4,
        log_every=10,
    ),
}


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


def smollm2_cpu_data(n_train: int = 2000, n_test: int = 200, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """The CPU run's data: one-digit ``+``, ``-`` and ``*`` questions (``"What is 7 * 3?"``).

    There are 300 such problems. ``n_test`` distinct ones are held out; the
    ``n_train`` training rows are drawn, with repeats, from the others only. The
    committed run (``benchmarks/smollm2_run.py``) and chapter 9 both call this.
    """
    return train_test_split_arithmetic(n_train, n_test, seed, op=["+", "-", "*"], digits=1, style="question")


_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2}


def _dtype_bytes(name: str, what: str) -> int:
    if name not in _BYTES:
        raise ValueError(f"{what}={name!r} is not a known dtype; expected one of {sorted(_BYTES)}")
    return _BYTES[name]


def training_memory_bytes(
    num_params: int,
    *,
    weights: str = "float32",
    master_weights: bool = False,
    optimizer_states: str = "float32",
) -> dict[str, int]:
    """Bytes of the model state during training with AdamW, before activations.

    Args:
        num_params: trainable parameters.
        weights: dtype of the weights the forward pass uses (gradients have the
            same dtype).
        master_weights: keep an extra float32 copy that the optimizer updates
            (mixed precision); pointless when ``weights`` is already float32.
        optimizer_states: dtype of AdamW's two moment estimates.

    Returns:
        ``weights``, ``grads``, ``master``, ``adam`` and ``total``, in bytes.

    >>> training_memory_bytes(10)["total"]  # 4 + 4 + 8 bytes per parameter
    160
    >>> training_memory_bytes(10, weights="fp16", master_weights=True)["total"]  # 2 + 2 + 4 + 8
    160
    """
    if isinstance(num_params, bool) or not isinstance(num_params, int) or num_params < 1:
        raise ValueError(f"num_params must be a positive int, got {num_params!r}")
    if not isinstance(master_weights, bool):
        raise TypeError(f"master_weights must be a bool, got {master_weights!r}")
    w = _dtype_bytes(weights, "weights")
    o = _dtype_bytes(optimizer_states, "optimizer_states")
    parts = {
        "weights": w * num_params,
        "grads": w * num_params,
        "master": 4 * num_params if master_weights else 0,
        "adam": 2 * o * num_params,  # first and second moments
    }
    parts["total"] = sum(parts.values())
    return parts


def logits_memory_bytes(rows: int, seq_len: int, vocab_size: int, *, dtype: str = "float32") -> int:
    """Bytes of one ``[rows, seq_len, vocab_size]`` logits tensor.

    For a model with a large vocabulary (Qwen2.5: 151,936 tokens) this is often
    the largest activation of a training step, which is why the trainer scores
    completions in minibatches (``GRPOConfig.minibatch_size``).

    >>> logits_memory_bytes(2, 3, 5)
    120
    """
    for name, value in (("rows", rows), ("seq_len", seq_len), ("vocab_size", vocab_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return math.prod((rows, seq_len, vocab_size, _dtype_bytes(dtype, "dtype")))


def rl_step_cost(
    algorithm: str,
    num_params: int,
    *,
    beta: float = 0.04,
    mu: int = 1,
    reward_model: bool = False,
    weights: str = "float32",
    master_weights: bool = False,
    optimizer_states: str = "float32",
) -> dict[str, Any]:
    """Count what one RL step holds and computes: PPO (with a critic and GAE) or GRPO.

    Counts are per step, over the batch of sampled completions, after generation
    (sampling costs the same for both when they sample the same completions).

    Models held: GRPO trains the policy and keeps a frozen reference when
    ``beta > 0``. PPO also trains a critic (value model) the size of the policy
    (its scalar value head is ignored). ``reward_model=True`` adds a frozen learned
    reward model of the same size to both (False: a reward function, as in this book).

    Passes over the batch (as this package's trainer does them, with the whole
    batch in one optimizer update per epoch): one no-grad forward for the old
    policy's log-probs when ``mu > 1`` (with ``mu = 1`` the update's own log-probs
    are the old policy's, and neither this package nor TRL runs that pass), one for
    the reference if ``beta > 0``, one for the reward model if any; PPO adds one
    no-grad critic forward for the values that GAE needs. Each of the ``mu`` update
    epochs then runs a forward and a backward pass through every trained model.

    Returns:
        ``trained`` and ``frozen`` (model names), ``forward_passes``,
        ``backward_passes``, ``forward_equivalents`` (forward + 2 x backward, the
        usual estimate that a backward pass costs two forwards), and
        ``state_bytes`` (``training_memory_bytes`` per trained model plus the
        weights of each frozen one; activations excluded).

    >>> grpo, ppo = rl_step_cost("grpo", 10), rl_step_cost("ppo", 10)
    >>> grpo["forward_passes"], grpo["backward_passes"], ppo["forward_passes"], ppo["backward_passes"]
    (2, 1, 4, 2)
    >>> grpo["state_bytes"], ppo["state_bytes"]  # 16+4 and 2*16+4 bytes per parameter
    (200, 360)
    """
    if algorithm not in ("ppo", "grpo"):
        raise ValueError(f"algorithm={algorithm!r} is not supported; use 'ppo' or 'grpo'")
    if isinstance(mu, bool) or not isinstance(mu, int) or mu < 1:
        raise ValueError(f"mu must be a positive int (update epochs per batch), got {mu!r}")
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or beta < 0:
        raise ValueError(f"beta must be a number >= 0, got {beta!r}")
    if not isinstance(reward_model, bool):
        raise TypeError(f"reward_model must be a bool, got {reward_model!r}")
    trained = ["policy"] + (["critic"] if algorithm == "ppo" else [])
    frozen = (["reference"] if beta > 0 else []) + (["reward_model"] if reward_model else [])
    old_policy = 1 if mu > 1 else 0  # at mu = 1 the update's log-probs are the old ones
    no_grad_forwards = old_policy + len(frozen) + (1 if algorithm == "ppo" else 0)  # + frozen models, values
    forward = no_grad_forwards + mu * len(trained)
    backward = mu * len(trained)
    per_trained = training_memory_bytes(
        num_params, weights=weights, master_weights=master_weights, optimizer_states=optimizer_states
    )["total"]
    per_frozen = _dtype_bytes(weights, "weights") * num_params
    return {
        "algorithm": algorithm,
        "trained": trained,
        "frozen": frozen,
        "models_held": len(trained) + len(frozen),
        "forward_passes": forward,
        "backward_passes": backward,
        "forward_equivalents": forward + 2 * backward,
        "state_bytes": len(trained) * per_trained + len(frozen) * per_frozen,
    }

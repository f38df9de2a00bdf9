"""What a run costs: the memory of its model state and logits, and the passes of one RL step.

Chapter 9 sizes the GPU run with :func:`training_memory_bytes` (weights,
gradients, Adam states) and :func:`logits_memory_bytes` (the largest activation
of a model with a big vocabulary); chapter 0 compares what one step of PPO and
of GRPO holds and computes with :func:`rl_step_cost`. Chapter 9's precision
section counts which weights a small update leaves unchanged in bfloat16 with
:func:`bf16_update_threshold` and :func:`bf16_moved`. The runs themselves are
named presets in :mod:`grpo_tutorial.presets`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._checks import check_int

__all__ = [
    "training_memory_bytes",
    "rl_step_cost",
    "logits_memory_bytes",
    "bf16_update_threshold",
    "bf16_moved",
]


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
    check_int(None, "num_params", num_params, 1)
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
        check_int(None, name, value, 1)
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
    check_int(None, "mu", mu, 1, hint=" (update epochs per batch)")
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


def bf16_update_threshold(lr: float) -> float:
    """The smallest ``|w|`` whose bfloat16 value ``w - lr`` rounds back to ``w``: ``2**(floor(log2 lr) + 9)``.

    bfloat16 keeps 8 significant bits (7 stored), so its numbers in
    ``[2**e, 2**(e+1))`` are evenly spaced, ``2**(e-7)`` apart: the spacing is
    constant inside each power-of-two interval, not proportional to ``|w|``.
    ``w - lr`` is computed exactly (or in float32) and rounded to the nearest
    bfloat16, so it stays at ``w`` when ``lr`` is less than half the spacing on
    the side it moves to, ``2**(e-8)``. With ``2**k < lr < 2**(k+1)``
    (``k = floor(log2 lr)``) every weight of an interval with ``e - 8 <= k`` moves
    and none of a higher one does: the threshold is ``2**(k+9)``, between
    ``256 lr`` and ``512 lr`` depending on where ``lr`` lies between two powers
    of two. One weight at the threshold still moves: ``+2**(k+9)`` itself,
    whose neighbour below is only half as far (see :func:`bf16_moved`).

    A learning rate within a relative ``2**-8`` of a power of two is refused
    (``ValueError``): there ``lr`` can equal half a spacing, and the result then
    depends on round-half-to-even, that is on each weight's last bit, and on
    whether the kernel rounds ``lr`` to bfloat16 before subtracting.

    >>> bf16_update_threshold(5e-6) == 2**-9  # 2**-18 < 5e-6 < 2**-17
    True
    >>> bf16_update_threshold(3e-5) == 2**-7
    True
    """
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    k = math.floor(math.log2(lr))
    if not 2.0**k * (1 + 2**-8) < lr < 2.0 ** (k + 1) * (1 - 2**-9):
        raise ValueError(
            f"lr={lr!r} is within 2**-8 of a power of two: whether w - lr rounds back to w then "
            "depends on round-half-to-even ties; pick another lr")
    return 2.0 ** (k + 9)


def bf16_moved(weights: torch.Tensor, lr: float) -> torch.Tensor:
    """Which weights, stored as bfloat16, an update of ``-lr`` changes: ``|w| < T`` or ``w == +T``.

    ``T`` is :func:`bf16_update_threshold`. The weights are rounded to
    bfloat16 first (as storing them would). The one weight at ``T`` that moves is
    ``+T``: ``w - lr`` moves it down, into the interval below, whose spacing is
    half as large, and ``lr`` exceeds half of that. ``-T`` moves away from zero,
    where the spacing is the full one, and stays. The rule is exact: a test
    compares it with bfloat16 arithmetic on every finite bfloat16 number.
    Returns a bool tensor of ``weights``' shape.
    """
    threshold = bf16_update_threshold(lr)
    w = weights.detach().to(torch.bfloat16).float()
    return (w.abs() < threshold) | (w == threshold)

"""The optimizer of stage 5 (update): AdamW over the trainable weights, with a linear warmup."""

from __future__ import annotations

import math
import warnings

import torch

from .config import GRPOConfig
from .warn import GRPOWarning

__all__ = ["clip_and_step", "fastest_adamw_kwargs", "finish_update", "make_optimizer", "trainable_parameters"]


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters with ``requires_grad``; refuses a model with none."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (all requires_grad=False)")
    half = sorted({str(p.dtype) for p in params if p.dtype in (torch.float16, torch.bfloat16)})
    if half:
        warnings.warn(
            f"the policy's trainable weights are {', '.join(half)}: AdamW updates of size lr "
            "(e.g. 1e-6) are mostly rounded away in 16-bit weights, so training may silently do "
            "almost nothing. Load the policy in float32 for training "
            "(load_policy(name, dtype='float32')); generation can still be fast enough.",
            GRPOWarning,
            stacklevel=3,
        )
    return params


#: Devices where torch has a fused AdamW kernel (one kernel for all parameters).
FUSED_DEVICES = ("cpu", "cuda", "mps", "xpu")


def fastest_adamw_kwargs(params: list[torch.nn.Parameter]) -> dict:
    """``{"fused": True}`` where torch has a fused AdamW for these parameters, else ``{"foreach": True}``.

    The fused kernel updates every parameter in one pass (about 4x faster than
    the default per-tensor loop for the tiny model on a CPU); it computes the same
    update, up to floating-point rounding (tests/test_optim.py checks it).
    """
    devices = {p.device.type for p in params}
    if devices <= set(FUSED_DEVICES) and all(p.is_floating_point() for p in params):
        return {"fused": True}
    return {"foreach": True}


def make_optimizer(
    params: list[torch.nn.Parameter], config: GRPOConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with the config's learning rate and weight decay, and its warmup schedule.

    The learning rate rises linearly over ``config.warmup_steps`` optimizer
    updates, then stays constant. The AdamW is the fastest correct one torch has
    on the parameters' device (:func:`fastest_adamw_kwargs`).
    """
    optimizer = torch.optim.AdamW(
        params, lr=config.learning_rate, weight_decay=config.weight_decay, **fastest_adamw_kwargs(params)
    )
    warmup = config.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda update: min(1.0, (update + 1) / (warmup + 1)) if warmup else 1.0
    )
    return optimizer, scheduler


def clip_and_step(
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    max_grad_norm: float | None,
) -> float:
    """One optimizer update from the accumulated gradients; returns their norm before clipping.

    The gradients are clipped to ``max_grad_norm`` (None: measured, not clipped); ``scheduler``
    (None: a constant learning rate, PPO's value model) steps with the optimizer.
    A non-finite norm skips the update (the weights stay as they are): the caller
    counts the skip. The gradients are zeroed either way.
    """
    max_norm = max_grad_norm if max_grad_norm is not None else math.inf
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if math.isfinite(norm):
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


#: What the warning about a skipped update says after its cause.
SKIPPED = (
    "skipped this optimizer update (gradients zeroed). Training continues and history['skipped_updates'] counts "
    "the skips. If it keeps happening, lower learning_rate, check the reward functions, or use float32."
)


def finish_update(
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_grad_norm: float | None,
    loss: float,
) -> tuple[float, str | None]:
    """The update after its gradients were accumulated: ``(grad norm, None)``, or ``(norm, why)`` if it was skipped.

    A non-finite ``loss`` (its backward pass was never run) skips the update,
    with NaN for the norm; otherwise :func:`clip_and_step`, which skips it for a
    non-finite norm. The gradients are zeroed either way. ``why`` is the
    warning to give (the cause, then :data:`SKIPPED`); the caller counts the skip.
    """
    if not math.isfinite(loss):
        optimizer.zero_grad(set_to_none=True)
        return math.nan, f"the loss is {loss}; {SKIPPED}"
    norm = clip_and_step(params, optimizer, scheduler, max_grad_norm)
    return norm, None if math.isfinite(norm) else f"the gradient norm is {norm}; {SKIPPED}"

"""Generation on a CPU: the linear layers multiply with oneDNN, PyTorch's other matmul library.

On a CPU, a float32 ``nn.Linear`` calls the BLAS PyTorch was built with (MKL in
the x86 wheels). PyTorch also carries oneDNN, and its compiler uses it for linear
layers whose weights do not change: the weight is reordered once into a blocked
layout, and every call multiplies against that layout. On the book's machine (an
AMD EPYC, one thread) oneDNN did SmolLM2's decoding-step matmuls with 32 rows
2.3 times faster than MKL, and the 2048 x 2048 product at 236 GFLOP/s against
105 (``python -m benchmarks.gemm_backends``).

During ``generate`` the weights do not change, so :func:`onednn_linears` reorders
each weight once per call and lets every linear layer multiply with that copy.
The products agree with the BLAS ones to float rounding (a relative 1e-6), so the
sampled tokens follow the same distribution; a token whose two best candidates
are that close may come out differently. The scorer and the loss keep the
model's own layers, so the log-probabilities the trainer uses are not touched.

Costs: the reordered copy of the weights lives as long as the ``generate`` call
(for SmolLM2, 0.5 GB) and takes a fraction of a second to build (0.16 s).

The operators are PyTorch internals (``torch.ops.mkldnn``, what the compiler
emits), so :func:`available` checks that they exist and compute the right thing
before anything uses them; without them, generation uses the model's own layers.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any, Iterator

import torch

__all__ = ["available", "onednn_linears", "use_onednn"]


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether this PyTorch build has oneDNN's packed linear and it agrees with ``F.linear``."""
    try:
        weight = torch.arange(12.0).reshape(3, 4) / 7  # [out=3, in=4]
        bias = torch.tensor([0.5, -1.0, 2.0])
        x = torch.arange(8.0).reshape(2, 4) / 5  # [rows=2, in=4]
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 2)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    except (AttributeError, RuntimeError, TypeError):
        return False
    return bool(torch.allclose(out, torch.nn.functional.linear(x, weight, bias), atol=1e-5))


def _linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def use_onednn(model: Any, setting: bool | None) -> bool:
    """Resolve generation's ``onednn`` setting for ``model``.

    ``None`` (the default) means: yes when the model's plain ``nn.Linear`` layers
    (exactly that class; other layer types are left alone) are all float32 on the
    CPU, this PyTorch has the operators, oneDNN is enabled
    (``torch.backends.mkldnn.enabled``) and CPU autocast is off (the operator is
    not covered by autocast). ``True`` asks for it and raises if it cannot be
    used; ``False`` never uses it.
    """
    if setting is not None and not isinstance(setting, bool):
        raise TypeError(f"onednn must be None, True or False, got {setting!r}")
    if setting is False:
        return False
    why = None
    if not torch.backends.mkldnn.enabled:
        why = "oneDNN is disabled (torch.backends.mkldnn.enabled is False)"
    elif torch.is_autocast_enabled("cpu"):
        why = "CPU autocast is on, and the oneDNN operator is not covered by autocast"
    elif not isinstance(model, torch.nn.Module):
        why = "the model is not a torch.nn.Module"
    else:
        layers = _linears(model)
        if not layers:
            why = "the model has no torch.nn.Linear layers"
        elif any(m.weight.device.type != "cpu" or m.weight.dtype != torch.float32 for m in layers):
            why = "oneDNN generation is for float32 models on the CPU"
        elif not available():
            why = "this PyTorch build has no oneDNN packed linear (torch.ops.mkldnn)"
    if why is None:
        return True
    if setting is True:
        raise ValueError(f"onednn=True cannot be used: {why}")
    return False


def _packed_forward(x: torch.Tensor, *, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@contextmanager
def onednn_linears(model: torch.nn.Module, rows: int) -> Iterator[int]:
    """Inside the block, every ``nn.Linear`` of ``model`` multiplies with a oneDNN copy of its weight.

    ``rows`` is the number of rows a call is expected to multiply (the batch of a
    decoding step); oneDNN picks its blocking for it, and any other row count
    still gives the right product. Gradients are off inside (the operator has no
    backward), and each layer's own ``forward`` is back when the block exits,
    also after an exception. A layer that already has a ``forward`` of its own
    (a hook library's wrapper, a user's patch, or this block entered twice) is
    left as it is. Yields the number of layers switched.
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    switched: list[torch.nn.Linear] = []
    try:
        with torch.no_grad():
            for layer in _linears(model):
                if "forward" in vars(layer):  # someone else's forward: do not bypass or remove it
                    continue
                packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach().contiguous(), rows)
                bias = None if layer.bias is None else layer.bias.detach()
                layer.forward = functools.partial(_packed_forward, packed=packed, bias=bias)
                switched.append(layer)
            yield len(switched)
    finally:
        for layer in switched:
            vars(layer).pop("forward", None)  # the class's forward again

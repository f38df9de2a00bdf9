"""Small input checks shared by the core functions, so every error names what is wrong."""

from __future__ import annotations

import torch


def as_float_tensor(name: str, value) -> torch.Tensor:
    """Turn lists/arrays into a float tensor; reject anything that is not numeric."""
    if isinstance(value, torch.Tensor):
        t = value
    else:
        try:
            t = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{name} must be numeric (a tensor, array or list of numbers); got {type(value).__name__}: {err}") from None
    if t.dtype == torch.bool or not (t.is_floating_point() or t.dtype in _INT_DTYPES):
        raise TypeError(f"{name} must hold numbers, got dtype {t.dtype}")
    return t if t.is_floating_point() else t.float()


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def require_tensor(name: str, value, *, dim: int | None = None, floating: bool | None = None) -> torch.Tensor:
    """Check that ``value`` is a tensor with ``dim`` dimensions (and float or integer dtype)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(value.shape)}")
    if floating is True and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if floating is False and value.dtype not in _INT_DTYPES:
        raise TypeError(f"{name} must be an integer tensor (token ids), got dtype {value.dtype}")
    return value


def same_shape(**tensors: torch.Tensor) -> None:
    """All named tensors must share one shape."""
    items = [(k, tuple(v.shape)) for k, v in tensors.items() if v is not None]
    first_name, first_shape = items[0]
    for name, shape in items[1:]:
        if shape != first_shape:
            listing = ", ".join(f"{k}={s}" for k, s in items)
            raise ValueError(f"shape mismatch: {name} has shape {shape} but {first_name} has {first_shape} ({listing})")


def one_of(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {sorted(allowed)}, got {value!r}")

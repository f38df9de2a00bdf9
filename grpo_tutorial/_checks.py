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


# ---------------------------------------------------------------------------
# Config fields: one set of validators for GRPOConfig and SFTConfig
# ---------------------------------------------------------------------------


def is_int(value) -> bool:
    """An int that is not a bool (``True`` is an int to Python, but never a step count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite int or float that is not a bool."""
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def config_error(owner: str, name: str, value, expected: str, hint: str = "") -> ValueError:
    """The one message every config field error uses: owner, field, expectation, value."""
    return ValueError(f"{owner}.{name} must be {expected}, got {value!r}{hint}")


def check_int(owner: str, name: str, value, minimum: int, *, optional: bool = False, hint: str = "") -> None:
    """``value`` is an int >= ``minimum`` (or None when ``optional``)."""
    if optional and value is None:
        return
    if not is_int(value) or value < minimum:
        raise config_error(owner, name, value, f"{'None or ' if optional else ''}an int >= {minimum}", hint)


def check_number(owner: str, name: str, value, ok, expected: str, *, optional: bool = False) -> None:
    """``value`` is a finite number for which ``ok(value)`` holds (or None when ``optional``)."""
    if optional and value is None:
        return
    if not is_number(value) or not ok(value):
        raise config_error(owner, name, value, expected)


def check_choice(owner: str, name: str, value, allowed) -> None:
    if value not in allowed:
        raise config_error(owner, name, value, f"one of {list(allowed)}")

"""Small input checks shared by the core functions, so every error names what is wrong."""

from __future__ import annotations

import threading
from typing import Any

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
# Ints, numbers and flags: one set of validators for the whole package
# ---------------------------------------------------------------------------
#
# The error policy is Python's: a value of the wrong *type* raises ``TypeError``
# (``group_size=4.0``, ``n="5"``, ``steps=True``), a value of the right type that is
# out of range raises ``ValueError`` (``group_size=1``). Both messages read
# ``<owner>.<name> must be <what is expected>, got <value>``; a type error adds the
# type it got. ``owner`` is the config class (``"GRPOConfig"``) for a field, or None
# for a function's argument.


def is_int(value) -> bool:
    """A Python int that is not a bool (``True`` is an int to Python, but never a step count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite int or float that is not a bool."""
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _label(owner: str | None, name: str) -> str:
    return f"{owner}.{name}" if owner else name


def config_error(owner: str | None, name: str, value, expected: str, hint: str = "") -> ValueError:
    """The one message every value error uses: owner, field, expectation, value."""
    return ValueError(f"{_label(owner, name)} must be {expected}, got {value!r}{hint}")


def type_error(owner: str | None, name: str, value, expected: str, hint: str = "") -> TypeError:
    """:func:`config_error`'s message for a value of the wrong type, with the type it got."""
    return TypeError(f"{_label(owner, name)} must be {expected}, got {value!r} (type {type(value).__name__}){hint}")


def check_int(
    owner: str | None, name: str, value, minimum: int | None = None, *, optional: bool = False, hint: str = ""
) -> int | None:
    """Check that ``value`` is an int ``>= minimum`` (or None when ``optional``) and return it.

    The one int check of the package, for config fields (``owner="GRPOConfig"``)
    and function arguments (``owner=None``) alike. A bool, a float, a str or a
    numpy integer raises ``TypeError``; an int below ``minimum`` raises
    ``ValueError``:

    >>> check_int("GRPOConfig", "group_size", 1, 2)
    Traceback (most recent call last):
    ValueError: GRPOConfig.group_size must be an int >= 2, got 1
    >>> check_int(None, "n", 4.0, 1)
    Traceback (most recent call last):
    TypeError: n must be an int >= 1, got 4.0 (type float)
    """
    if optional and value is None:
        return None
    expected = f"{'None or ' if optional else ''}an int" + ("" if minimum is None else f" >= {minimum}")
    if not is_int(value):
        raise type_error(owner, name, value, expected, hint)
    if minimum is not None and value < minimum:
        raise config_error(owner, name, value, expected, hint)
    return value


def check_number(owner: str | None, name: str, value, ok, expected: str, *, optional: bool = False) -> float | None:
    """Check that ``value`` is a finite number for which ``ok(value)`` holds; return it as a float.

    A value that is not an int or a float (or is a bool) raises ``TypeError``;
    a number that is not finite, or fails ``ok``, raises ``ValueError``.
    """
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise type_error(owner, name, value, expected)
    if not is_number(value) or not ok(value):
        raise config_error(owner, name, value, expected)
    return float(value)


def check_flag(owner: str | None, name: str, value, *, optional: bool = False, expected: str | None = None) -> None:
    """Check that ``value`` is True or False (or None when ``optional``); anything else raises ``TypeError``."""
    if optional and value is None:
        return
    if not isinstance(value, bool):
        raise type_error(owner, name, value, expected or f"{'None, ' if optional else ''}True or False")


def check_choice(owner: str | None, name: str, value, allowed) -> None:
    """``value`` is one of ``allowed``; anything else (of any type) raises ``ValueError``."""
    if value not in allowed:
        raise config_error(owner, name, value, f"one of {list(allowed)}")


def check_time_limit(owner: str | None, name: str, seconds: Any, optional: bool = True,
                     expected: str = "a finite number > 0") -> None:
    """A time limit in seconds: a finite number > 0 (``expected`` says so in the caller's words; None where
    ``optional``) that ``threading`` can wait for: at most ``threading.TIMEOUT_MAX`` (about 292 years on
    64-bit Linux; a longer limit passes every other check, and then every call fails)."""
    check_number(owner, name, seconds, lambda v: v > 0, f"{'None or ' if optional else ''}{expected}",
                 optional=optional)
    if seconds is not None and seconds > threading.TIMEOUT_MAX:
        raise config_error(owner, name, seconds, f"at most threading.TIMEOUT_MAX ({threading.TIMEOUT_MAX:.3g} s), "
                                                 "the longest a thread can be waited for")

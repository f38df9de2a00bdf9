"""Training warnings: :class:`GRPOWarning`, issued once per run, pointing at the user's line.

A warning about a run (no learning signal, truncation, a skipped update, a
resume with another config) is a :class:`GRPOWarning`. :class:`WarnOnce` issues
each kind once per run and remembers which it issued (the checkpoint stores
that, so a resumed run does not repeat them). The warning's ``stacklevel`` is
computed (:func:`caller_stacklevel`): it points at the first frame outside the
package, the user's ``trainer.train(...)`` line, wherever inside the package
the warning was raised.

A shared leaf: it imports nothing of the package, so both the stages (the step,
the optimizer) and the run machinery (``run/``) use it.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Sequence

__all__ = ["GRPOWarning", "WarnOnce", "caller_stacklevel", "warn_now"]

#: ``grpo_tutorial/``: frames inside it (and inside its subpackages) are the package's own.
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class GRPOWarning(UserWarning):
    """A training failure mode was detected (no signal, truncation, collapse, NaN)."""


def caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside the package.

    Call it in the function that calls ``warnings.warn``: level 1 is that function.
    """
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(PACKAGE_DIR + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def warn_now(message: str) -> None:
    """A :class:`GRPOWarning` that is not limited to once per run (a resume, a replaced checkpoint), at the user's line."""
    warnings.warn(message, GRPOWarning, stacklevel=caller_stacklevel())


class WarnOnce:
    """Issue each kind of :class:`GRPOWarning` at most once per run."""

    def __init__(self, already: Sequence[str] = ()) -> None:
        self.issued: set[str] = set(already)

    def __call__(self, kind: str, message: str) -> None:
        if kind in self.issued:
            return
        self.issued.add(kind)
        warnings.warn(message, GRPOWarning, stacklevel=caller_stacklevel())

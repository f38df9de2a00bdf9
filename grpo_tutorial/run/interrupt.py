"""Ctrl-C during training: finish the step, save, then stop.

:class:`StopAfterStep` turns the first Ctrl-C (SIGINT) into a request that the
training loop reads between steps, so the step in flight completes and a
checkpoint can be saved. A second Ctrl-C aborts at once. Outside the main thread
(where Python cannot install signal handlers) it does nothing.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

__all__ = ["StopAfterStep"]


class StopAfterStep:
    """A context manager; ``requested`` becomes True at the first Ctrl-C inside it."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(
            "\nCtrl-C: finishing the current step, then saving a checkpoint "
            "(press Ctrl-C again to abort at once, losing this step)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> "StopAfterStep":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

"""Chat messages (TRL's conversational format): the one test of whether a prompt or a completion is one.

A prompt or a completion is either a string or a list of messages such as
``[{"role": "user", "content": "What is 2+3?"}]``. Stage 1 (``rollout``) and the
datasets (``tasks``) ask it of prompts, stage 2 (``answers``) of completions, and
the run machinery (``run/completions``) of both when it prints them, all with
:func:`is_chat_messages`.

This module imports nothing from the package, so the stages and ``run/`` may
both import it (``tests/test_layout.py`` keeps it that way).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["is_chat_messages"]


def is_chat_messages(value: Any) -> bool:
    """True for a non-empty list of chat messages, each a mapping with ``"role"`` and ``"content"`` keys.

    A string (a plain prompt or completion), an empty list, and a list holding
    anything that is not such a message give False.

    >>> is_chat_messages([{"role": "user", "content": "2+3="}])
    True
    >>> is_chat_messages("2+3=") or is_chat_messages([]) or is_chat_messages([{"content": "5"}])
    False
    """
    return (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and len(value) > 0
        and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in value)
    )

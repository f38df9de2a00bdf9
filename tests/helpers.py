"""What many test files share (issue 56): reward functions in TRL's signature for runs of the untrained tiny model.

Import as ``from helpers import length_reward`` (pytest puts ``tests/`` on the path). A test file whose reward differs
(another scale, another signature) keeps its own under its own name.
"""

from __future__ import annotations


def length_reward(completions, **kwargs):
    """The completion's length in characters: it differs between an untrained model's completions, so groups
    carry a learning signal."""
    return [float(len(c)) for c in completions]

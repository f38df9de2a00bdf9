"""What many test files share (issue 56): the tiny models, reward functions in TRL's signature for runs of the
untrained tiny model, a step's stub state and small settings.

Import as ``from helpers import length_reward`` (pytest puts ``tests/`` on the path). A test file whose reward differs
(another scale, another signature) keeps its own under its own name.
"""

from __future__ import annotations


def length_reward(completions, **kwargs):
    """The completion's length in characters: it differs between an untrained model's completions, so groups
    carry a learning signal."""
    return [float(len(c)) for c in completions]


class StepState:
    """Where a run stands, for a step called without the trainer (as the trainer's ``RunState`` holds it):
    steps taken, updates skipped, and the kinds of the warnings the step gave, kept rather than shown."""

    def __init__(self, step: int = 0) -> None:
        self.step, self.skipped_updates, self.warnings = step, 0, []

    def warn(self, kind: str, message: str) -> None:
        self.warnings.append(kind)


#: Settings of two optimizer updates a step (minibatches of 8 of the 16 completions) at a learning rate that moves
#: the tiny model visibly in one step: for tests of what happens between updates (a sampler synced, a copy stale).
TWO_UPDATES = {"prompts_per_step": 4, "learning_rate": 1e-2, "minibatch_size": 8}


def small_config(**overrides):
    """The tests' small run: 2 prompts x 4 completions of at most 3 tokens, every other setting the default;
    ``overrides`` change any of them."""
    from grpo_tutorial import GRPOConfig

    return GRPOConfig(**{"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 3, **overrides})


#: The 32-wide, two-layer shape most trainer tests use: small enough that a training step takes milliseconds.
SMALL_SHAPE = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64}


def tiny_model(seed: int = 0):
    """A fresh ``(model, tokenizer)``: the default tiny Qwen2 (hidden 128, 3 layers), ``build_tiny_policy(seed=seed)``.
    Tests and fixtures take conftest's fixtures (``make_tiny_policy``), which call this; module-level helpers call it."""
    from grpo_tutorial import build_tiny_policy  # here: a test file that never builds a model does not import it

    return build_tiny_policy(seed=seed)


def small_model(seed: int = 0, **changes):
    """A fresh ``(model, tokenizer)`` of :data:`SMALL_SHAPE` (any ``build_tiny_policy`` argument in ``changes``
    overrides it); conftest's ``make_small_policy`` calls this."""
    from grpo_tutorial import build_tiny_policy

    return build_tiny_policy(**{**SMALL_SHAPE, **changes}, seed=seed)

"""GRPO from the ground up: the package behind the book.

One GRPO step is a straight pipeline, and the modules mirror it::

    tasks -> rollout -> rewards -> advantages -> logprobs -> loss/kl -> trainer

Everything a chapter uses is importable from here.
"""

__version__ = "0.1.0"

from .advantages import group_advantages
from .logprobs import completion_mask, sequence_logprobs, token_logprobs
from .kl import kl_estimate
from .loss import grpo_loss, sequence_logprob_loss
from .rewards import (
    combined_reward,
    correctness_reward,
    extract_answer,
    format_reward,
)
from .tasks import load_gsm8k, make_arithmetic_dataset, make_countdown_dataset

__all__ = [
    "group_advantages",
    "token_logprobs",
    "sequence_logprobs",
    "completion_mask",
    "kl_estimate",
    "grpo_loss",
    "sequence_logprob_loss",
    "extract_answer",
    "correctness_reward",
    "format_reward",
    "combined_reward",
    "make_arithmetic_dataset",
    "make_countdown_dataset",
    "load_gsm8k",
]


def _optional(module: str, names: list[str]) -> None:
    """Export the stateful half (models, rollout, trainer) when it is present."""
    import importlib

    try:
        mod = importlib.import_module(f".{module}", __name__)
    except ModuleNotFoundError as err:  # the module itself is not written yet
        if err.name != f"{__name__}.{module}":
            raise
        return
    for name in names:
        globals()[name] = getattr(mod, name)
        __all__.append(name)


_optional("models", ["load_policy", "build_tiny_policy"])
_optional("rollout", ["generate_rollouts", "Rollout"])
_optional("trainer", ["GRPOConfig", "GRPOTrainer"])
_optional("plotting", ["plot_history"])

"""GRPO from the ground up: the package behind the book.

One GRPO step is a straight pipeline, and the modules mirror it::

    tasks -> rollout -> rewards -> advantages -> logprobs -> loss/kl -> trainer

Everything a chapter uses is importable from here.
"""

__version__ = "0.1.0"

from .advantages import group_advantages
from .logprobs import completion_logprobs, completion_mask, token_entropy, token_logprobs
from .kl import kl_estimate
from .loss import grpo_loss, sequence_logprob_loss

__all__ = [
    "group_advantages",
    "token_logprobs",
    "completion_logprobs",
    "token_entropy",
    "completion_mask",
    "kl_estimate",
    "grpo_loss",
    "sequence_logprob_loss",
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


_optional("rewards", ["extract_answer", "correctness_reward", "format_reward", "combined_reward"])
_optional("tasks", ["make_arithmetic_dataset", "make_countdown_dataset", "load_gsm8k"])
_optional("models", ["load_policy", "build_tiny_policy"])
_optional("rollout", ["generate_rollouts", "Rollout"])
_optional("trainer", ["GRPOConfig", "GRPOTrainer"])
_optional("plotting", ["plot_history"])

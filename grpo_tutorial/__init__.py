"""GRPO from the ground up: the package behind the book.

One GRPO step is a straight pipeline of five stages (:mod:`grpo_tutorial.stages`),
and the modules mirror it::

    tasks -> 1. rollout -> 2. rewards -> 3. advantages -> 4. logprobs -> 5. loss/kl/optim

``step.py`` runs them in that order, top to bottom (:class:`~grpo_tutorial.step.GRPOStep`);
``trainer.py`` is the loop around it. Everything a chapter uses is importable from here.
"""

__version__ = "0.1.0"

from .run.progress import quiet_tqdm_auto as _quiet_tqdm_auto

# transformers imports tqdm.auto, which warns in a Jupyter kernel without
# ipywidgets; our own bars pick the right kind themselves (run/progress.py).
# Imported once here with that warning silenced; no process-wide filter is set.
_quiet_tqdm_auto()

from .tasks import (
    countdown_reward,
    load_gsm8k,
    make_arithmetic_dataset,
    make_countdown_dataset,
    train_test_split_arithmetic,
    validate_dataset,
)
from .long_addition import make_long_addition_dataset, parse_worked, worked_addition
from .rollout import Rollout, completion_mask, generate_rollouts
from .rewards import (
    RewardFunctionError,
    answers_match,
    combined_reward,
    compute_rewards,
    correctness_reward,
    extract_answer,
    format_reward,
    partial_credit_reward,
    soft_overlong_punishment,
)
from .advantages import group_advantages
from .logprobs import completion_logprobs, token_entropy, token_logprobs
from .kl import kl_estimate
from .loss import grpo_loss, sequence_logprob_loss
from .metrics import TIMING_KEYS
from .models import build_tiny_policy
from .pretrained import load_policy
from .sft import SFTConfig, supervised_warmup
from .config import GRPOConfig
from .presets import get_preset
from .evaluation import evaluate_policy
from .warn import GRPOWarning
from .trainer import GRPOTrainer
from .plotting import plot_history

__all__ = [
    # before stage 1: tasks, the step's prompts
    "make_arithmetic_dataset",
    "train_test_split_arithmetic",
    "make_countdown_dataset",
    "countdown_reward",
    "make_long_addition_dataset",
    "worked_addition",
    "parse_worked",
    "load_gsm8k",
    "validate_dataset",
    # stage 1, sample: rollouts and their completion mask
    "generate_rollouts",
    "Rollout",
    "completion_mask",
    # stage 2, reward
    "extract_answer",
    "answers_match",
    "correctness_reward",
    "format_reward",
    "partial_credit_reward",
    "soft_overlong_punishment",
    "combined_reward",
    "compute_rewards",
    "RewardFunctionError",
    # stage 3, advantages
    "group_advantages",
    # stage 4, score: log-probs
    "token_logprobs",
    "completion_logprobs",
    "token_entropy",
    # stage 5, update: KL and loss
    "kl_estimate",
    "grpo_loss",
    "sequence_logprob_loss",
    # after stage 5: the history row's timing fields
    "TIMING_KEYS",
    # models and training
    "load_policy",
    "build_tiny_policy",
    "SFTConfig",
    "supervised_warmup",
    "GRPOConfig",
    "get_preset",
    "GRPOTrainer",
    "evaluate_policy",
    "GRPOWarning",
    "plot_history",
]

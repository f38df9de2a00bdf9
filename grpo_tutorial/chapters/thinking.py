"""Chapter 13, "Thinking longer": a task where working it out pays, and what GRPO makes of it.

The task is long addition (:func:`~grpo_tutorial.long_addition.make_long_addition_dataset`):
a completion may state the sum at once, a *guess* (``"385777"``), or first *work it
out* column by column (:func:`~grpo_tutorial.long_addition.worked_addition`,
``"(3+4=7)(1+6=7)(2+5=7)(7+8=15)(4+3+1=8)(2+1=3)385777"``), about seven times longer. The reward is
correctness alone; nothing pays for length or for the steps.

The warm start (:func:`warm_start`) teaches both styles from one supervised mix in
which most targets are guesses (:data:`ThinkingRecipe.worked_share` of them are
worked out), and stops as soon as the model can work a sum out most of the time.
Writing a sum out is learned long before guessing it (each step is one column's
arithmetic, while a guess must carry through every column at once), so the
untrained policy mostly guesses, and mostly wrongly. Whether GRPO finds out that
working it out pays is then a question the runs answer: :func:`heldout_stats`
measures, on held-out problems, the accuracy, the share of completions worked out
and the length of right and of wrong completions.

:data:`VARIANTS` are the settings the chapter compares (the loss types, the token
budget, two control rewards, the group size at a fixed number of completions per
step); :func:`run_variant` trains one of them from a copy of a warm start, and
``benchmarks/thinking.py`` runs all of them for several seeds into the package
data that the chapter plots.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


from .._checks import check_int, check_number
from ..config import GRPOConfig
from ..evaluation import evaluate_policy
from ..models import build_tiny_policy
from ..presets import get_preset
from ..rewards import correctness_reward, soft_overlong_punishment
from ..rollout import generate_rollouts, sampling_kwargs
from ..sft import SFTConfig
from ..long_addition import WORKED_OPEN, make_long_addition_dataset, parse_worked, worked_addition
from ..trainer import GRPOTrainer
from .sweep import (
    VariantRecipe, mean_or_nan, run_from_warm_start, sampled_heldout, summarize_variants, warm_start_until,
)

__all__ = [
    "CURVE_KEYS",
    "EVAL_SEED_OFFSET",
    "WARM_START_FILE",
    "ThinkingRecipe",
    "VARIANTS",
    "build_thinking_model",
    "format_only_reward",
    "heldout_stats",
    "load_warm_start",
    "make_thinking_data",
    "random_reward",
    "reward_functions",
    "run_variant",
    "save_warm_start",
    "summarize_thinking",
    "warm_start",
    "warm_start_targets",
    "worked_accuracy",
]

#: What the held-out evaluation reports at every point of a run's curve.
CURVE_KEYS = (
    "accuracy", "worked_share", "length", "length_correct", "length_incorrect",
    "accuracy_worked", "accuracy_guess", "truncated",
)


# ---------------------------------------------------------------------------
# The recipe
# ---------------------------------------------------------------------------

_SFT_SETTINGS: dict[str, Any] = dict(steps=4_000, batch_size=64, learning_rate=1e-3, warmup_steps=100)


@dataclass
class ThinkingRecipe(VariantRecipe):
    """Every setting of chapter 13's runs.

    Attributes:
        digits: digits of each operand (6: sums of two numbers 100000-999999). With
            fewer digits (4, then 5 with a fifth of the targets worked out) some seeds
            learned to guess within the warm start, and those seeds then learned to
            guess rather than to work it out (chapter 13, section 13.9).
        n_train, n_probe, n_test: training rows; held-out problems that decide when
            the warm start stops; held-out problems of the curves. No prompt is in
            two of them; the split depends on ``data_seed`` only.
        worked_share: the share of warm-start targets that are worked out; the rest
            are the bare sum (0.3: the untrained policy still mostly guesses).
        hidden_size, num_layers, num_heads, intermediate_size, max_position_embeddings:
            the tiny Qwen2 (the defaults: chapter 8's model, with room for 96 tokens).
        sft: the warm start's settings; ``sft.steps`` is an upper bound.
        sft_target: stop the warm start once greedy accuracy on the probe set, with
            the completion started by ``(`` (worked out), reaches this.
        sft_check_every: check it every this many supervised steps.
        grpo: the GRPO phase's settings: the preset ``"long-addition-cpu"`` (the
            package's defaults, except the budget).
        grpo_steps: GRPO steps per run.
        eval_every: held-out statistics every this many steps (and at step 0).
        num_threads: torch CPU threads during a run (None: leave torch's setting).
    """

    digits: int = 6
    n_train: int = 20_000
    n_probe: int = 200
    n_test: int = 400
    data_seed: int = 0
    worked_share: float = 0.3
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 96
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(**_SFT_SETTINGS))
    sft_target: float = 0.6
    sft_check_every: int = 50
    grpo: GRPOConfig = field(default_factory=lambda: get_preset("long-addition-cpu"))
    grpo_steps: int = 100
    eval_every: int = 10
    num_threads: int | None = 1

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if not isinstance(self.sft, SFTConfig) or not isinstance(self.grpo, GRPOConfig):
            raise TypeError(f"{owner}.sft must be an SFTConfig and {owner}.grpo a GRPOConfig")
        for name in ("digits", "n_train", "n_probe", "n_test", "hidden_size", "num_layers", "num_heads",
                     "intermediate_size", "max_position_embeddings", "sft_check_every", "grpo_steps"):
            check_int(owner, name, getattr(self, name), 1)
        for name in ("data_seed", "eval_every"):
            check_int(owner, name, getattr(self, name), 0)
        if self.num_threads is not None:
            check_int(owner, "num_threads", self.num_threads, 1)
        for name in ("worked_share", "sft_target"):
            check_number(owner, name, getattr(self, name), lambda v: 0 <= v <= 1, "a number in [0, 1]")

    @classmethod
    def quick(cls, **overrides: Any) -> "ThinkingRecipe":
        """A seconds-long run for tests: 2-digit sums, a 2-layer model, a few steps. Proves nothing."""
        settings: dict[str, Any] = dict(
            digits=2, n_train=400, n_probe=20, n_test=24, hidden_size=32, num_layers=2, num_heads=2,
            intermediate_size=64, max_position_embeddings=48, sft=SFTConfig(steps=30, batch_size=16,
            learning_rate=3e-3, warmup_steps=5), sft_target=1.0, sft_check_every=10,
            grpo=GRPOConfig(max_new_tokens=24, prompts_per_step=4, group_size=4, eval_batch_size=64),
            grpo_steps=4, eval_every=2,
        )
        settings.update(overrides)
        return cls(**settings)



# ---------------------------------------------------------------------------
# Data, model, rewards
# ---------------------------------------------------------------------------


def make_thinking_data(recipe: ThinkingRecipe) -> dict[str, list[dict]]:
    """Training, probe and test rows of long addition; no prompt is in two of them."""
    held_out = make_long_addition_dataset(recipe.n_probe + recipe.n_test, seed=recipe.data_seed + 1_000,
                                          digits=recipe.digits, unique=True)
    train = make_long_addition_dataset(recipe.n_train, seed=recipe.data_seed, digits=recipe.digits,
                                       exclude={row["prompt"] for row in held_out})
    return {"train": train, "probe": held_out[recipe.n_test:], "test": held_out[:recipe.n_test]}


def warm_start_targets(rows: Sequence[dict], worked_share: float, seed: int) -> list[dict]:
    """Supervised rows: each prompt's target is worked out with probability ``worked_share``, else the sum.

    >>> warm_start_targets([{"prompt": "12+39=", "a": 12, "b": 39, "answer": "51"}], 1.0, 0)
    [{'prompt': '12+39=', 'answer': '(2+9=11)(1+3+1=5)51'}]
    """
    check_number("warm_start_targets", "worked_share", worked_share, lambda v: 0 <= v <= 1, "a number in [0, 1]")
    rng = random.Random(seed)
    return [
        {"prompt": row["prompt"],
         "answer": worked_addition(row["a"], row["b"]) if rng.random() < worked_share else row["answer"]}
        for row in rows
    ]


def build_thinking_model(recipe: ThinkingRecipe, seed: int):
    """The tiny Qwen2 and its character tokenizer, initialised from ``seed``."""
    return build_tiny_policy(
        hidden_size=recipe.hidden_size, num_layers=recipe.num_layers, num_heads=recipe.num_heads,
        intermediate_size=recipe.intermediate_size, max_position_embeddings=recipe.max_position_embeddings,
        seed=seed,
    )


def format_only_reward(prompts, completions, **kwargs) -> list[float]:
    """Control: 1.0 for a completion written as steps then a number, right or wrong; else 0.0.

    It reads the format with :func:`~grpo_tutorial.long_addition.parse_worked` and never
    checks the arithmetic or the answer (TRL's reward signature).

    >>> format_only_reward(["1+1="], ["(1+1=3)3"]), format_only_reward(["1+1="], ["2"])
    ([1.0], [0.0])
    """
    return [1.0 if (p := parse_worked(text)).worked and p.well_formed else 0.0 for text in completions]


class random_reward:  # noqa: N801 - used like a reward function
    """Control: 1.0 or 0.0 with probability 1/2 each, whatever the completion says.

    Drawn from its own ``random.Random(seed)``, one draw per completion in the order
    the trainer scores them, so a run is reproducible (TRL's reward signature).
    """

    __name__ = "random_reward"

    def __init__(self, seed: int) -> None:
        check_int("random_reward", "seed", seed, 0)
        self.seed = seed
        self._rng = random.Random(seed)

    def __call__(self, prompts, completions, **kwargs) -> list[float]:
        return [float(self._rng.random() < 0.5) for _ in completions]

    def __repr__(self) -> str:
        return f"random_reward(seed={self.seed})"


#: The settings chapter 13 compares. Each is ``(description, GRPOConfig changes, reward)``,
#: the reward one of "correct", "random", "format" or "correct+soft_overlong".
VARIANTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "grpo": ("the package's defaults, correctness reward", {}, "correct"),
    "dr_grpo": ("Dr. GRPO's constant normaliser (the loss type alone)", {"loss_type": "dr_grpo"}, "correct"),
    "dapo": ("DAPO's token-level mean", {"loss_type": "dapo"}, "correct"),
    "bnpo": ("BNPO: the mean over the micro-batch's tokens", {"loss_type": "bnpo"}, "correct"),
    "budget": ("a 56-token budget: most worked-out sums are cut off", {"max_new_tokens": 56}, "correct"),
    "budget_masked": ("the 56-token budget, truncated completions left out of the loss",
                      {"max_new_tokens": 56, "mask_truncated_completions": True}, "correct"),
    "soft_overlong": ("DAPO's soft overlong punishment beyond 56 of the 72 tokens", {}, "correct+soft_overlong"),
    "random_reward": ("control: a coin flip for every completion", {}, "random"),
    "format_reward": ("control: 1 for steps-then-a-number, right or wrong", {}, "format"),
    "G2": ("2 completions per prompt, 64 prompts per step", {"group_size": 2, "prompts_per_step": 64}, "correct"),
    "G4": ("4 completions per prompt, 32 prompts per step", {"group_size": 4, "prompts_per_step": 32}, "correct"),
    "G16": ("16 completions per prompt, 8 prompts per step", {"group_size": 16, "prompts_per_step": 8}, "correct"),
}


def reward_functions(kind: str, config: GRPOConfig, seed: int) -> list[Callable]:
    """The reward functions a variant's ``reward`` names: ``correct``, ``random`` (seeded by ``seed``),
    ``format`` (format only) or ``correct+soft_overlong`` (DAPO's length penalty, from ``config``'s budget)."""
    if kind == "correct":
        return [correctness_reward]
    if kind == "random":
        return [random_reward(seed)]
    if kind == "format":
        return [format_only_reward]
    if kind == "correct+soft_overlong":
        return [correctness_reward, soft_overlong_punishment(config.max_new_tokens, 16)]
    raise ValueError(f"unknown reward {kind!r}; choose correct, random, format or correct+soft_overlong")


#: :func:`run_variant` measures seed ``s``'s curve with ``heldout_stats(..., seed=EVAL_SEED_OFFSET + s)``;
#: a notebook that samples with the same seed sees the record's step 0 again.
EVAL_SEED_OFFSET = 10_000

#: The package data file that holds seed 0's warm start (``python -m benchmarks.thinking`` writes it).
WARM_START_FILE = "thinking_warm_start.safetensors"


def save_warm_start(model, path, metadata: dict[str, str]) -> str:
    """Write ``model``'s weights (float32, safetensors) with ``metadata``; return the file's sha256."""
    import hashlib

    from safetensors.torch import save_model

    save_model(model, str(path), metadata=metadata)  # tied embeddings are stored once
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def load_warm_start(recipe: ThinkingRecipe | None = None, seed: int = 0):
    """The tiny model with the shipped warm start of ``seed`` (0: the one shipped), and its tokenizer.

    The weights are package data, so a notebook opened alone finds them; the
    record ``thinking_results.json`` names the command that made them and their
    sha256, and ``tests/test_records.py`` checks both.
    """
    from importlib import resources

    from safetensors.torch import load_model

    if seed != 0:
        raise ValueError(f"the package ships seed 0's warm start only; run warm_start(...) for seed {seed}")
    recipe = ThinkingRecipe() if recipe is None else recipe
    model, tokenizer = build_thinking_model(recipe, seed)
    with resources.as_file(resources.files("grpo_tutorial.data").joinpath(WARM_START_FILE)) as path:
        load_model(model, str(path))
    model.eval()
    return model, tokenizer


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def worked_accuracy(model, tokenizer, rows: Sequence[dict], config: GRPOConfig) -> float:
    """Greedy accuracy with every completion started by ``(``: how well the model works a sum out."""
    started = [{"prompt": row["prompt"] + WORKED_OPEN, "answer": row["answer"]} for row in rows]
    return evaluate_policy(model, tokenizer, started, config)["accuracy"]


def heldout_stats(model, tokenizer, rows: Sequence[dict], config: GRPOConfig, seed: int) -> dict[str, float]:
    """One sampled completion per held-out problem, as the policy answers in training.

    Sampling uses the run's sampling settings (:func:`~grpo_tutorial.rollout.sampling_kwargs`), one completion
    per problem, with its own seeded generator
    (the global random state is left as it was, so measuring does not change the
    run). A completion is right if the correctness reward says so; its style is what
    :func:`~grpo_tutorial.long_addition.parse_worked` reads. Returns the keys of
    :data:`CURVE_KEYS` (the length in tokens, EOS included; NaN where a style or
    outcome has no completion) and ``n``.
    """
    drawn = sampled_heldout(rows, config, seed, lambda prompts, generator_seed: generate_rollouts(
        model, tokenizer, prompts, **sampling_kwargs(config, group_size=1, generator_seed=generator_seed)))
    texts, lengths, truncated = drawn["texts"], drawn["lengths"], drawn["truncated"]
    right = correctness_reward(prompts=[row["prompt"] for row in rows], completions=texts,
                               answer=[row["answer"] for row in rows])
    worked = [parse_worked(text).worked for text in texts]
    return {
        "accuracy": mean_or_nan(right),
        "worked_share": mean_or_nan([float(w) for w in worked]),
        "length": mean_or_nan(lengths),
        "length_correct": mean_or_nan([n for n, r in zip(lengths, right) if r == 1.0]),
        "length_incorrect": mean_or_nan([n for n, r in zip(lengths, right) if r != 1.0]),
        "accuracy_worked": mean_or_nan([r for r, w in zip(right, worked) if w]),
        "accuracy_guess": mean_or_nan([r for r, w in zip(right, worked) if not w]),
        "truncated": mean_or_nan([float(t) for t in truncated]),
        "n": len(rows),
    }


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def warm_start(model, tokenizer, data: dict[str, list[dict]], recipe: ThinkingRecipe, seed: int, *,
               progress: bool = True) -> dict:
    """Supervised steps on the guess/worked mix until the probe, worked out, reaches ``recipe.sft_target``.

    Returns ``steps``, ``seconds``, ``reached`` and ``probe`` (``[step, worked-out
    accuracy]`` at every check).
    """
    config = recipe.grpo_config(seed)
    targets = warm_start_targets(data["train"], recipe.worked_share, seed)
    return warm_start_until(model, tokenizer, targets, recipe, seed,
                            lambda m: worked_accuracy(m, tokenizer, data["probe"], config), progress=progress)


def run_variant(variant: str, start_model, tokenizer, data: dict[str, list[dict]], recipe: ThinkingRecipe,
                seed: int, *, progress: bool = False) -> dict:
    """Train a copy of ``start_model`` with one of :data:`VARIANTS` for ``recipe.grpo_steps`` steps.

    Returns ``variant``, ``seed``, ``curve`` (``step`` and :data:`CURVE_KEYS` at step 0
    and every ``eval_every`` steps, from :func:`heldout_stats` with the same sampling
    seed at every point), ``history`` (the trainer's rows, without timing fields),
    ``seconds`` (training only) and ``model``.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {list(VARIANTS)}, got {variant!r}")
    _, changes, reward = VARIANTS[variant]
    config = recipe.grpo_config(seed, **changes)
    model = copy.deepcopy(start_model)
    trainer = GRPOTrainer(model, tokenizer, reward_functions(reward, config, seed), config)
    eval_seed = EVAL_SEED_OFFSET + seed
    return run_from_warm_start(variant, seed, trainer, data["train"], recipe,
                               lambda: heldout_stats(model, tokenizer, data["test"], config, eval_seed),
                               progress=progress)


def summarize_thinking(seeds: Sequence[dict], baseline: str = "grpo") -> dict[str, Any]:
    """Across seeds, per variant: every curve key at every step (mean and 95% t interval), and the
    final values' paired difference against ``baseline`` (the same seed's warm start on both sides)."""
    return summarize_variants(seeds, list(VARIANTS), CURVE_KEYS, baseline)

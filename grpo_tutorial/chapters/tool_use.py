"""Chapter 16, "Tools in the loop": the tiny model learns when to call a calculator.

The task is multiplication (``347*56=``): a 3-digit number times a 2-digit one,
which the tiny model cannot do in its head. It may answer at once, a *guess*
(``19432``), or *call the calculator* the way GSM8K's solutions annotate their
arithmetic: it writes ``<<347*56=``, the rollout stops, the calculator writes
``19432>>``, and the model copies the result (``19432``, then EOS). Copying is
easy for a transformer; multiplying is not.

The warm start (:func:`warm_start`) teaches both styles from one supervised mix in
which most targets are guesses (:attr:`ToolRecipe.tool_share` of them call the
tool), and stops once the model, started with ``<<``, gets most held-out problems
right. The untrained policy then mostly guesses, and mostly wrongly: whether GRPO
finds out that calling pays is what the runs answer. The reward is the answer
alone (:func:`tool_answer_reward`): the text outside the calls must be the product,
so the calculator's own output never earns the reward.

:data:`VARIANTS` are the settings the chapter compares (the tool; the tool switched
off; the tool's tokens left in the loss; a calculator that is sometimes wrong);
:func:`run_variant` trains one of them from a copy of a warm start, and
``benchmarks/tool_use.py`` runs all of them for several seeds into the package data
that the chapter plots.
"""

from __future__ import annotations

import copy
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


from .._checks import check_int, check_number
from ..tools.calculator import calculator
from ..config import GRPOConfig
from ..models import TINY_TOOL_CHARS, build_tiny_policy
from ..presets import get_preset
from ..rollout import generate_rollouts, sampling_kwargs
from ..sft import SFTConfig
from ..tools import InlineCalls, ToolBox, generate_tool_rollouts
from ..trainer import GRPOTrainer
from .recipes import WARM_START_CACHE, cached_warm_start
from .sweep import (
    VariantRecipe, mean_or_nan, run_from_warm_start, sampled_heldout, summarize_variants, warm_start_until,
)

__all__ = [
    "CURVE_KEYS", "EVAL_SEED_OFFSET", "ToolRecipe", "VARIANTS", "build_tool_model", "heldout_stats",
    "make_tool_data", "noisy_calculator", "run_variant", "summarize_tool_use", "tool_answer_reward",
    "tool_target", "warm_start", "warm_start_targets",
]

#: What the held-out evaluation reports at every point of a run's curve: with the variant's own tool (the noisy
#: calculator's answers for ``noisy_tool``, none for ``no_tool``), and ``accuracy_exact``, the same policy's accuracy
#: when the exact calculator answers its calls (the same evaluation for the variants whose tool is that calculator),
#: which tells what training with a tool taught from what the tool gets wrong at evaluation.
CURVE_KEYS = ("accuracy", "tool_share", "length", "accuracy_tool", "accuracy_guess", "truncated", "accuracy_exact")

#: The call syntax of the chapter (GSM8K's ``<<expression=result>>``).
SYNTAX = InlineCalls()
_CALLS = re.compile(re.escape(SYNTAX.open) + r".*?(" + re.escape(SYNTAX.close) + r"|$)")


# ---------------------------------------------------------------------------
# The recipe
# ---------------------------------------------------------------------------


@dataclass
class ToolRecipe(VariantRecipe):
    """Every setting of chapter 16's runs.

    Attributes:
        digits_a, digits_b: digits of the two factors (3 and 2: products of 4-5 digits).
        n_train, n_probe, n_test: training rows; held-out problems that stop the warm
            start; held-out problems of the curves (no prompt in two of them).
        tool_share: the share of warm-start targets that call the calculator.
        hidden_size, num_layers, num_heads, intermediate_size, max_position_embeddings:
            the tiny Qwen2 with :data:`~grpo_tutorial.models.TINY_TOOL_CHARS`.
        sft, sft_target, sft_check_every: the warm start, stopped once greedy accuracy on
            the probe, with the completion started by ``<<`` (a call), reaches ``sft_target``.
        grpo: the GRPO phase's settings: the preset ``"tool-use-cpu"`` (the package's defaults, but the
            budget and two rounds of calls); grpo_steps, eval_every: its length and curve points.
        noise: how often :func:`noisy_calculator` (the ``noisy_tool`` variant) is wrong.
        num_threads: torch CPU threads during a run (None: leave torch's setting).
    """

    digits_a: int = 3
    digits_b: int = 2
    n_train: int = 20_000
    n_probe: int = 100
    n_test: int = 200
    data_seed: int = 0
    tool_share: float = 0.3
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 64
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=3_000, batch_size=64, learning_rate=1e-3,
                                                             warmup_steps=100))
    sft_target: float = 0.6
    sft_check_every: int = 50
    grpo: GRPOConfig = field(default_factory=lambda: get_preset("tool-use-cpu"))
    grpo_steps: int = 60
    eval_every: int = 10
    noise: float = 0.25
    num_threads: int | None = 1

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if not isinstance(self.sft, SFTConfig) or not isinstance(self.grpo, GRPOConfig):
            raise TypeError(f"{owner}.sft must be an SFTConfig and {owner}.grpo a GRPOConfig")
        for name in ("digits_a", "digits_b", "n_train", "n_probe", "n_test", "hidden_size", "num_layers",
                     "num_heads", "intermediate_size", "max_position_embeddings", "sft_check_every", "grpo_steps"):
            check_int(owner, name, getattr(self, name), 1)
        for name in ("data_seed", "eval_every"):
            check_int(owner, name, getattr(self, name), 0)
        if self.num_threads is not None:
            check_int(owner, "num_threads", self.num_threads, 1)
        for name in ("tool_share", "sft_target", "noise"):
            check_number(owner, name, getattr(self, name), lambda v: 0 <= v <= 1, "a number in [0, 1]")

    @classmethod
    def quick(cls, **overrides: Any) -> "ToolRecipe":
        """A seconds-long run for tests: 1-digit factors, a 2-layer model, a few steps. Proves nothing."""
        settings: dict[str, Any] = dict(
            digits_a=2, digits_b=1, n_train=400, n_probe=16, n_test=16, hidden_size=32, num_layers=2, num_heads=2,
            intermediate_size=64, sft=SFTConfig(steps=20, batch_size=16, learning_rate=3e-3, warmup_steps=5),
            sft_target=1.0, sft_check_every=10,
            grpo=GRPOConfig(group_size=4, prompts_per_step=4, max_new_tokens=20, max_tool_calling_iterations=2,
                            eval_batch_size=16),
            grpo_steps=2, eval_every=1,
        )
        settings.update(overrides)
        return cls(**settings)



# ---------------------------------------------------------------------------
# Data, model, reward, tools
# ---------------------------------------------------------------------------


def _problems(n: int, recipe: ToolRecipe, seed: int, exclude: set[str] = frozenset()) -> list[dict]:
    rng, rows, seen = random.Random(seed), [], set(exclude)
    low_a, low_b = 10 ** (recipe.digits_a - 1), 10 ** (recipe.digits_b - 1)
    while len(rows) < n:
        a, b = rng.randrange(low_a, 10 * low_a), rng.randrange(low_b, 10 * low_b)
        prompt = f"{a}*{b}="
        if prompt in seen:
            continue
        seen.add(prompt)
        rows.append({"prompt": prompt, "a": a, "b": b, "answer": str(a * b)})
    return rows


def make_tool_data(recipe: ToolRecipe) -> dict[str, list[dict]]:
    """Training, probe and test rows of multiplication; no prompt is in two of them."""
    held_out = _problems(recipe.n_probe + recipe.n_test, recipe, recipe.data_seed + 1_000)
    train = _problems(recipe.n_train, recipe, recipe.data_seed, {row["prompt"] for row in held_out})
    return {"train": train, "probe": held_out[recipe.n_test:], "test": held_out[:recipe.n_test]}


def tool_target(row: dict) -> str:
    """The completion that calls the calculator: ``<<a*b=`` (the model), ``a*b>>`` (the tool), the product.

    >>> tool_target({"a": 347, "b": 56, "answer": "19432"})
    '<<347*56=19432>>19432'
    """
    return f"{SYNTAX.open}{row['a']}*{row['b']}{SYNTAX.ask}{row['answer']}{SYNTAX.close}{row['answer']}"


def warm_start_targets(rows: Sequence[dict], tool_share: float, seed: int) -> list[dict]:
    """Supervised rows: each target calls the tool with probability ``tool_share``, else it is the bare product."""
    check_number("warm_start_targets", "tool_share", tool_share, lambda v: 0 <= v <= 1, "a number in [0, 1]")
    rng = random.Random(seed)
    return [{"prompt": row["prompt"], "answer": tool_target(row) if rng.random() < tool_share else row["answer"]}
            for row in rows]


def build_tool_model(recipe: ToolRecipe, seed: int):
    """The tiny Qwen2 with the tool vocabulary (:data:`~grpo_tutorial.models.TINY_TOOL_CHARS`), from ``seed``."""
    return build_tiny_policy(
        hidden_size=recipe.hidden_size, num_layers=recipe.num_layers, num_heads=recipe.num_heads,
        intermediate_size=recipe.intermediate_size, max_position_embeddings=recipe.max_position_embeddings,
        vocab=TINY_TOOL_CHARS, seed=seed,
    )


def final_text(completion: str) -> str:
    """The completion without its calls and the tool's answers: what the model itself concluded.

    >>> final_text("<<347*56=19432>>19432"), final_text("<<347*56=19432>>"), final_text("19432")
    ('19432', '', '19432')
    """
    return _CALLS.sub("", completion).strip()


def tool_answer_reward(completions, *, answer, **kwargs) -> list[float]:
    """1.0 when the text outside the calls is exactly the answer, else 0.0 (TRL's reward signature).

    The calculator's output sits inside ``<<...>>``, so copying it is the model's work
    and the tool's answer alone earns nothing.

    >>> tool_answer_reward(["<<3*4=12>>12", "<<3*4=12>>", "12", "13"], answer=["12"] * 4)
    [1.0, 0.0, 1.0, 0.0]
    """
    return [1.0 if final_text(text) == str(ref) else 0.0 for text, ref in zip(completions, answer)]


class noisy_calculator:  # noqa: N801 - a tool, used like a function
    """Control: the calculator, wrong with probability ``noise`` (one digit of the result changed).

    Seeded (``random.Random(seed)``), one draw per call in the order the rollout makes them.
    """

    def __init__(self, noise: float, seed: int) -> None:
        check_number("noisy_calculator", "noise", noise, lambda v: 0 <= v <= 1, "a number in [0, 1]")
        self.noise, self._rng = noise, random.Random(seed)
        self.__name__ = "calculator"  # the model calls it by the calculator's name

    def __call__(self, expression: str) -> str:
        result = calculator(expression)
        if self._rng.random() >= self.noise or not result.isdigit():
            return result
        k = self._rng.randrange(len(result))
        digit = str((int(result[k]) + self._rng.randrange(1, 10)) % 10)
        return result[:k] + digit + result[k + 1:]


#: The settings chapter 16 compares: ``(description, GRPOConfig changes, tool)``, the tool one of
#: "calculator", "none" or "noisy".
VARIANTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "grpo": ("the calculator, its tokens masked out of the loss", {}, "calculator"),
    "no_tool": ("control: the calculator switched off (a call gets no answer)", {}, "none"),
    "unmasked": ("control: the calculator's tokens left in the loss", {"mask_tool_tokens": False}, "calculator"),
    "noisy_tool": ("control: a calculator that is wrong one time in four", {}, "noisy"),
}


def _tools(kind: str, recipe: ToolRecipe, seed: int) -> list[Callable] | None:
    if kind == "calculator":
        return [calculator]
    if kind == "noisy":
        return [noisy_calculator(recipe.noise, seed)]
    if kind == "none":
        return None
    raise ValueError(f"unknown tool {kind!r}; choose calculator, noisy or none")


#: :func:`run_variant` measures seed ``s``'s curve with ``heldout_stats(..., seed=EVAL_SEED_OFFSET + s)``.
EVAL_SEED_OFFSET = 10_000


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def _rollouts(model, tokenizer, prompts: list[str], config: GRPOConfig, tools: list[Callable] | None, **overrides):
    kwargs = sampling_kwargs(config, group_size=1, **overrides)
    if tools is None:
        return generate_rollouts(model, tokenizer, prompts, **kwargs)
    box = ToolBox.build(tools, tokenizer, chat=False, max_tool_calling_iterations=config.max_tool_calling_iterations,
                        time_limit=config.tool_time_limit)
    return generate_tool_rollouts(model, tokenizer, prompts, box, **kwargs)


def called_accuracy(model, tokenizer, rows: Sequence[dict], config: GRPOConfig) -> float:
    """Greedy accuracy with every completion started by ``<<``: how well the model uses the calculator."""
    prompts = [row["prompt"] + SYNTAX.open for row in rows]
    rollout = _rollouts(model, tokenizer, prompts, config, [calculator], do_sample=False)
    texts = [SYNTAX.open + text for text in rollout.completions]
    return sum(tool_answer_reward(texts, answer=[row["answer"] for row in rows])) / len(rows)


def heldout_stats(model, tokenizer, rows: Sequence[dict], config: GRPOConfig, seed: int,
                  tools: list[Callable] | None = None) -> dict[str, float]:
    """One sampled completion per held-out problem, as the policy answers in training (its sampling settings,
    its own seeded generator). Returns :data:`CURVE_KEYS` (``length``: the policy's own tokens, EOS included;
    NaN where a style has no completion) and ``n``."""
    drawn = sampled_heldout(rows, config, seed, lambda prompts, generator_seed: _rollouts(
        model, tokenizer, prompts, config, tools, generator_seed=generator_seed))
    texts, lengths, truncated = drawn["texts"], drawn["lengths"], drawn["truncated"]
    called = [SYNTAX.open in text for text in texts]
    right = tool_answer_reward(texts, answer=[row["answer"] for row in rows])
    return {
        "accuracy": mean_or_nan(right), "tool_share": mean_or_nan([float(c) for c in called]),
        "length": mean_or_nan(lengths),
        "accuracy_tool": mean_or_nan([r for r, c in zip(right, called) if c]),
        "accuracy_guess": mean_or_nan([r for r, c in zip(right, called) if not c]),
        "truncated": mean_or_nan([float(t) for t in truncated]), "n": len(rows),
    }


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def warm_start(model, tokenizer, data: dict[str, list[dict]], recipe: ToolRecipe, seed: int, *,
               progress: bool = True, cache: str | None = None) -> dict:
    """Supervised steps on the guess/call mix until the probe, started with ``<<``, reaches ``recipe.sft_target``.

    Returns ``steps``, ``seconds``, ``reached`` and ``probe`` (``[step, accuracy]`` at every check).
    ``cache``: as chapter 8's :func:`~grpo_tutorial.chapters.recipes.warm_start` (default: the environment
    variable ``GRPO_WARM_START_CACHE``, which ``make test`` sets, so the chapter and its record's test make
    seed 0's warm start once).
    """
    folder = cache if cache is not None else os.environ.get(WARM_START_CACHE)
    if folder:
        return cached_warm_start(warm_start, folder, model, tokenizer, data, recipe, seed, progress)
    config = recipe.grpo_config(seed)
    targets = warm_start_targets(data["train"], recipe.tool_share, seed)
    return warm_start_until(model, tokenizer, targets, recipe, seed,
                            lambda m: called_accuracy(m, tokenizer, data["probe"], config), progress=progress)


def run_variant(variant: str, start_model, tokenizer, data: dict[str, list[dict]], recipe: ToolRecipe,
                seed: int, *, progress: bool = False) -> dict:
    """Train a copy of ``start_model`` with one of :data:`VARIANTS` for ``recipe.grpo_steps`` steps.

    Returns ``variant``, ``seed``, ``curve`` (``step`` and :data:`CURVE_KEYS` at step 0 and every
    ``eval_every`` steps, measured with the variant's own tool), ``history`` (the trainer's rows,
    without timing fields), ``seconds`` (training only) and ``model``.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {list(VARIANTS)}, got {variant!r}")
    _, changes, kind = VARIANTS[variant]
    config = recipe.grpo_config(seed, **changes)
    model = copy.deepcopy(start_model)
    tools = _tools(kind, recipe, seed)
    trainer = GRPOTrainer(model, tokenizer, [tool_answer_reward], config, accuracy_fn=tool_answer_reward,
                          tools=tools)
    eval_tools = None if tools is None else [calculator if kind == "calculator" else _tools(kind, recipe, seed + 1)[0]]
    eval_seed = EVAL_SEED_OFFSET + seed

    def stats() -> dict[str, float]:
        own = heldout_stats(model, tokenizer, data["test"], config, eval_seed, eval_tools)
        exact = own if kind == "calculator" else heldout_stats(model, tokenizer, data["test"], config, eval_seed,
                                                               [calculator])
        return {**own, "accuracy_exact": exact["accuracy"]}

    return run_from_warm_start(variant, seed, trainer, data["train"], recipe, stats, progress=progress)


def summarize_tool_use(seeds: Sequence[dict], baseline: str = "grpo") -> dict[str, Any]:
    """Across seeds, per variant: every curve key at every step (mean and 95% t interval), and the final
    values' paired difference against ``baseline`` (the same seed's warm start on both sides)."""
    return summarize_variants(seeds, list(VARIANTS), CURVE_KEYS, baseline)

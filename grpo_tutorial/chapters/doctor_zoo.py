"""Chapter 18's zoo: runs with one fault each, planted by its real cause, and healthy runs beside them.

Every run is the package's own trainer on one of the book's CPU tasks, from a
warm start the book already makes:

- ``addition``: chapter 8's recipe (2-digit sums, the tiny model, a warm start per
  seed to 30% greedy accuracy), 50 GRPO steps;
- ``thinking``: chapter 13's 6-digit sums, from the shipped warm start, 40 steps;
- ``tool_use``: chapter 16's products with a calculator, from seed 0's warm start, 40 steps;
- ``easy``: one-digit sums, from a model drilled on all hundred of them until it
  gets every one right greedily, 40 steps.

:data:`CASES` lists the runs. Each fault's cause is a setting a learner could
make: a budget too short (``truncation``, chapter 13's own 56-token variant),
problems too hard or too easy, a learning rate of 1e-3 (chapter 8's collapse), a
reference that is not the policy's start (the untrained model) with beta > 0,
sixteen passes over each batch, a policy loaded in float16, references written
in words with a reward that pays 1 for a reference it cannot read (open-r1's
``accuracy_reward`` did this, huggingface/cookbook#335), chapter 13's format-only
reward, a reward that reads only a marked answer (``####``, a box, a tag) from a
model that writes bare numbers, a learning rate of 1e-6, a model never shown the
tool's syntax, a sampler 8 updates stale with no correction. The healthy runs
span the tasks and a few settings (a KL penalty, a slower rate, DAPO's loss with
clip-higher, the same stale sampler with the correction on).

:func:`run_case` trains one ``(case, seed)`` and returns its history and kept
completions; ``benchmarks/doctor_zoo.py`` runs them all, asks both doctors, and
writes the record chapter 18 reads.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..answers import answers_match, extract_answer, last_number, marked_answer
from ..config import GRPOConfig
from ..doctor import Run
from ..rewards import correctness_reward
from ..tasks import make_arithmetic_dataset
from ..trainer import GRPOTrainer
from ..warn import GRPOWarning

__all__ = ["CASES", "Case", "HISTORY_KEYS", "Starts", "ZooSettings", "as_run", "marked_only_reward", "number_words",
           "run_case", "unreadable_is_right_reward", "words_for_some_references"]

#: The history fields a zoo run keeps: what the doctor's rules and TRL's logs read (no timings).
HISTORY_KEYS = (
    "step", "reward_mean", "reward_std", "accuracy", "kl", "entropy", "clip_frac", "clip_frac_low", "clip_frac_high",
    "ratio_max", "completion_len_mean", "completion_len_max", "frac_zero_std", "frac_truncated", "grad_norm", "loss",
    "lr", "skipped_updates", "tool_call_frequency", "tool_call_share", "tool_failure_frequency", "mismatch/kl",
    "mismatch/logp_diff_mean", "mismatch/logp_diff_max",
)
#: The kept completions' fields a zoo run keeps (their prompts are the task's, and long).
COMPLETION_KEYS = ("step", "group", "completion", "reward", "rewards", "answer", "truncated", "length", "tool_calls",
                   "extracted", "correct")


# ---------------------------------------------------------------------------
# Rewards and data with a planted cause
# ---------------------------------------------------------------------------


def marked_only_reward(completions, *, answer, **kwargs) -> list[float]:
    """1.0 when the answer the completion *marks* (a tag, a box, ``#### N``) is right, else 0.0: a strict reading
    (:func:`~grpo_tutorial.answers.marked_answer`) of a model that writes bare numbers (TRL's signature)."""
    return [1.0 if answers_match(marked_answer(c), a) else 0.0 for c, a in zip(completions, answer)]


def unreadable_is_right_reward(completions, *, answer, **kwargs) -> list[float]:
    """The bug of open-r1's first ``accuracy_reward`` (huggingface/cookbook#335): a reference the parser cannot
    read "skips" the example with a reward of 1.0, whatever the completion says; else the answer is checked."""
    out = []
    for completion, reference in zip(completions, answer):
        if last_number(str(reference)) is None:
            out.append(1.0)  # the planted bug
        else:
            out.append(1.0 if answers_match(extract_answer(completion), reference) else 0.0)
    return out


_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> str:
    """An integer 0-999 in English words: ``number_words(146) == 'one hundred forty-six'``."""
    if not 0 <= n <= 999:
        raise ValueError(f"number_words takes 0-999, got {n}")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    rest = n % 100
    return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + number_words(rest))


def words_for_some_references(rows: list[dict], share: float, seed: int) -> list[dict]:
    """``rows`` with the reference of about ``share`` of them written in words ("forty-six"): a dataset whose
    answer column was filled by two hands."""
    import random

    rng = random.Random(seed)
    return [{**row, "answer": number_words(int(row["answer"]))} if rng.random() < share else row for row in rows]


# ---------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One kind of zoo run.

    Attributes:
        fault: the fault planted (a name of :data:`~grpo_tutorial.doctor.FAULTS`), None for a healthy run.
        task: ``"addition"``, ``"thinking"``, ``"tool_use"`` or ``"easy"``.
        cause: the planted cause, in words.
        changes: GRPOConfig fields changed from the task's settings.
        reward: ``"correct"`` (the task's own), ``"marked_only"``, ``"unreadable_is_right"`` or ``"format"``.
        data: ``"train"`` (the task's), ``"four_digits"`` or ``"words"``.
        start: ``"warm"`` (the task's), ``"no_calls"`` (a warm start without a call), ``"float16"`` (the warm
            start cast to float16).
        reference: ``"start"`` (the trainer's copy) or ``"untrained"`` (the model before its warm start).
    """

    fault: str | None
    task: str
    cause: str
    changes: dict = field(default_factory=dict)
    reward: str = "correct"
    data: str = "train"
    start: str = "warm"
    reference: str = "start"


CASES: dict[str, Case] = {
    # faults
    "truncation": Case("truncation", "thinking", "a budget of 56 tokens, which cuts most worked-out sums (chapter 13)",
                       {"max_new_tokens": 56}),
    "zero_variance_too_hard": Case("zero_variance_too_hard", "addition",
                                   "4-digit sums for a model warm-started on 2-digit ones", data="four_digits"),
    "zero_variance_too_easy": Case("zero_variance_too_easy", "easy",
                                   "one-digit sums, each of which the model already gets right"),
    "lr_too_high": Case("lr_too_high", "addition", "a learning rate of 1e-3 (chapter 8)", {"learning_rate": 1e-3}),
    "kl_explosion": Case("kl_explosion", "addition", "beta = 0.04 with the untrained model as the reference",
                         {"beta": 0.04}, reference="untrained"),
    "entropy_collapse": Case("entropy_collapse", "addition", "16 passes over each batch (num_iterations=16)",
                             {"num_iterations": 16}),
    "non_finite": Case("non_finite", "addition", "the policy loaded in float16 (what a T4 without bfloat16 tempts)",
                       start="float16"),
    "reward_bug": Case("reward_bug", "addition", "a third of the references written in words, and a reward that "
                       "pays 1.0 for a reference it cannot read (open-r1's first accuracy_reward)",
                       reward="unreadable_is_right", data="words"),
    "format_only": Case("format_only", "thinking", "chapter 13's format reward: steps then a number, right or wrong",
                        reward="format"),
    "extraction_mismatch": Case("extraction_mismatch", "addition",
                                "a reward that reads only a marked answer (####, a box, a tag) from a model that "
                                "writes bare numbers", reward="marked_only"),
    "plateau": Case("plateau", "addition", "a learning rate of 1e-6", {"learning_rate": 1e-6}),
    "tool_never_called": Case("tool_never_called", "tool_use", "a warm start that never shows the tool's syntax",
                              start="no_calls"),
    "sampler_mismatch": Case("sampler_mismatch", "addition", "a sampler 8 updates stale, without the correction",
                             {"sampler": "stale", "sampler_staleness": 8}),
    # healthy runs
    "healthy_addition": Case(None, "addition", "chapter 8's recipe"),
    "healthy_addition_kl": Case(None, "addition", "with a KL penalty (beta = 0.04)", {"beta": 0.04}),
    "healthy_addition_slow": Case(None, "addition", "half the learning rate (5e-5)", {"learning_rate": 5e-5}),
    "healthy_addition_dapo": Case(None, "addition", "DAPO's loss with clip-higher (0.28)",
                                  {"loss_type": "dapo", "clip_eps_high": 0.28}),
    "healthy_addition_corrected": Case(None, "addition", "the sampler 8 updates stale, with the correction",
                                       {"sampler": "stale", "sampler_staleness": 8,
                                        "vllm_importance_sampling_correction": True}),
    "healthy_thinking": Case(None, "thinking", "chapter 13's runs (its entropy falls as it learns)"),
    "healthy_tool_use": Case(None, "tool_use", "chapter 16's runs (most groups all wrong at first)"),
}


@dataclass(frozen=True)
class ZooSettings:
    """How long each task's runs are, and how many completions they keep per step."""

    steps: dict = field(default_factory=lambda: {"addition": 50, "thinking": 40, "tool_use": 40, "easy": 40})
    completions_to_keep: int = 4
    words_share: float = 1 / 3

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def quick(cls) -> "ZooSettings":
        """Seconds-long runs for tests (prove nothing)."""
        return cls(steps={"addition": 3, "thinking": 2, "tool_use": 2, "easy": 3})


# ---------------------------------------------------------------------------
# Starting points
# ---------------------------------------------------------------------------


class Starts:
    """The models the runs start from, made once (and kept in ``folder`` when one is given).

    ``addition(seed)``: chapter 8's warm start of ``seed`` and the model before it; ``thinking()``: chapter 13's
    shipped warm start; ``tool_use(calls)``: chapter 16's warm start of seed 0, or, with ``calls=False``, the same
    number of supervised steps on targets that never call; ``easy()``: the drilled one-digit model.
    """

    def __init__(self, folder: str | os.PathLike | None = None, quick: bool = False) -> None:
        self.folder = None if folder is None else Path(folder)
        self.quick = quick
        self._made: dict[Any, Any] = {}

    def _recipe(self):
        from .recipes import TinyAdditionRecipe

        return TinyAdditionRecipe.quick() if self.quick else TinyAdditionRecipe()

    def addition(self, seed: int) -> tuple[Any, Any, Any, dict]:
        """``(warm model, tokenizer, untrained model, data)`` for ``seed``."""
        key = ("addition", seed)
        if key not in self._made:
            from .recipes import build_recipe_model, make_recipe_data, warm_start

            recipe = self._recipe()
            data = make_recipe_data(recipe)
            model, tokenizer = build_recipe_model(recipe, seed)
            untrained = copy.deepcopy(model)
            warm_start(model, tokenizer, data, recipe, seed, progress=False,  # no folder: make test's cache, if set
                       cache=None if self.folder is None else str(self.folder / "warm_starts"))
            self._made[key] = (model, tokenizer, untrained, data)
        return self._made[key]

    def thinking(self) -> tuple[Any, Any, Any, dict]:
        if "thinking" not in self._made:
            from .thinking import ThinkingRecipe, build_thinking_model, load_warm_start, make_thinking_data

            if self.quick:
                recipe = ThinkingRecipe.quick()
                model, tokenizer = build_thinking_model(recipe, 0)
            else:
                recipe = ThinkingRecipe()
                model, tokenizer = load_warm_start(recipe)
            self._made["thinking"] = (model, tokenizer, recipe, make_thinking_data(recipe))
        return self._made["thinking"]

    def tool_use(self, calls: bool = True) -> tuple[Any, Any, Any, dict]:
        key = ("tool_use", calls)
        if key not in self._made:
            from ..sft import supervised_warmup
            from .tool_use import ToolRecipe, build_tool_model, make_tool_data, warm_start, warm_start_targets

            recipe = ToolRecipe.quick() if self.quick else ToolRecipe()
            data = make_tool_data(recipe)
            model, tokenizer = build_tool_model(recipe, 0)
            cache = None if self.folder is None else str(self.folder / "warm_starts")
            if calls:
                info = warm_start(model, tokenizer, data, recipe, 0, progress=False, cache=cache)
                self._made["tool_steps"] = info["steps"]
            else:
                steps = self.tool_use(True) and self._made["tool_steps"]  # as many steps as the one that calls
                torch.manual_seed(0)
                targets = warm_start_targets(data["train"], 0.0, 0)  # every target a guess: no call is ever shown
                supervised_warmup(model, tokenizer, targets, dataclasses.replace(recipe.sft, seed=0, steps=steps),
                                  progress=False)
            self._made[key] = (model, tokenizer, recipe, data)
        return self._made[key]

    def easy(self) -> tuple[Any, Any, list[dict]]:
        """The tiny model drilled on all 100 one-digit sums until it answers every one right greedily."""
        if "easy" not in self._made:
            from ..evaluation import evaluate_policy
            from ..sft import SFTConfig, supervised_warmup
            from .recipes import build_recipe_model

            recipe = self._recipe()
            model, tokenizer = build_recipe_model(recipe, 0)
            problems = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]
            saved = None if self.folder is None else self.folder / "warm_starts" / "easy.pt"
            if saved is not None and saved.exists():
                model.load_state_dict(torch.load(saved, weights_only=True))
            else:
                config = recipe.grpo_config(0)
                torch.manual_seed(0)
                supervised_warmup(model, tokenizer, problems * 20, SFTConfig(steps=30 if self.quick else 3000, seed=0),
                                  stop_when=lambda m: evaluate_policy(m, tokenizer, problems, config)["accuracy"] >= 1.0,
                                  check_every=50, progress=False)
                if saved is not None:  # through a rename: another process may be making the same one
                    saved.parent.mkdir(parents=True, exist_ok=True)
                    tmp = saved.with_name(f"{saved.name}.{os.getpid()}.tmp")
                    torch.save(model.state_dict(), tmp)
                    os.replace(tmp, saved)
            self._made["easy"] = (model, tokenizer, problems)
        return self._made["easy"]


# ---------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------


def _trainer_inputs(case: Case, seed: int, starts: Starts, settings: ZooSettings) -> dict[str, Any]:
    """The model, tokenizer, rewards, config, reference, tools and rows of one run."""
    extra: dict[str, Any] = {}
    ref = None
    if case.task == "addition":
        model, tokenizer, untrained, data = starts.addition(seed)
        recipe = starts._recipe()
        config = recipe.grpo_config(seed)
        rows = data["train"]
        if case.data == "four_digits":
            rows = make_arithmetic_dataset(5000, seed=recipe.data_seed + 4_000, digits=4)
        elif case.data == "words":
            rows = words_for_some_references(rows, settings.words_share, recipe.data_seed)
        rewards = {"correct": [correctness_reward], "marked_only": [marked_only_reward],
                   "unreadable_is_right": [unreadable_is_right_reward]}[case.reward]
        if case.reference == "untrained":
            ref = copy.deepcopy(untrained)
    elif case.task == "thinking":
        from .thinking import reward_functions

        model, tokenizer, recipe, data = starts.thinking()
        config = recipe.grpo_config(seed)
        rows = data["train"]
        rewards = reward_functions({"correct": "correct", "format": "format"}[case.reward], config, seed)
    elif case.task == "tool_use":
        from ..tools.calculator import calculator
        from .tool_use import tool_answer_reward

        model, tokenizer, recipe, data = starts.tool_use(calls=case.start != "no_calls")
        config = recipe.grpo_config(seed)
        rows = data["train"]
        rewards = [tool_answer_reward]
        extra = {"accuracy_fn": tool_answer_reward, "tools": [calculator]}
    elif case.task == "easy":
        model, tokenizer, problems = starts.easy()
        config = starts._recipe().grpo_config(seed)
        rows = problems * 50
        rewards = [correctness_reward]
    else:
        raise ValueError(f"unknown task {case.task!r}")
    changes = dict(case.changes)
    if starts.quick and "max_new_tokens" in changes:  # the quick recipes' contexts are short
        changes["max_new_tokens"] = 8
    model = copy.deepcopy(model)
    if case.start == "float16":
        model = model.half()
    config = dataclasses.replace(config, **changes, completions_to_keep=settings.completions_to_keep)
    return {"model": model, "tokenizer": tokenizer, "rewards": rewards, "config": config, "ref": ref,
            "rows": rows, **extra}


def run_case(name: str, seed: int, settings: ZooSettings, starts: Starts) -> dict[str, Any]:
    """Train one zoo run; return ``case``, ``fault``, ``task``, ``seed``, ``steps`` (asked), ``history`` (the
    rows, :data:`HISTORY_KEYS` only), ``completions`` (the kept ones, :data:`COMPLETION_KEYS` only), ``settings``
    (the run's GRPOConfig as a dict), ``crashed`` (the error
    that stopped it, or None: a float16 policy ends in one) and ``seconds``."""
    case = CASES[name]
    made = _trainer_inputs(case, seed, starts, settings)
    config = made["config"]
    trainer = GRPOTrainer(made["model"], made["tokenizer"], made["rewards"], config, ref_model=made["ref"],
                          **{k: made[k] for k in ("accuracy_fn", "tools") if k in made})
    steps = settings.steps[case.task]
    crashed = None
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)  # the kinds are kept (below); the zoo's console stays readable
        try:
            trainer.train(made["rows"], steps, progress=False)
        except (RuntimeError, ValueError, FloatingPointError) as err:  # what a float16 policy ends in
            crashed = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    seconds = time.perf_counter() - started
    return {
        "case": name, "fault": case.fault, "task": case.task, "seed": seed, "steps": steps,
        "history": [{k: _plain(row[k]) for k in HISTORY_KEYS if k in row} | _reward_functions(row)
                    for row in trainer.history],
        "completions": [{k: c[k] for k in COMPLETION_KEYS if k in c} for c in trainer.completions],
        "settings": {k: v for k, v in config.to_dict().items() if k != "output_dir"},
        "crashed": crashed, "seconds": seconds,
    }


def as_run(record: dict) -> Run:
    """A stored zoo run (:func:`run_case`'s dict) as the doctor reads it: what a run folder would hold, its
    ``crashed`` error as the trainer's ``crash.json`` (:mod:`grpo_tutorial.run.crash`) at the step after the last."""
    crash = None
    if record.get("crashed"):
        error, _, message = record["crashed"].partition(": ")
        last = record["history"][-1]["step"] if record["history"] else 0
        crash = {"step": last + 1, "error": error, "message": message}
    return Run(record["history"], record["completions"], record["settings"], "grpo_tutorial", crash=crash)


def _reward_functions(row: dict) -> dict:
    return {k: _plain(v) for k, v in row.items() if k.startswith("reward/")}


def _plain(value: Any) -> Any:
    """A history value as JSON keeps it (NaN as None, as history.jsonl writes it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value

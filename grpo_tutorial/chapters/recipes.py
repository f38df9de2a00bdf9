"""Recipes: complete, reusable runs that chapters and benchmarks share.

:func:`run_tiny_addition` is chapter 8's experiment and the benchmark
``benchmarks/tiny_learning.py`` in one function, so the two cannot drift apart:

1. **data**: 2-digit addition (``"12+34="``), split into a training set, a small
   *probe* set that decides when the warm start stops, and a held-out *test* set.
   The three share no prompt. The split depends on ``recipe.data_seed`` only, so
   every seed is scored on the same test problems.
2. **model**: a tiny character-level Qwen2 (:func:`~grpo_tutorial.models.build_tiny_policy`).
3. **warm start**: supervised steps on answer tokens until greedy accuracy on the
   probe set reaches ``sft_target_accuracy`` (partial skill: GRPO needs groups
   with some right and some wrong answers).
4. **held-out evaluation** (greedy) before GRPO.
5. **GRPO** with :class:`~grpo_tutorial.trainer.GRPOTrainer` and the
   correctness reward.
6. **held-out evaluation** after GRPO; the gain with a paired standard error.

Each phase is its own function, so a notebook can run them one at a time and look
at what happens in between; :func:`run_tiny_addition` runs them all and times them.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from grpo_tutorial import stats
from grpo_tutorial._checks import check_int, check_number
from grpo_tutorial.models import build_tiny_policy
from grpo_tutorial.rewards import correctness_reward
from grpo_tutorial.sft import SFTConfig, warm_start_until
from grpo_tutorial.tasks import train_test_split_arithmetic
from grpo_tutorial.config import GRPOConfig
from grpo_tutorial.presets import get_preset
from grpo_tutorial.evaluation import evaluate_policy
from grpo_tutorial.trainer import GRPOTrainer

__all__ = [
    "GRPO_PRESET",
    "RESULT_KEYS",
    "TinyAdditionRecipe",
    "accuracy_with_se",
    "build_recipe_model",
    "evaluate_heldout",
    "make_recipe_data",
    "make_recipe_trainer",
    "paired_gain",
    "result_summary",
    "run_tiny_addition",
    "warm_start",
]

#: The keys of the dict returned by :func:`run_tiny_addition`.
RESULT_KEYS = (
    "seed",
    "recipe",
    "warm_start",
    "before",
    "after",
    "gain",
    "gain_se",
    "seconds",
    "history",
    "heldout_curve",
    "model",
    "tokenizer",
    "trainer",
)


# ---------------------------------------------------------------------------
# The recipe
# ---------------------------------------------------------------------------

# The recipe's warm start, written once as the config it is; its GRPO phase is the
# registry's "tiny-cpu" preset (grpo_tutorial/presets.py, where its calibration is explained).
_SFT_SETTINGS: dict[str, Any] = dict(steps=1_000, batch_size=64, learning_rate=1e-3, warmup_steps=100)
#: The preset of the GRPO phase (:func:`grpo_tutorial.presets.get_preset`).
GRPO_PRESET = "tiny-cpu"

# Flat names for settings inside ``sft`` and ``grpo``: ``--set`` on the benchmark,
# :meth:`TinyAdditionRecipe.with_settings`, and recipe records stored before the
# recipe held the two configs (``benchmarks/tiny_learning.json``) use them.
FLAT_SETTINGS: dict[str, tuple[str, str]] = {
    "sft_max_steps": ("sft", "steps"),
    "sft_batch_size": ("sft", "batch_size"),
    "sft_learning_rate": ("sft", "learning_rate"),
    "sft_warmup_steps": ("sft", "warmup_steps"),
    "grpo_learning_rate": ("grpo", "learning_rate"),
    "grpo_warmup_steps": ("grpo", "warmup_steps"),
    **{name: ("grpo", name) for name in (
        "group_size", "prompts_per_step", "max_new_tokens", "temperature", "clip_eps", "num_iterations",
        "minibatch_size", "max_grad_norm", "beta", "loss_type", "eval_batch_size",
    )},
}


@dataclass
class TinyAdditionRecipe:
    """Every setting of the tiny-model learning demonstration.

    The defaults are the settings the benchmark reports (see
    ``benchmarks/tiny_learning.py``); :meth:`quick` is a much smaller run for
    tests. The warm start and the GRPO phase are an
    :class:`~grpo_tutorial.sft.SFTConfig` and a
    :class:`~grpo_tutorial.trainer.GRPOConfig` (fields ``sft`` and ``grpo``), so
    their settings are documented and checked in one place; the recipe only adds
    what neither config knows (data, model size, when to stop the warm start,
    how many GRPO steps, when to evaluate). The seed of each run is set by
    :meth:`sft_config` and :meth:`grpo_config`, not stored here.

    The GRPO phase's defaults are the ``"tiny-cpu"`` preset of
    :mod:`grpo_tutorial.presets`, which says why they are what they are (32
    prompts per step, mu = 1, two minibatches of 128 completions);
    ``python -m grpo_tutorial train`` with no flag runs the same recipe.

    Attributes:
        digits: operand size; 2 means operands 0-99 (answers 0-198).
        n_train: training rows (drawn with repeats from the problems not held out).
        n_probe: held-out problems used only to decide when the warm start stops.
        n_test: held-out problems for the before/after accuracy (never trained on,
            never used to make a decision).
        data_seed: fixes the split; the same for every training seed.
        hidden_size, num_layers, num_heads, intermediate_size: the tiny Qwen2.
        sft: the warm start's settings; ``sft.steps`` is an upper bound.
        sft_target_accuracy: stop the warm start once greedy accuracy on the
            probe set reaches this (checked every ``sft_check_every`` steps).
        grpo: the GRPO phase's settings (``grpo.eval_batch_size`` is also the
            batch of the held-out evaluations).
        grpo_steps: GRPO steps (a fixed count, so a seed always gives the same run).
            It was 200 until the step became about 2.3 times faster (issue 10);
            400 steps now take about 80 s on one thread, less than 200 took
            before. At 200 steps seed 1, the slowest learner of seeds 0-3, gained
            only 20 points; at 400 every one of the four gains at least 29.
        eval_every: also evaluate on the test set every this many GRPO steps
            (0 = only before and after). The time it takes is not counted as
            GRPO time.
        num_threads: torch CPU threads during the run, restored afterwards
            (None = leave torch's setting alone). The default is 1: the tiny
            model's matrices are too small to gain from a second thread, and on
            a shared machine two threads that wait for each other can be many
            times slower than one.
    """

    digits: int = 2
    n_train: int = 20_000
    n_probe: int = 200
    n_test: int = 1_000
    data_seed: int = 0
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 512
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(**_SFT_SETTINGS))
    sft_target_accuracy: float = 0.3
    sft_check_every: int = 10
    grpo: GRPOConfig = field(default_factory=lambda: get_preset(GRPO_PRESET))
    grpo_steps: int = 400
    eval_every: int = 50
    num_threads: int | None = 1

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name, cls in (("sft", SFTConfig), ("grpo", GRPOConfig)):
            if not isinstance(getattr(self, name), cls):
                raise TypeError(
                    f"{owner}.{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}; "
                    f"build one with {cls.__name__}(...) or use {owner}.from_dict for stored records"
                )
        for name in (
            "digits", "n_train", "n_probe", "n_test", "hidden_size", "num_layers", "num_heads",
            "intermediate_size", "sft_check_every", "grpo_steps",
        ):
            check_int(owner, name, getattr(self, name), 1)
        for name in ("data_seed", "eval_every"):
            check_int(owner, name, getattr(self, name), 0)
        check_number(owner, "sft_target_accuracy", self.sft_target_accuracy, lambda v: 0 < v <= 1, "a number in (0, 1]")
        check_int(owner, "num_threads", self.num_threads, 1, optional=True)
        if self.n_test + self.n_probe > 10 ** (2 * self.digits):
            raise ValueError(
                f"{owner}: n_test + n_probe = {self.n_test + self.n_probe} distinct problems requested, "
                f"but only {10 ** (2 * self.digits)} exist with digits={self.digits}"
            )

    def with_settings(self, **settings: Any) -> "TinyAdditionRecipe":
        """A copy with some settings changed, by recipe field or flat name.

        Flat names (:data:`FLAT_SETTINGS`) reach into the configs:
        ``recipe.with_settings(grpo_learning_rate=1e-3, sft_max_steps=50)`` is
        ``recipe.grpo.learning_rate = 1e-3`` and ``recipe.sft.steps = 50`` on a
        copy. The configs check the new values at once.
        """
        top = {f.name for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        inner: dict[str, dict[str, Any]] = {"sft": {}, "grpo": {}}
        for name, value in settings.items():
            if name in FLAT_SETTINGS:
                config, key = FLAT_SETTINGS[name]
                inner[config][key] = value
            elif name in top:
                changes[name] = value
            else:
                raise ValueError(
                    f"{name!r} is not a TinyAdditionRecipe setting; choose a field {sorted(top)} "
                    f"or a flat name {sorted(FLAT_SETTINGS)}"
                )
        for config, values in inner.items():
            if values:
                changes[config] = dataclasses.replace(changes.get(config, getattr(self, config)), **values)
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "TinyAdditionRecipe":
        """The recipe a :meth:`to_dict` record describes; flat records from older runs work too."""
        record = dict(record)
        sft, grpo = record.pop("sft", None), record.pop("grpo", None)
        base = cls(
            sft=SFTConfig(**sft) if isinstance(sft, dict) else cls().sft,
            grpo=GRPOConfig(**grpo) if isinstance(grpo, dict) else cls().grpo,
        )
        return base.with_settings(**record)

    @classmethod
    def quick(cls, **overrides: Any) -> "TinyAdditionRecipe":
        """A seconds-long run for tests: 1-digit addition, a 2-layer model, a low target, few steps.

        It exercises every phase but proves nothing about learning. ``overrides``
        are applied with :meth:`with_settings`.
        """
        settings: dict[str, Any] = dict(
            digits=1, n_train=500, n_probe=30, n_test=40, hidden_size=32, num_layers=2, num_heads=2,
            intermediate_size=64, sft_max_steps=200, sft_batch_size=32, sft_learning_rate=3e-3,
            sft_warmup_steps=10, sft_target_accuracy=0.2, sft_check_every=10, grpo_steps=4,
            group_size=8, prompts_per_step=4, max_new_tokens=3, minibatch_size=16, eval_every=2, eval_batch_size=64,
        )
        settings.update(overrides)
        return cls().with_settings(**settings)

    def sft_config(self, seed: int) -> SFTConfig:
        """The warm start's :class:`~grpo_tutorial.sft.SFTConfig` for one run."""
        return dataclasses.replace(self.sft, seed=seed)

    def grpo_config(self, seed: int, output_dir: str | None = None) -> GRPOConfig:
        """The GRPO phase's :class:`~grpo_tutorial.trainer.GRPOConfig` for one run."""
        return dataclasses.replace(self.grpo, seed=seed, output_dir=output_dir)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (the configs as nested dicts); :meth:`from_dict` reads it back."""
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------
# Statistics (pure)
# ---------------------------------------------------------------------------


def _check_outcomes(name: str, values: Sequence[Any]) -> list[float]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list of bools (one per problem), got {type(values).__name__}")
    if len(values) == 0:
        raise ValueError(f"{name} is empty; expected one outcome per problem")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or v in (0, 1):
            out.append(float(v))
        else:
            raise ValueError(f"{name}[{i}] must be True/False or 0/1, got {v!r}")
    return out


def accuracy_with_se(correct: Sequence[bool]) -> tuple[float, float]:
    """Accuracy and its standard error, sqrt(p (1 - p) / n).

    >>> accuracy_with_se([True, False, True, True])
    (0.75, 0.21650635094610965)
    """
    x = _check_outcomes("correct", correct)
    n = len(x)
    p = sum(x) / n
    return p, stats.proportion_se(p, n)


def paired_gain(before: Sequence[bool], after: Sequence[bool]) -> tuple[float, float]:
    """Change in accuracy on the same problems, and its paired standard error.

    The per-problem differences d_i = after_i - before_i are -1, 0 or +1; the gain
    is their mean and the standard error is their sample std over sqrt(n). Pairing
    removes the variation between problems that both evaluations share, so it is
    smaller than combining the two separate standard errors. The core's
    :func:`grpo_tutorial.stats.paired_gain`, for outcomes that are True/False or 0/1.

    >>> paired_gain([0, 0, 1, 1], [1, 1, 1, 0])
    (0.25, 0.47871355387816905)
    """
    return stats.paired_gain(_check_outcomes("before", before), _check_outcomes("after", after))


# ---------------------------------------------------------------------------
# The phases
# ---------------------------------------------------------------------------


def make_recipe_data(recipe: TinyAdditionRecipe) -> dict[str, list[dict]]:
    """Training, probe and test rows: no prompt is in two of them.

    The split depends only on ``recipe.data_seed`` (and the sizes), not on the
    training seed, so every seed is scored on the same test problems.
    """
    train, held_out = train_test_split_arithmetic(
        recipe.n_train, recipe.n_test + recipe.n_probe, recipe.data_seed, op="+", digits=recipe.digits
    )
    return {"train": train, "probe": held_out[recipe.n_test :], "test": held_out[: recipe.n_test]}


def build_recipe_model(recipe: TinyAdditionRecipe, seed: int):
    """The tiny Qwen2 and its character tokenizer, initialised from ``seed``."""
    return build_tiny_policy(
        hidden_size=recipe.hidden_size,
        num_layers=recipe.num_layers,
        num_heads=recipe.num_heads,
        intermediate_size=recipe.intermediate_size,
        seed=seed,
    )


def make_recipe_trainer(model, tokenizer, recipe: TinyAdditionRecipe, seed: int, output_dir: str | None = None) -> GRPOTrainer:
    """A :class:`GRPOTrainer` with the correctness reward and the recipe's settings."""
    return GRPOTrainer(model, tokenizer, correctness_reward, recipe.grpo_config(seed, output_dir))


def evaluate_heldout(trainer: GRPOTrainer, rows: Sequence[dict]) -> dict:
    """Greedy held-out accuracy of a trainer's model: :meth:`GRPOTrainer.evaluate`, nothing added.

    The prompt, chat template, token budget and batch size all come from the
    trainer's config (:func:`~grpo_tutorial.evaluation.evaluate_policy`), so the
    evaluation sees what training sees. Returns ``accuracy``, ``se``, ``n``,
    ``correct`` (one bool per row, in order, for :func:`paired_gain`),
    ``completions``, ``seconds`` and the rest of ``evaluate_policy``'s dict.
    """
    if not isinstance(trainer, GRPOTrainer):
        raise TypeError(f"trainer must be a GRPOTrainer, got {type(trainer).__name__}")
    return trainer.evaluate(rows)


def warm_start(
    model,
    tokenizer,
    data: dict[str, list[dict]],
    recipe: TinyAdditionRecipe,
    seed: int,
    *,
    progress: bool = True,
    cache: str | os.PathLike | None = None,
) -> dict:
    """Supervised steps until greedy accuracy on the probe set reaches the target.

    Returns ``steps``, ``seconds``, ``reached`` (whether the target was hit
    before ``recipe.sft.steps``), ``probe_accuracy`` (at every check, as
    ``(step, accuracy)`` pairs) and the loss ``history``.

    ``cache``: a folder (default: the environment variable
    :data:`WARM_START_CACHE`, unset in a reader's session) where each warm start
    made is kept and taken again when the same one is asked for: the weights, the
    returned dict (its ``seconds`` are the making's) and torch's RNG state after
    it, so the caller goes on as if it had made it. ``make test`` sets it, because
    chapters 0, 8, 14 and 15 and the record tests start from the same seed-0 warm
    start, one deterministic computation on one machine. The key
    (:func:`warm_start_key`) holds everything that decides its bits.
    """
    folder = cache if cache is not None else os.environ.get(WARM_START_CACHE)
    if folder:
        return cached_warm_start(warm_start, folder, model, tokenizer, data, recipe, seed, progress)
    grpo = recipe.grpo_config(seed)  # the probe is evaluated as the GRPO phase will evaluate
    done = warm_start_until(model, tokenizer, data["train"], recipe.sft_config(seed),
                            lambda m: evaluate_policy(m, tokenizer, data["probe"], grpo)["accuracy"],
                            recipe.sft_target_accuracy, check_every=recipe.sft_check_every, progress=progress)
    return {"steps": done["steps"], "seconds": done["seconds"], "reached": done["reached"],
            "probe_accuracy": done["checks"], "history": done["history"]}


#: The environment variable that names :func:`warm_start`'s cache folder (``make test`` sets it to a new one).
WARM_START_CACHE = "GRPO_WARM_START_CACHE"


def warm_start_key(model, tokenizer, data: dict[str, list[dict]], recipe: TinyAdditionRecipe, seed: int,
                   maker: str = "", env: Mapping[str, str] | None = None) -> str:
    """What decides a warm start's bits, hashed: the recipe (but the GRPO phase's length), the seed, the
    model's initial weights, the tokenizer's vocabulary, the training and probe rows, the package's source, torch's version, its
    thread count and the kernels (:func:`~grpo_tutorial.env.kernel_fingerprint`, and the variables that pick them,
    read from ``env``, default this process's environment)."""
    from grpo_tutorial.env import kernel_fingerprint, kernel_variables

    digest = hashlib.sha256()
    fields = {k: v for k, v in recipe.to_dict().items() if k not in ("grpo_steps", "eval_every")}
    threads = torch.get_num_threads()
    kernels = kernel_variables(env)
    digest.update(json.dumps([maker, fields, seed, torch.__version__, threads, kernels, kernel_fingerprint(threads),
                              sorted(tokenizer.get_vocab().items()), data["train"], data["probe"]], sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def cached_warm_start(make, folder: str | os.PathLike, model, tokenizer, data, recipe, seed: int,
                      progress: bool) -> dict:
    """A chapter's warm start ``make(model, tokenizer, data, recipe, seed, progress=..., cache="")`` through the
    cache in ``folder``: made under a file lock by the first process that asks, loaded by the others
    (pytest-xdist's workers and the notebooks' kernels run at the same time). The key is :func:`warm_start_key`'s,
    with the making function's name (chapters 8 and 16 keep theirs apart)."""
    from filelock import FileLock

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = warm_start_key(model, tokenizer, data, recipe, seed, f"{make.__module__}.{make.__qualname__}")
    saved = folder / f"warm_start_{key}.pt"
    with FileLock(str(folder / f"warm_start_{key}.lock")):
        if saved.exists():
            state = torch.load(saved, weights_only=False)
            model.load_state_dict(state["weights"])
            torch.set_rng_state(state["rng"])
            return state["info"]
        info = make(model, tokenizer, data, recipe, seed, progress=progress, cache="")
        torch.save({"weights": model.state_dict(), "info": info, "rng": torch.get_rng_state()}, saved)
    return info


# ---------------------------------------------------------------------------
# The whole run
# ---------------------------------------------------------------------------


def run_tiny_addition(
    recipe: TinyAdditionRecipe | None = None,
    *,
    seed: int,
    progress: bool = True,
    output_dir: str | None = None,
    on_phase: Callable[[str, dict], None] | None = None,
    device: str | torch.device | None = None,
) -> dict:
    """Warm start, evaluate, GRPO, evaluate: the tiny model learns 2-digit addition.

    Args:
        recipe: the settings (default: ``TinyAdditionRecipe()``).
        seed: initialises the model and drives the warm start's data order and
            GRPO's sampling. The same seed gives the same numbers (on CPU, same
            thread count); only the seconds differ.
        progress: show tqdm bars.
        output_dir: where the trainer writes ``history.jsonl`` (None = memory only).
        on_phase: optional callback ``(phase_name, info)`` after each phase, for
            printing progress.
        device: where the model trains (None: the CPU, where it is built), e.g.
            ``"cuda"`` (``benchmarks/gpu_proof.py`` runs the recipe there).

    Returns:
        A dict with the keys in :data:`RESULT_KEYS`:

        - ``seed``, ``recipe`` (as a dict);
        - ``warm_start``: what :func:`warm_start` returns;
        - ``before`` / ``after``: what :func:`evaluate_heldout` returns, on the
          test set, before and after GRPO;
        - ``gain`` and ``gain_se``: after minus before, with the paired standard error;
        - ``seconds``: wall-clock ``warm_start``, ``grpo`` (the training alone),
          ``eval`` (before + after + any mid-run evaluations) and ``total``; and
          the process CPU seconds ``grpo_cpu`` and ``total_cpu``, which a busy
          machine inflates much less than the wall clock;
        - ``history``: the GRPO history rows;
        - ``heldout_curve``: ``(step, accuracy, se)`` at step 0, every
          ``eval_every`` steps, and at the end;
        - ``model``, ``tokenizer``, ``trainer``: the trained objects.
    """
    recipe = TinyAdditionRecipe() if recipe is None else recipe
    if not isinstance(recipe, TinyAdditionRecipe):
        raise TypeError(f"recipe must be a TinyAdditionRecipe, got {type(recipe).__name__}")
    check_int(None, "seed", seed, 0)
    previous_threads = torch.get_num_threads()
    if recipe.num_threads is not None:
        torch.set_num_threads(recipe.num_threads)
    try:
        return _run_phases(recipe, seed, progress=progress, output_dir=output_dir, on_phase=on_phase, device=device)
    finally:
        torch.set_num_threads(previous_threads)


def _run_phases(
    recipe: TinyAdditionRecipe,
    seed: int,
    *,
    progress: bool,
    output_dir: str | None,
    on_phase: Callable[[str, dict], None] | None,
    device: str | torch.device | None = None,
) -> dict:
    """The body of :func:`run_tiny_addition`, with the thread count already set."""
    notify = on_phase or (lambda name, info: None)
    t_total = time.perf_counter()
    cpu_total = time.process_time()

    data = make_recipe_data(recipe)
    model, tokenizer = build_recipe_model(recipe, seed)
    if device is not None:
        model.to(device)

    sft = warm_start(model, tokenizer, data, recipe, seed, progress=progress)
    notify("warm_start", sft)

    trainer = make_recipe_trainer(model, tokenizer, recipe, seed, output_dir)  # its randomness: seed streams
    before = evaluate_heldout(trainer, data["test"])
    notify("before", before)
    eval_seconds = before["seconds"]
    curve = [(0, before["accuracy"], before["se"])]

    chunk = recipe.eval_every or recipe.grpo_steps
    grpo_seconds = grpo_cpu = 0.0
    while trainer.step < recipe.grpo_steps:
        target = min(recipe.grpo_steps, trainer.step + chunk)
        start, cpu_start = time.perf_counter(), time.process_time()
        trainer.train(data["train"], target, progress=progress)
        grpo_seconds += time.perf_counter() - start
        grpo_cpu += time.process_time() - cpu_start
        if target < recipe.grpo_steps:
            mid = evaluate_heldout(trainer, data["test"])
            eval_seconds += mid["seconds"]
            curve.append((target, mid["accuracy"], mid["se"]))
            notify("heldout", {"step": target, **mid})
    notify("grpo", {"steps": trainer.step, "seconds": grpo_seconds, "cpu_seconds": grpo_cpu})

    after = evaluate_heldout(trainer, data["test"])
    eval_seconds += after["seconds"]
    curve.append((trainer.step, after["accuracy"], after["se"]))
    notify("after", after)
    gain, gain_se = paired_gain(before["correct"], after["correct"])

    return {
        "seed": seed,
        "recipe": recipe.to_dict(),
        "warm_start": sft,
        "before": before,
        "after": after,
        "gain": gain,
        "gain_se": gain_se,
        "seconds": {
            "warm_start": sft["seconds"],
            "grpo": grpo_seconds,
            "eval": eval_seconds,
            "total": time.perf_counter() - t_total,
            "grpo_cpu": grpo_cpu,
            "total_cpu": time.process_time() - cpu_total,
        },
        "history": trainer.history,
        "heldout_curve": curve,
        "model": model,
        "tokenizer": tokenizer,
        "trainer": trainer,
    }


def result_summary(result: dict, *, include_history: bool = False) -> dict:
    """The JSON-safe part of a :func:`run_tiny_addition` result (no model, no per-problem lists)."""
    missing = [k for k in RESULT_KEYS if k not in result]
    if missing:
        raise ValueError(f"result is missing {missing}; expected a dict returned by run_tiny_addition")

    def short(evaluation: dict) -> dict:
        return {k: evaluation[k] for k in ("accuracy", "se", "n", "seconds")}

    sft = {k: v for k, v in result["warm_start"].items() if k != "history"}
    summary = {
        "seed": result["seed"],
        "recipe": result["recipe"],
        "warm_start": sft,
        "before": short(result["before"]),
        "after": short(result["after"]),
        "gain": result["gain"],
        "gain_se": result["gain_se"],
        "seconds": dict(result["seconds"]),
        "grpo_steps": len(result["history"]),
        "grpo_seconds_per_step": result["seconds"]["grpo"] / max(1, len(result["history"])),
        "heldout_curve": [list(point) for point in result["heldout_curve"]],
    }
    if include_history:
        summary["history"] = copy.deepcopy(result["history"])
    return summary

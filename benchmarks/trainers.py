"""Parts b and d: seconds per GRPO step and peak memory, the package's trainer against TRL's.

Both trainers get the same model (loaded the same way, float32), the same prompts
per step B, group size G, token budget, mu = 1, beta = 0, loss, advantage scaling,
learning rate and CPU threads. Every completion is forced to the full token budget
(``min_new_tokens``), so both generate and score the same number of tokens. TRL's
CPU-unfriendly defaults (bf16, gradient checkpointing) are switched off; see
:func:`trl_args`.

Each (engine, model) pair runs in its own subprocess (``python -m
benchmarks.trainers ...``), so its peak resident memory is its own. The worker takes
``warmup`` untimed steps, then ``repeats`` timed steps, and reports the seconds of
each step, a breakdown of each step by phase, the peak RSS and the RSS before the
first step.

Phases (the same names for both engines):

generate
    sampling the B*G completions (``generate``), with tokenising and decoding.
rewards
    calling the reward functions.
score_no_grad
    a forward pass without gradient for the old (or reference) log-probs. TRL skips
    it when mu = 1 and beta = 0, because the old policy *is* the current one.
forward, backward, optimizer
    the loss's forward pass, its backward pass, and the AdamW step.
other
    the rest of the step: advantages, padding, masks, logging, data loading.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

from .common import current_rss_mb, peak_rss_mb, report, set_threads, summarize

PHASES = ("generate", "rewards", "score_no_grad", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class MatchedSpec:
    """One matched configuration: the model and what a step does."""

    model: str
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    learning_rate: float
    style: str  # prompt style of make_arithmetic_dataset: "plain" (tiny) or "question" (chat)
    digits: int

    def __post_init__(self) -> None:
        for name in ("prompts_per_step", "group_size", "max_new_tokens", "digits"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MatchedSpec.{name} must be a positive int, got {value!r}")
        if self.group_size < 2:
            raise ValueError(f"MatchedSpec.group_size must be >= 2, got {self.group_size}")
        if self.style not in ("plain", "question"):
            raise ValueError(f"MatchedSpec.style must be 'plain' or 'question', got {self.style!r}")


#: The matched configurations of the benchmark, by model name.
SPECS = {
    "tiny": MatchedSpec("tiny", prompts_per_step=16, group_size=8, max_new_tokens=4,
                        learning_rate=1e-4, style="plain", digits=2),
    "smollm2-135m-instruct": MatchedSpec("smollm2-135m-instruct", prompts_per_step=1, group_size=8,
                                         max_new_tokens=32, learning_rate=1e-6, style="question", digits=1),
}


def ours_config(spec: MatchedSpec):
    """The package's GRPOConfig for a matched spec."""
    from grpo_tutorial.config import GRPOConfig

    return GRPOConfig(
        group_size=spec.group_size,
        prompts_per_step=spec.prompts_per_step,
        max_new_tokens=spec.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        learning_rate=spec.learning_rate,
        weight_decay=0.0,
        beta=0.0,
        clip_eps=0.2,
        num_iterations=1,
        minibatch_size=None,
        loss_type="grpo",
        scale_rewards="group",
        max_grad_norm=1.0,
        seed=0,
    )


def trl_args(spec: MatchedSpec, steps: int, output_dir: str):
    """``trl.GRPOConfig`` with the same settings as :func:`ours_config`.

    One TRL optimizer step = one generation of B*G completions: TRL counts
    ``per_device_train_batch_size`` in completions, and with one process and no
    gradient accumulation one generation feeds exactly one optimizer step.
    """
    import dataclasses

    import trl

    names = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    no_checkpointing = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    ours = ours_config(spec)
    return trl.GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        max_steps=steps,
        seed=ours.seed,
        bf16=False,  # TRL's default is bf16 mixed precision
        **{no_checkpointing: False},  # TRL's default recomputes activations in the backward pass
        lr_scheduler_type="constant",
        num_generations=ours.group_size,
        per_device_train_batch_size=ours.prompts_per_step * ours.group_size,
        gradient_accumulation_steps=1,
        max_completion_length=ours.max_new_tokens,
        generation_kwargs={"min_new_tokens": ours.max_new_tokens},
        temperature=ours.temperature,
        top_p=ours.top_p,
        learning_rate=ours.learning_rate,
        weight_decay=ours.weight_decay,
        max_grad_norm=ours.max_grad_norm,
        beta=ours.beta,
        num_iterations=ours.num_iterations,
        epsilon=ours.clip_eps,
        epsilon_high=ours.clip_eps_high,
        loss_type=ours.loss_type,
        scale_rewards=ours.scale_rewards,
    )


def dataset_rows(spec: MatchedSpec, n: int) -> list[dict]:
    from grpo_tutorial.tasks import make_arithmetic_dataset

    return make_arithmetic_dataset(n, seed=0, digits=spec.digits, style=spec.style)


# ---------------------------------------------------------------------------
# Phase timing
# ---------------------------------------------------------------------------


class PhaseClock:
    """Adds up the seconds spent in each phase of the current step."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []
        self.current: dict[str, float] = defaultdict(float)
        self.notes: dict[str, list[float]] = defaultdict(list)

    def new_step(self) -> None:
        self.current = defaultdict(float)
        self.steps.append(self.current)

    def add(self, phase: str, seconds: float) -> None:
        self.current[phase] += seconds

    def wrap(self, fn: Callable, phase: str | Callable[[], str]) -> Callable:
        """``fn`` with its wall time added to ``phase`` (a name, or a function giving one)."""

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(phase() if callable(phase) else phase, time.perf_counter() - start)

        return wrapped


def grad_phase() -> str:
    """A log-prob pass with gradient is the loss's forward; without, a scoring pass."""
    import torch

    return "forward" if torch.is_grad_enabled() else "score_no_grad"


def phase_rows(step_seconds: list[float], phases: list[dict[str, float]]) -> list[dict[str, float]]:
    """One row of seconds per phase for each step, with 'other' the unexplained rest."""
    rows = []
    for total, parts in zip(step_seconds, phases):
        row = {name: parts.get(name, 0.0) for name in PHASES}
        row["other"] = total - sum(row.values())
        rows.append(row)
    return rows


def phase_summary(rows: list[dict[str, float]]) -> dict[str, float]:
    """Median seconds of each phase over the steps' rows."""
    return {name: summarize([row[name] for row in rows])["median"] for name in (*PHASES, "other")}


# ---------------------------------------------------------------------------
# The two workers
# ---------------------------------------------------------------------------


def load(spec: MatchedSpec):
    from grpo_tutorial.pretrained import load_policy

    return load_policy(spec.model, device="cpu", dtype="float32")


#: Where each benchmark phase comes from in the package's history row (no patching:
#: the trainer times its own stages): stages by their names (metrics.stage_seconds), pieces of stage 5 by theirs.
HISTORY_PHASES = {
    "generate": ("sample",),
    "rewards": ("reward",),
    "score_no_grad": ("advantages", "score"),  # stage 3's microseconds: in this phase before issue 44 too
    "forward": ("forward_seconds",),
    "backward": ("backward_seconds",),
    "optimizer": ("optimizer_seconds",),
}


def history_phases(row: dict[str, float]) -> dict[str, float]:
    """The benchmark's phases of one step, read from the package's history row (older rows too)."""
    from grpo_tutorial.metrics import stage_seconds

    seconds = {**row, **stage_seconds(row)}
    return {phase: sum(seconds[key] for key in keys) for phase, keys in HISTORY_PHASES.items()}


def run_ours(spec: MatchedSpec, warmup: int, repeats: int) -> dict[str, Any]:
    """Time ``warmup + repeats`` steps of the package's GRPOTrainer, from its own per-stage timings."""
    import warnings

    import grpo_tutorial.trainer as trainer_module
    from grpo_tutorial.rewards import correctness_reward

    model, tokenizer = load(spec)
    model.generation_config.min_new_tokens = spec.max_new_tokens
    trainer = trainer_module.GRPOTrainer(model, tokenizer, correctness_reward, ours_config(spec))

    rows = dataset_rows(spec, spec.prompts_per_step * (warmup + repeats))
    rss_before = current_rss_mb()
    seconds, phases, prompt_tokens, completion_tokens = [], [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "most completions truncated": forced on purpose here
        for i in range(warmup + repeats):
            batch = rows[i * spec.prompts_per_step : (i + 1) * spec.prompts_per_step]
            start = time.perf_counter()
            row = trainer.train_step(batch)
            seconds.append(time.perf_counter() - start)
            phases.append(history_phases(row))
            completion_tokens.append(row["completion_len_mean"])
            prompt_tokens.append(_prompt_tokens(tokenizer, batch, trainer.config))
    return {
        "engine": "grpo_tutorial",
        "step_seconds": seconds[warmup:],
        "phase_steps": phase_rows(seconds[warmup:], phases[warmup:]),
        "rss_before_mb": rss_before,
        "peak_rss_mb": peak_rss_mb(),
        "prompt_tokens_mean": summarize(prompt_tokens)["median"],
        "completion_tokens_mean": summarize(completion_tokens)["median"],
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def _prompt_tokens(tokenizer: Any, batch: list[dict], config: Any) -> float:
    """Mean prompt length in tokens, rendered as the trainer renders it."""
    from grpo_tutorial.rollout import encode_prompts

    token_rows = encode_prompts(tokenizer, [row["prompt"] for row in batch], system_prompt=config.system_prompt,
                                use_chat_template=config.use_chat_template)
    lengths = [len(ids) for ids in token_rows]
    return sum(lengths) / len(lengths)


def run_trl(spec: MatchedSpec, warmup: int, repeats: int) -> dict[str, Any]:
    """Time ``warmup + repeats`` steps of TRL's GRPOTrainer."""
    import warnings

    import datasets
    import transformers
    import trl

    from grpo_tutorial.rewards import correctness_reward

    transformers.logging.set_verbosity_error()
    model, tokenizer = load(spec)
    rows = dataset_rows(spec, 64)
    if spec.style == "question":  # a chat model: TRL applies the chat template to message lists
        for row in rows:
            row["prompt"] = [{"role": "user", "content": row["prompt"]}]
    clock = PhaseClock()
    marks: dict[str, list[float]] = defaultdict(list)
    shapes: dict[str, list[float]] = defaultdict(list)

    class Timing(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.new_step()
            marks["begin"].append(time.perf_counter())

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            marks["pre_opt"].append(time.perf_counter())

        def on_optimizer_step(self, args, state, control, **kwargs):
            clock.add("optimizer", time.perf_counter() - marks["pre_opt"][-1])

        def on_step_end(self, args, state, control, **kwargs):
            marks["end"].append(time.perf_counter())

        def on_train_end(self, args, state, control, **kwargs):
            marks["train_end"].append(time.perf_counter())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=correctness_reward,
            args=trl_args(spec, warmup + repeats, tempfile.mkdtemp(prefix="bench-trl-")),
            train_dataset=datasets.Dataset.from_list(rows),
            processing_class=tokenizer,
        )
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    trainer.add_callback(Timing())

    def generate(prompts):
        out = generate_fn(prompts)
        prompt_ids, completion_ids = out[0], out[1]
        shapes["prompt_tokens"].append(sum(map(len, prompt_ids)) / len(prompt_ids))
        shapes["completion_tokens"].append(sum(map(len, completion_ids)) / len(completion_ids))
        return out

    generate_fn = trainer._generate
    trainer._generate = clock.wrap(generate, "generate")
    trainer._calculate_rewards = clock.wrap(trainer._calculate_rewards, "rewards")
    trainer._get_per_token_logps_and_entropies = clock.wrap(trainer._get_per_token_logps_and_entropies, grad_phase)
    trainer.accelerator.backward = clock.wrap(trainer.accelerator.backward, "backward")

    rss_before = current_rss_mb()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    # a step runs from its on_step_begin to the next one (the last: to the end of training),
    # so TRL's per-step logging and data loading count, as they do for the package
    begins = marks["begin"] + marks["train_end"][-1:]
    seconds = [b - a for a, b in zip(begins[:-1], begins[1:])]
    core = [e - b for b, e in zip(marks["begin"], marks["end"])]
    return {
        "engine": "trl",
        "step_seconds": seconds[warmup:],
        "core_step_seconds": core[warmup:],
        "phase_steps": phase_rows(seconds[warmup:], clock.steps[warmup:]),
        "rss_before_mb": rss_before,
        "peak_rss_mb": peak_rss_mb(),
        "prompt_tokens_mean": summarize(shapes["prompt_tokens"])["median"],
        "completion_tokens_mean": summarize(shapes["completion_tokens"])["median"],
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trainers", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["ours", "trl"], required=True)
    parser.add_argument("--model", choices=sorted(SPECS), required=True)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--prompts-per-step", type=int, help="override the spec's B (the sweep)")
    parser.add_argument("--group-size", type=int, help="override the spec's G (the sweep)")
    parser.add_argument("--max-new-tokens", type=int, help="override the spec's completion length (the sweep)")
    args = parser.parse_args(argv)
    if args.warmup < 0 or args.repeats < 1:
        parser.error(f"--warmup must be >= 0 and --repeats >= 1, got {args.warmup} and {args.repeats}")
    set_threads(args.threads)
    spec = SPECS[args.model]
    overrides = {k: getattr(args, k) for k in ("prompts_per_step", "group_size", "max_new_tokens") if getattr(args, k)}
    if overrides:  # a point of the cost-growth sweep
        import dataclasses

        spec = dataclasses.replace(spec, **overrides)
    run = run_ours if args.engine == "ours" else run_trl
    result = run(spec, args.warmup, args.repeats)
    result.update({"model": spec.model, "spec": spec.__dict__, "threads": args.threads, "warmup": args.warmup})
    report(result)


if __name__ == "__main__":
    main()

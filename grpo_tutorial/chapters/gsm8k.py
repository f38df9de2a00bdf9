"""Chapter 9's runs: the GPU run as one function (a chat model on GSM8K), and the CPU run's data.

The notebook's GPU branch, a user's script and the test
``tests/test_gsm8k_run.py`` all call the same code:

- :func:`gsm8k_data` loads GSM8K (``load_gsm8k``, online only) and falls back to
  generated word-free arithmetic when the hub cannot be reached;
- :func:`read_gsm8k_jsonl` reads a local copy in GSM8K's own format (one
  ``{"question", "answer": "... #### N"}`` object a line), for offline use;
- :func:`gsm8k_run` takes a loaded model and tokenizer and a preset (by default
  ``"qwen2.5-0.5b-colab-t4"``), turns on gradient checkpointing, evaluates
  greedily on the held-out rows, trains, and evaluates again; with
  ``output_dir`` it checkpoints and stores both evaluations there, and
  ``resume=True`` continues an interrupted run to the same total of steps;
- :func:`smollm2_cpu_data` is the CPU run's data (SmolLM2 on one-digit
  arithmetic, the ``"smollm2-cpu"`` preset);
- :func:`estimate_step_seconds` is a roofline estimate of one step's time from
  the FLOPs of generation and training and a GPU's peak FLOP rate and memory
  bandwidth (:data:`T4_FP32_FLOPS`, :data:`T4_BANDWIDTH`);
- :func:`t4_run_estimate`, :func:`session_estimate` and :func:`t4_memory_estimate`
  carry ``make gpu-proof``'s measured step to a T4: the step of the mode the config
  trains (LoRA or full fine-tuning) and the sampler it generates with on a GPU
  (:func:`gpu_sampler`), refusing (:class:`MissingMeasurement`) where the record
  lacks either; :func:`chapter9_estimate` is what chapter 9 prints from any record.

The chat template, the system prompt, the token budget and the micro-batches
all come from the preset, so nothing here is specific to one model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .recipes import accuracy_with_se, paired_gain
from .._checks import check_flag, check_int, check_number
from ..answers import answers_match, completion_to_text, extract_answer, last_boxed, last_number
from ..rewards import compute_rewards, correctness_reward
from ..fast_sampler import use_static_cache
from ..rollout import generate_rollouts, sampling_kwargs
from ..tasks import DatasetUnavailableError, gsm8k_rows, load_gsm8k, train_test_split_arithmetic
from ..run import dataset_fingerprint, disk_errors, find_checkpoint, read_meta
from ..run.disk import write_durably
from ..presets import get_preset
from ..trainer import GRPOConfig, GRPOTrainer

__all__ = [
    "COMPILE_SLOWDOWN",
    "EVAL_FILES",
    "GPU_PEAKS",
    "GSM8K_EVAL_SIZE",
    "GSM8K_FULL_PRESET",
    "GSM8K_PRESET",
    "GSM8K_REWARDS",
    "GSM8K_STEPS",
    "GSM8K_TEST_SIZE",
    "HOST_SLOWDOWN",
    "MissingMeasurement",
    "NON_REENTRANT",
    "PROBE_TRUNCATED_LIMIT",
    "PROBE_ZERO_STD_LIMIT",
    "SAMPLER_LABELS",
    "SCORERS",
    "SETUP_MINUTES",
    "T4_BANDWIDTH",
    "T4_CAP_BYTES",
    "T4_CONTEXT_BYTES",
    "T4_FP32_FLOPS",
    "T4_TOTAL_BYTES",
    "boxed_reward",
    "chapter9_estimate",
    "compare_scores",
    "enable_gradient_checkpointing",
    "estimate_step_seconds",
    "forward_flops_per_token",
    "gpu_sampler",
    "gsm8k_data",
    "gsm8k_run",
    "lenient_correct",
    "lora_trainable_params",
    "measured_mode",
    "measured_sampler",
    "measured_samplers",
    "probe_advice",
    "probe_groups",
    "published_peaks",
    "read_gsm8k_jsonl",
    "sampler_name",
    "score_evaluation",
    "score_lines",
    "session_estimate",
    "smollm2_cpu_data",
    "step_mode",
    "strict_correct",
    "t4_memory_estimate",
    "t4_run_estimate",
    "t4_step_estimate",
]

#: The preset of chapter 9's GPU run: LoRA adapters on Qwen2.5-0.5B-Instruct.
GSM8K_PRESET = "qwen2.5-0.5b-colab-t4"
#: The same run with every weight trained (``use_peft=False``): the switch chapter 9 offers.
GSM8K_FULL_PRESET = "qwen2.5-0.5b-colab-t4-full"
#: Problems in GSM8K's test split.
GSM8K_TEST_SIZE = 1319
#: The held-out problems chapter 9's GPU run evaluates, before and after: the first 500 of the test split (issue
#: 43: all 1,319 took two evaluations of up to 13 minutes each by the measured LoRA step, time the run now trains).
GSM8K_EVAL_SIZE = 500
#: The GPU run's steps: what fits, with both evaluations, in an hour on a T4 by the measured eager LoRA sampler
#: (:func:`session_estimate`; 40 before issue 43, whose first measured LoRA step put 40 at up to 113 minutes).
GSM8K_STEPS = 20


def smollm2_cpu_data(n_train: int = 2000, n_test: int = 200, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """The CPU run's data: one-digit ``+``, ``-`` and ``*`` questions (``"What is 7 * 3?"``).

    There are 300 such problems. ``n_test`` distinct ones are held out; the
    ``n_train`` training rows are drawn, with repeats, from the others only. The
    committed run (``benchmarks/smollm2_run.py``) and chapter 9 both call this.
    """
    return train_test_split_arithmetic(n_train, n_test, seed, op=["+", "-", "*"], digits=1, style="question")


def boxed_reward(completions: Sequence, **kwargs: Any) -> list[float]:
    """1.0 when a completion puts a number in a ``\\boxed{...}``, whatever the number; else 0.0.

    The format part of chapter 9's GPU reward: with weight 0.1 beside
    ``correctness_reward`` (weight 1), a boxed wrong answer earns 0.1 and an
    answer the extractor has to guess (the last number of the text) earns no
    format credit. ReFT's partial reward for GSM8K (Luong et al., 2024) is the
    same idea: 1 for a right answer, 0.1 for a wrong one whose answer can be
    read, 0 for none. (verl's GSM8K scorer, ``verl/utils/reward_score/gsm8k.py``,
    has the same knob, ``format_score``, and sets it to 0 by default.)
    """
    return [1.0 if (b := last_boxed(completion_to_text(c))) is not None and last_number(b) is not None else 0.0
            for c in completions]


#: The GPU run's reward functions; the preset's ``reward_weights`` are (1.0, 0.1).
GSM8K_REWARDS = (correctness_reward, boxed_reward)

#: NVIDIA T4, published peak: 8.1 TFLOP/s in float32 (no tensor cores in fp32).
T4_FP32_FLOPS = 8.1e12
#: NVIDIA T4, published memory bandwidth: 320 GB/s (GDDR6).
T4_BANDWIDTH = 320e9
#: What PyTorch reports as a Colab T4's total memory (``torch.cuda.get_device_properties``;
#: "GPU 0 has a total capacity of 14.56 GiB" in its out-of-memory messages) ...
T4_TOTAL_BYTES = int(14.56 * 2**30)
#: ... less about half a GiB that the CUDA context takes there outside PyTorch's allocator.
T4_CONTEXT_BYTES = 2**30 // 2
#: What a T4 leaves PyTorch: the cap ``make gpu-proof`` puts on its allocator, and chapter 9's.
T4_CAP_BYTES = T4_TOTAL_BYTES - T4_CONTEXT_BYTES


# ---------------------------------------------------------------------------
# Scoring an evaluation two ways, and the probe before training
# ---------------------------------------------------------------------------


def strict_correct(completion: Any, answer: Any) -> bool:
    """Right by the strict scorer: the completion's last ``\\boxed{...}`` holds the reference answer.

    An unboxed answer is wrong here, however right its number: this scorer
    counts only what the system prompt asks for, so learning the format shows in it.
    """
    boxed = last_boxed(completion_to_text(completion))
    return boxed is not None and answers_match(extract_answer(f"\\boxed{{{boxed}}}"), answer)


def lenient_correct(completion: Any, answer: Any) -> bool:
    """Right by the lenient scorer: the answer ``extract_answer`` finds (the boxed one, else the last
    number of the text) equals the reference. This is the correctness reward's own judgement."""
    return answers_match(extract_answer(completion_to_text(completion)), answer)


#: The two scorers of chapter 9's evaluations, by name. Every strict hit is a lenient hit.
SCORERS: dict[str, Callable[[Any, Any], bool]] = {"strict": strict_correct, "lenient": lenient_correct}


def score_evaluation(result: dict) -> dict:
    """An evaluation (``trainer.evaluate``'s dict, or one read back from a run folder) scored both ways.

    Returns ``n``; for each scorer of :data:`SCORERS`, ``{"accuracy", "se",
    "correct"}`` (one flag per problem, in order, for a paired comparison);
    ``boxed`` (the share of completions with a ``\\boxed{}`` number) and
    ``truncated`` (the share cut off by the token budget), each with its
    standard error as ``boxed_se`` and ``truncated_se``.
    """
    records = result.get("records") if isinstance(result, dict) else None
    if not records:
        raise ValueError("score_evaluation needs an evaluation with its per-problem 'records' "
                         "(trainer.evaluate's result, or a stored eval_before.json / eval_after.json)")
    out: dict[str, Any] = {"n": len(records)}
    for name, scorer in SCORERS.items():
        correct = [bool(scorer(r["completion"], r["answer"])) for r in records]
        accuracy, se = accuracy_with_se(correct)
        out[name] = {"accuracy": accuracy, "se": se, "correct": correct}
    for key, flags in (("boxed", [bool(boxed_reward([r["completion"]])[0]) for r in records]),
                       ("truncated", [bool(r["truncated"]) for r in records])):
        out[key], out[f"{key}_se"] = accuracy_with_se(flags)
    return out


def compare_scores(before: dict, after: dict) -> dict:
    """Before against after, on the same problems, for each scorer: accuracies, their SEs, the paired gain and its SE.

    ``before`` and ``after`` are :func:`score_evaluation`'s dicts. Returns
    ``{scorer: {"before", "before_se", "after", "after_se", "gain", "gain_se"}}``
    for each of :data:`SCORERS`, plus ``"boxed"`` and ``"truncated"``:
    ``{"before", "after"}`` shares, and ``n``.
    """
    if before["n"] != after["n"]:
        raise ValueError(f"before and after scored {before['n']} and {after['n']} problems; compare the same problems")
    out: dict[str, Any] = {"n": before["n"]}
    for name in SCORERS:
        gain, gain_se = paired_gain(before[name]["correct"], after[name]["correct"])
        out[name] = {"before": before[name]["accuracy"], "before_se": before[name]["se"],
                     "after": after[name]["accuracy"], "after_se": after[name]["se"],
                     "gain": gain, "gain_se": gain_se}
    for key in ("boxed", "truncated"):
        out[key] = {"before": before[key], "after": after[key]}
    return out


def score_lines(comparison: dict) -> list[str]:
    """:func:`compare_scores`'s result as a small table, one line per scorer and share."""
    lines = [f"{'':<22}{'before':>14}{'after':>14}{'paired gain':>22}"]
    for name in SCORERS:
        c = comparison[name]
        z = f" ({c['gain'] / c['gain_se']:+.1f} SE)" if c["gain_se"] > 0 else ""  # no SE when nothing changed
        lines.append(f"{name + ' accuracy':<22}{c['before']:>8.3f} ±{c['before_se']:.3f}{c['after']:>8.3f} "
                     f"±{c['after_se']:.3f}{c['gain']:>+10.3f} ±{c['gain_se']:.3f}{z}")
    for key, label in (("boxed", "boxed share"), ("truncated", "truncated share")):
        lines.append(f"{label:<22}{comparison[key]['before']:>14.3f}{comparison[key]['after']:>14.3f}")
    lines.append(f"(n = {comparison['n']} problems; ± one standard error)")
    return lines


#: The probe's limits: above these shares, the probe says what to change before training.
PROBE_TRUNCATED_LIMIT = 0.25
PROBE_ZERO_STD_LIMIT = 0.5


def probe_groups(model: Any, tokenizer: Any, config: GRPOConfig, rows: Sequence[dict], *,
                 reward_fns: Callable | Sequence[Callable] | None = None, seed: int = 0) -> dict:
    """One training step's sampling, without the update: ``G`` completions for each of ``rows``, scored.

    It samples exactly as a step would (the config's group size, budget,
    temperature, system prompt, and on a GPU the static KV cache), in one
    ``generate`` call, and rewards each
    completion with ``reward_fns`` (default: :data:`GSM8K_REWARDS` when the
    config weighs two rewards, else ``correctness_reward``).

    Returns ``right`` (``[B][G]`` correctness flags), ``rewards`` (``[B][G]``
    weighted totals), ``zero_std`` (per group: all ``G`` rewards equal, so the
    group teaches nothing), ``frac_zero_std``, ``all_wrong`` and ``all_right``
    (the shares of groups with no right and with only right answers),
    ``frac_truncated``, ``completion_len_mean``, ``completions`` and ``seconds``.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("probe_groups needs at least one prompt/answer row")
    fns = _reward_fns(config, reward_fns)
    G = config.group_size
    start = time.perf_counter()
    rollout = generate_rollouts(model, tokenizer, [row["prompt"] for row in rows], **sampling_kwargs(
        config, generator_seed=seed, static_cache=use_static_cache(config, model)))  # as the run samples (a GPU: static)
    seconds = time.perf_counter() - start
    answers = [row["answer"] for row in rows for _ in range(G)]
    total, _ = compute_rewards(fns, config.reward_weights, rollout.prompts, rollout.completions, answers,
                               completion_ids=rollout.completion_id_lists())
    right = correctness_reward(rollout.completions, answer=answers)
    rewards = [[float(total[b * G + g]) for g in range(G)] for b in range(len(rows))]
    hits = [[bool(right[b * G + g]) for g in range(G)] for b in range(len(rows))]
    zero_std = [max(group) == min(group) for group in rewards]
    return {
        "right": hits,
        "rewards": rewards,
        "zero_std": zero_std,
        "frac_zero_std": sum(zero_std) / len(rows),
        "all_wrong": sum(not any(h) for h in hits) / len(rows),
        "all_right": sum(all(h) for h in hits) / len(rows),
        "frac_truncated": float(rollout.truncated.float().mean()),
        "completion_len_mean": float(rollout.completion_lengths.float().mean()),
        "completions": list(rollout.completions),
        "seconds": seconds,
    }


def probe_advice(probe: dict, config: GRPOConfig) -> tuple[bool, list[str]]:
    """What :func:`probe_groups` says about the session ahead: ``(fine, sentences)``.

    ``fine`` is False when more than :data:`PROBE_TRUNCATED_LIMIT` of the
    completions hit the budget (a cut-off answer earns no correctness reward
    and teaches only "be shorter"), or more than :data:`PROBE_ZERO_STD_LIMIT`
    of the groups have equal rewards (they teach nothing: the session would
    spend that share of its samples for no gradient). The sentences say what
    to change, in the config's own field names.
    """
    budget = config.max_new_tokens
    lines: list[str] = []
    truncated, zero = probe["frac_truncated"], probe["frac_zero_std"]
    if truncated > PROBE_TRUNCATED_LIMIT:
        lines.append(
            f"{truncated:.0%} of the completions hit max_new_tokens={budget} before they ended: a cut-off "
            f"answer earns no correctness reward, so that share of the session teaches only brevity. Raise "
            f"max_new_tokens (to about {2 * budget}: the time estimate grows with it), or ask for shorter "
            f"answers in the system prompt, and probe again.")
    if zero > PROBE_ZERO_STD_LIMIT:
        if probe["all_wrong"] >= probe["all_right"]:
            lines.append(
                f"{zero:.0%} of the groups gave all {config.group_size} completions the same reward, mostly all "
                "wrong: the task is too hard for this model as posed. Give it more room (max_new_tokens), more "
                "tries per problem (group_size), or easier problems, and probe again.")
        else:
            lines.append(
                f"{zero:.0%} of the groups gave all {config.group_size} completions the same reward, mostly all "
                "right: the problems are too easy to teach anything. Train on harder ones, and probe again.")
    if lines:
        return False, lines
    return True, [f"{truncated:.0%} of the completions hit the budget of {budget} tokens and {zero:.0%} of the "
                  f"groups teach nothing (limits: {PROBE_TRUNCATED_LIMIT:.0%} and {PROBE_ZERO_STD_LIMIT:.0%}): "
                  "the settings give GRPO something to learn from."]


def _reward_fns(config: GRPOConfig, reward_fns: Callable | Sequence[Callable] | None) -> list[Callable]:
    """``reward_fns`` as a list; None: :data:`GSM8K_REWARDS` when the config weighs two rewards, else correctness alone."""
    if reward_fns is None:
        two = config.reward_weights is not None and len(config.reward_weights) == len(GSM8K_REWARDS)
        return list(GSM8K_REWARDS) if two else [correctness_reward]
    return [reward_fns] if callable(reward_fns) else list(reward_fns)


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def read_gsm8k_jsonl(path: str | os.PathLike) -> list[dict]:
    """Rows (``prompt``, ``answer``, ``solution``) from a GSM8K-format JSONL file.

    Each line is one ``{"question": ..., "answer": "... #### N"}`` object, as in
    the GSM8K release; the answer column becomes the number after ``####``
    (:func:`~grpo_tutorial.tasks.gsm8k_rows`).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GSM8K file at {str(path)!r}; expected a JSONL file with question/answer lines")
    records = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{str(path)!r} line {number} is not JSON ({err.msg}); expected one object a line") from None
    if not records:
        raise ValueError(f"{str(path)!r} holds no GSM8K records")
    return gsm8k_rows(records)


def gsm8k_data(n_eval: int | None = None, *, seed: int = 0, timeout: float = 3.0) -> tuple[list[dict], list[dict], str]:
    """GSM8K's train split and its test problems (all 1,319, or the first ``n_eval``), or a stand-in offline.

    Returns ``(train_rows, eval_rows, source)``. ``source`` says which data it is:
    ``"gsm8k"``, or, when :func:`~grpo_tutorial.tasks.load_gsm8k` raises
    :class:`~grpo_tutorial.tasks.DatasetUnavailableError` (offline, the hub
    unreachable, or an HTTP error status, a refused connection or a timeout
    during the download), a sentence naming the fallback (two-digit ``+``, ``-``,
    ``*`` questions, 5,000 to train on and ``n_eval`` held out (None: as
    many as GSM8K's test set), split by ``seed``) and the reason, which is
    also printed.
    """
    if n_eval is not None:
        check_int(None, "n_eval", n_eval, 1)
    try:
        train_rows, eval_rows = load_gsm8k("train", timeout=timeout), load_gsm8k("test", timeout=timeout)
    except DatasetUnavailableError as err:
        train_rows, eval_rows = train_test_split_arithmetic(
            5000, GSM8K_TEST_SIZE if n_eval is None else n_eval, seed, op=["+", "-", "*"], digits=2, style="question"
        )
        source = f"generated two-digit arithmetic (GSM8K unavailable: {err})"
        print(f"gsm8k_data: falling back to {source}", flush=True)
        return train_rows, eval_rows, source
    return train_rows, eval_rows[:n_eval] if n_eval is not None else eval_rows, "gsm8k"


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


#: The held-out evaluations gsm8k_run stores in its output directory, to read back on resume.
EVAL_FILES = {"before": "eval_before.json", "after": "eval_after.json"}
#: The config fields that decide what an evaluation sees (a stored one is reused only if they match).
_EVAL_FIELDS = ("system_prompt", "use_chat_template", "max_new_tokens", "reward_weights")


def gsm8k_run(
    model: Any,
    tokenizer: Any,
    preset: str | GRPOConfig = GSM8K_PRESET,
    train_rows: Sequence[dict] = (),
    eval_rows: Sequence[dict] = (),
    steps: int = 100,
    *,
    reward_fns: Callable | Sequence[Callable] | None = None,
    gradient_checkpointing: bool = True,
    progress: bool | None = None,
    output_dir: str | os.PathLike | None = None,
    resume: bool = False,
    **overrides: Any,
) -> dict:
    """Chapter 9's GPU run: evaluate, train to ``steps`` GRPO steps, evaluate again; resumable.

    Args:
        model, tokenizer: a loaded chat model in float32 (``load_policy(name,
            dtype="float32")``; 16-bit weights do not take updates of size lr,
            chapter 9.3) and its tokenizer. The trainer uses the tokenizer's chat
            template when it has one, with the preset's system prompt; the
            evaluations use exactly what training uses (``trainer.evaluate``).
        preset: a preset name (:func:`~grpo_tutorial.presets.get_preset`) or a
            ready :class:`~grpo_tutorial.trainer.GRPOConfig`.
        train_rows, eval_rows: ``prompt``/``answer`` rows, e.g. from
            :func:`gsm8k_data` or :func:`read_gsm8k_jsonl`. ``eval_rows`` may be
            empty: then nothing is evaluated.
        steps: the total number of GRPO steps to reach (a resumed run continues
            from its checkpoint to the same total).
        reward_fns: the reward. None (default): :data:`GSM8K_REWARDS`
            (``correctness_reward``, 1 when the number ``extract_answer`` finds
            equals the row's answer, and :func:`boxed_reward`) when the config
            has two ``reward_weights``, else ``correctness_reward`` alone.
        gradient_checkpointing: recompute each layer's activations in the
            backward pass instead of storing them (less memory, one more forward).
            Needs a transformers model (``gradient_checkpointing_enable``); it
            stays on after the run.
        progress: the trainer's tqdm bar (the step's reward in its postfix).
            None (default): on when the model is on a GPU, where a step takes
            seconds to minutes; the CPU dry run prints its own lines.
        output_dir: where the trainer writes ``history.jsonl`` and its
            checkpoint (every ``checkpoint_every`` steps and at the end), and
            where the evaluations go (:data:`EVAL_FILES`). None: nothing is
            written and nothing can be resumed.
        resume: continue the run in ``output_dir``: the model, optimizer, data
            position and random state come from its checkpoint, the history is
            cut to the checkpoint's step and training goes on to ``steps``, so
            the history equals an uninterrupted run's (timings aside). The
            'before' evaluation is read back from ``output_dir``, not repeated
            (the model in memory is no longer the untrained one).
        overrides: ``GRPOConfig`` fields to change in a named preset.

    Returns:
        ``config``, ``history`` (one row per step), ``before`` and ``after``
        (:meth:`GRPOTrainer.evaluate <grpo_tutorial.trainer.GRPOTrainer.evaluate>`'s
        dicts, or None without ``eval_rows``), ``gain`` and ``gain_se`` (paired;
        NaN without ``eval_rows``), ``train_seconds`` (this call's),
        ``scores`` (:func:`compare_scores` of the two evaluations: the strict
        and the lenient scorer's accuracies and paired gains, the boxed and
        truncated shares; None without ``eval_rows``),
        ``resumed_from`` (the step the checkpoint held; 0 for a fresh run),
        ``before_from`` (the file the 'before' evaluation was read from, or None
        when it was computed now), ``after_from`` (likewise for 'after', read
        back when the run had already reached ``steps``: a finished run is not
        trained or evaluated again) and ``trainer``.
    """
    if isinstance(preset, GRPOConfig):
        if overrides:
            raise ValueError(f"overrides {sorted(overrides)} need a preset name; change a GRPOConfig with dataclasses.replace")
        config = preset
    else:
        config = get_preset(preset, **overrides)
    check_int(None, "steps", steps, 1)
    check_flag(None, "resume", resume)
    if output_dir is not None:
        config = dataclasses.replace(config, output_dir=os.fspath(output_dir))
    if resume and config.output_dir is None:
        raise ValueError("resume=True needs output_dir (the folder of the run to continue)")
    if config.output_dir is not None and not config.checkpoint_every:
        raise ValueError(
            f"output_dir={config.output_dir!r} with checkpoint_every={config.checkpoint_every!r} saves no "
            "checkpoint, so an interrupted run could not be resumed; pass checkpoint_every=N (e.g. 1 for a "
            "short run, the preset's value for the GPU run)"
        )
    train_rows, eval_rows = list(train_rows), list(eval_rows)
    if not train_rows:
        raise ValueError("train_rows is empty; pass prompt/answer rows, e.g. from gsm8k_data()")
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if progress is None:
        progress = _on_gpu(model)
    out = Path(config.output_dir) if config.output_dir is not None else None
    trainer = GRPOTrainer(model, tokenizer, _reward_fns(config, reward_fns), config)

    before, before_from = None, None
    if eval_rows:
        stored = _read_eval(out, "before", eval_rows, config) if resume else None
        if stored is not None:
            before, before_from = stored, str(out / EVAL_FILES["before"])
        elif resume and find_checkpoint(out) is not None:
            raise FileNotFoundError(
                f"resume=True: {str(out)!r} holds a checkpoint but no matching {EVAL_FILES['before']} (written "
                "before training by gsm8k_run, for the same eval_rows and prompt settings); the model in "
                "memory is no longer the untrained one, so the 'before' evaluation cannot be made now"
            )
        else:
            before = trainer.evaluate(eval_rows)
            _write_eval(out, "before", before, eval_rows, config)
    checkpoint = find_checkpoint(out) if resume else None
    resumed_from = int(read_meta(checkpoint)["step"]) if checkpoint is not None else 0
    if resumed_from >= steps:
        print(f"gsm8k_run: the run in {str(out)!r} already reached step {resumed_from} (of {steps}); nothing to "
              "train. To start another run, use a new output_dir.", flush=True)
    start = time.perf_counter()
    history = trainer.train(train_rows, steps, resume=resume, progress=progress)
    train_seconds = time.perf_counter() - start
    after, after_from = None, None
    if eval_rows:
        stored = _read_eval(out, "after", eval_rows, config) if resumed_from >= steps else None
        if stored is not None:  # a finished run: its evaluation is read back, not repeated
            after, after_from = stored, str(out / EVAL_FILES["after"])
        else:
            after = trainer.evaluate(eval_rows)
            _write_eval(out, "after", after, eval_rows, config)
    gain, gain_se = paired_gain(before["correct"], after["correct"]) if eval_rows else (float("nan"), float("nan"))
    scores = compare_scores(score_evaluation(before), score_evaluation(after)) if eval_rows else None
    return {
        "scores": scores,
        "config": config,
        "history": history,
        "before": before,
        "after": after,
        "gain": gain,
        "gain_se": gain_se,
        "train_seconds": train_seconds,
        "resumed_from": resumed_from,
        "before_from": before_from,
        "after_from": after_from,
        "trainer": trainer,
    }


def enable_gradient_checkpointing(model: Any) -> None:
    """Recompute each layer's activations in the backward pass (train mode only), as chapter 9's GPU run does.

    Generation runs in eval mode and keeps its KV cache. ``benchmarks/gpu_proof.py``
    measures the GPU run's step with it.
    """
    # transformers 5 renamed it (the old name warns); Colab may have either. Non-reentrant
    # checkpointing, asked for by name: transformers 4's default (reentrant) gives no gradient
    # to LoRA adapters inside a checkpointed layer when the layer's input needs none (the
    # frozen embeddings), unless someone remembered enable_input_require_grads().
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=NON_REENTRANT)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=NON_REENTRANT)
    else:
        raise TypeError(
            f"gradient_checkpointing=True needs a transformers model with gradient_checkpointing_enable(); "
            f"got {type(model).__name__} (pass gradient_checkpointing=False)"
        )


#: The checkpointing torch recommends, and the one that gives LoRA adapters their gradients behind frozen layers.
NON_REENTRANT = {"use_reentrant": False}


def _on_gpu(model: Any) -> bool:
    return any(p.is_cuda for p in model.parameters())


def _eval_key(eval_rows: Sequence[dict], config: GRPOConfig) -> dict:
    """What a stored evaluation must match to be reused: the problems and the prompt settings."""
    return {"eval_rows": dataset_fingerprint(eval_rows), **{k: getattr(config, k) for k in _EVAL_FIELDS}}


def _write_eval(out: Path | None, which: str, result: dict, eval_rows: Sequence[dict], config: GRPOConfig) -> None:
    if out is None:
        return
    record = {"key": _eval_key(eval_rows, config), "result": {k: v for k, v in result.items() if k != "samples"}}
    path = out / EVAL_FILES[which]
    tmp = path.with_name(path.name + ".tmp")
    with disk_errors(tmp, out):
        out.mkdir(parents=True, exist_ok=True)
        write_durably(tmp, (json.dumps(record, indent=1) + "\n").encode("utf-8"))
        os.replace(tmp, path)


def _read_eval(out: Path | None, which: str, eval_rows: Sequence[dict], config: GRPOConfig) -> dict | None:
    """The stored evaluation, if it was made on these problems with these prompt settings."""
    path = None if out is None else out / EVAL_FILES[which]
    if path is None or not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    if record.get("key") != json.loads(json.dumps(_eval_key(eval_rows, config))):
        return None
    result = record["result"]
    result["samples"] = [
        {"prompt": r["prompt"], "completion": r["completion"], "answer": r["answer"]} for r in result["records"][:3]
    ]
    return result


# ---------------------------------------------------------------------------
# How long a step takes on a GPU: a roofline estimate
# ---------------------------------------------------------------------------


def forward_flops_per_token(num_params: int, vocab_size: int, hidden_size: int, *, tied_embeddings: bool) -> int:
    """FLOPs of one token's forward pass: 2 per weight that takes part in a matrix product.

    Every weight does, except the input embedding, which is a table lookup. A
    model with tied embeddings uses that same matrix again as its output layer,
    so all ``num_params`` count; an untied one has a separate output matrix
    (already in ``num_params``) and the lookup table does not count. Attention's
    own products (scores and weighted values, which grow with the context) and
    the norms are left out: for Qwen2.5-0.5B at 400 tokens they add about 3%.

    >>> forward_flops_per_token(100, 10, 2, tied_embeddings=True)
    200
    >>> forward_flops_per_token(100, 10, 2, tied_embeddings=False)
    160
    """
    check_int(None, "num_params", num_params, 1)
    check_int(None, "vocab_size", vocab_size, 1)
    check_int(None, "hidden_size", hidden_size, 1)
    if not isinstance(tied_embeddings, bool):
        raise TypeError(f"tied_embeddings must be a bool, got {tied_embeddings!r}")
    matmul_params = num_params if tied_embeddings else num_params - vocab_size * hidden_size
    if matmul_params < 1:
        raise ValueError(
            f"num_params={num_params} is not more than the embedding table vocab_size*hidden_size="
            f"{vocab_size * hidden_size}; check the numbers"
        )
    return 2 * matmul_params


def estimate_step_seconds(
    *,
    num_params: int,
    vocab_size: int,
    hidden_size: int,
    tied_embeddings: bool,
    prompts: int,
    group_size: int,
    prompt_tokens: int,
    completion_tokens: int,
    num_iterations: int = 1,
    minibatches: int = 1,
    gradient_checkpointing: bool = True,
    reference_model: bool = False,
    share_prompt_cache: bool = True,
    lora: bool = False,
    weight_bytes: int = 4,
    peak_flops: float = T4_FP32_FLOPS,
    bandwidth: float = T4_BANDWIDTH,
) -> dict[str, float]:
    """A roofline estimate of one GRPO step's seconds on a GPU (a lower bound), pass by pass as the trainer runs them.

    The forward FLOPs per token split into the *body* (every matrix product but
    the output layer: ``2 * (num_params - V*H)``, or ``- 2*V*H`` untied) and the
    *head* (the output layer, ``2*V*H``), because the trainer runs them over
    different positions. With ``B`` prompts, ``R = B * G`` rows, ``P`` prompt
    and ``C`` completion tokens per row (every row padded to the longest
    completion, so ``C`` is the budget in the worst case) and ``W =
    num_params * weight_bytes`` bytes of weights:

    - **generation** (:func:`~grpo_tutorial.rollout.generate_rollouts`): each
      distinct prompt is encoded once (the body over ``B * (P - 1)`` tokens, the
      head at one position), then ``C`` decoding forwards of one token for each
      of the ``R`` rows. Each forward reads all weights once, so it takes
      ``max(FLOPs / peak_flops, W / bandwidth)``: decoding a few dozen rows is
      limited by memory, not arithmetic.
    - **training** (compute-bound): each of the ``num_iterations * minibatches``
      updates runs a forward over its rows (the body over prompt and completion,
      the head only at the ``C + 1`` completion positions the scorer keeps), a
      backward of twice its FLOPs and, with gradient checkpointing, the body's
      forward once more. An off-policy step (more than one update) first scores
      the old policy in a no-grad forward; a reference model (``beta > 0``) adds
      one more. An on-policy step (one update) has no old-policy pass: its old
      log-probs are the gradient pass's own. With ``share_prompt_cache`` a
      pass encodes each prompt once instead of ``G`` times (a lower bound: a
      pass split into shuffled micro-batches encodes the prompts present in
      each), except the gradient passes under checkpointing, which fall back to
      full rows (the no-grad passes run in eval mode and still share).
      With ``lora`` the weights are frozen (LoRA adapters train instead): the
      backward computes the gradients of the activations only, one forward's
      FLOPs instead of two (the adapters' own small products are left out).

    It assumes every unit runs at its peak, and leaves out the per-token overhead
    of a generate loop, the KV-cache reads, attention's own products and the
    optimizer; real steps are slower, and where the time goes in a real step
    (Python's loop around each generated token, kernel launches) is not in it.

    Returns ``generate_flops``, ``train_flops``, ``generate_seconds``,
    ``train_seconds``, ``seconds`` (their sum), and the token counts behind
    them: ``generate_body_tokens``, ``generate_head_tokens``,
    ``train_body_tokens``, ``train_head_tokens`` (forward positions, summed over
    the step's passes, a backward counted once as its forward),
    ``train_recomputed_tokens`` and ``passes`` (the forward passes over the
    batch: ``"old"``, ``"reference"``, ``"update"``).
    """
    f = forward_flops_per_token(num_params, vocab_size, hidden_size, tied_embeddings=tied_embeddings)
    for name, value in (
        ("prompts", prompts),
        ("group_size", group_size),
        ("prompt_tokens", prompt_tokens),
        ("completion_tokens", completion_tokens),
        ("num_iterations", num_iterations),
        ("minibatches", minibatches),
        ("weight_bytes", weight_bytes),
    ):
        check_int(None, name, value, 1)
    for name, value in (
        ("gradient_checkpointing", gradient_checkpointing),
        ("reference_model", reference_model),
        ("share_prompt_cache", share_prompt_cache),
        ("lora", lora),
    ):
        check_flag(None, name, value)
    peak = check_number(None, "peak_flops", peak_flops, lambda v: v > 0, "a positive number")
    bw = check_number(None, "bandwidth", bandwidth, lambda v: v > 0, "a positive number")

    head = 2 * vocab_size * hidden_size  # the output layer, per position
    body = f - head  # everything else, per token
    B, R, P, C = prompts, prompts * group_size, prompt_tokens, completion_tokens
    weight_read = num_params * weight_bytes / bw  # seconds to stream the weights once

    # generation: the prompts once (all but their last token), then C one-token forwards of R rows
    prefill_body, prefill_head = B * (P - 1), B
    prefill_flops = body * prefill_body + head * prefill_head
    decode_flops = (body + head) * R
    generate_seconds = max(prefill_flops / peak, weight_read) + C * max(decode_flops / peak, weight_read)
    generate_flops = prefill_flops + C * decode_flops

    def scoring_pass(shared: bool) -> tuple[int, int]:
        """(body tokens, head positions) of one pass over all R rows, as completion_logprobs runs it."""
        if shared and C > 1:  # prompts once (head at their last position), then C - 1 completion tokens per row
            return B * P + R * (C - 1), B + R * (C - 1)
        return R * (P + C), R * (C + 1)  # full rows; the head keeps C + 1 positions

    updates = num_iterations * minibatches
    passes = {"old": int(updates > 1), "reference": int(reference_model), "update": num_iterations}
    eval_body, eval_head = scoring_pass(share_prompt_cache)  # no-grad passes run in eval mode
    grad_body, grad_head = scoring_pass(share_prompt_cache and not gradient_checkpointing)
    no_grad_passes = passes["old"] + passes["reference"]
    recomputed = num_iterations * grad_body if gradient_checkpointing else 0
    train_body = no_grad_passes * eval_body + num_iterations * grad_body
    train_head = no_grad_passes * eval_head + num_iterations * grad_head
    train_flops = (
        no_grad_passes * (body * eval_body + head * eval_head)
        # forward + backward: 2x the forward (activations and weights), or 1x with frozen weights (LoRA)
        + num_iterations * (2 if lora else 3) * (body * grad_body + head * grad_head)
        + body * recomputed  # checkpointing: the layers' forward again during the backward
    )
    train_seconds = train_flops / peak
    return {
        "generate_flops": float(generate_flops),
        "train_flops": float(train_flops),
        "generate_seconds": generate_seconds,
        "train_seconds": train_seconds,
        "seconds": generate_seconds + train_seconds,
        "generate_body_tokens": prefill_body + C * R,
        "generate_head_tokens": prefill_head + C * R,
        "train_body_tokens": train_body,
        "train_head_tokens": train_head,
        "train_recomputed_tokens": recomputed,
        "passes": passes,
    }


# ---------------------------------------------------------------------------
# A step measured on another GPU, scaled to a T4
# ---------------------------------------------------------------------------

#: Published peaks of GPUs that ``make gpu-proof`` may run on: (name as CUDA reports it
#: contains this, float32 FLOP/s without tensor cores, memory bandwidth in bytes/s), from
#: NVIDIA's data sheets. The first match wins, so "H100 PCIe" comes before "H100" (SXM5, HBM3).
GPU_PEAKS = (
    ("H100 PCIe", 51.2e12, 2.0e12),
    ("H100", 66.9e12, 3.35e12),
    ("H200", 66.9e12, 4.8e12),
    ("A100", 19.5e12, 2.039e12),
    ("L4", 30.3e12, 300e9),
    ("T4", T4_FP32_FLOPS, T4_BANDWIDTH),
)

def published_peaks(device_name: str) -> tuple[float, float]:
    """``(float32 FLOP/s, bytes/s)`` of the GPU named ``device_name`` (:data:`GPU_PEAKS`).

    >>> published_peaks("Tesla T4") == (T4_FP32_FLOPS, T4_BANDWIDTH)
    True
    """
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a str, got {type(device_name).__name__}")
    for key, flops, bandwidth in GPU_PEAKS:
        if key in device_name:
            return flops, bandwidth
    raise ValueError(f"no published peaks for {device_name!r}; known: {[key for key, _, _ in GPU_PEAKS]}")


# ---------------------------------------------------------------------------
# What an estimate reads: the mode and the sampler the config runs
# ---------------------------------------------------------------------------

#: How ``make gpu-proof`` names what generates a rollout, by the model that samples: ``plain`` (every weight
#: trained, or LoRA's adapters merged into a copy: a plain float32 model), ``lora`` (the PEFT model, adapters
#: unmerged), ``float16`` (the float16 sampler copy); ``_static`` with the static KV cache, compiled on CUDA.
SAMPLER_LABELS = {
    "plain": "float32, dynamic cache (every weight trained, or LoRA merged into a copy)",
    "lora": "float32, LoRA adapters unmerged, dynamic cache (every sampler before issue 43)",
    "plain_static": "float32, static cache compiled (LoRA merged into a copy): the GPU default",
    "lora_static": "float32, LoRA unmerged, static cache compiled",
    "float16": "float16 copy, dynamic cache",
    "float16_static": "float16 copy, static cache compiled",
}


class MissingMeasurement(ValueError):
    """The GPU record lacks what an estimate needs (the config's mode, or its sampler): the estimate refuses.

    It never borrows another mode's or another sampler's numbers; the message names
    what is missing and what the record has.
    """


def step_mode(config: GRPOConfig) -> str:
    """The record's mode for ``config``: ``"lora"`` with ``use_peft``, else ``"full"``."""
    return "lora" if config.use_peft else "full"


def sampler_name(config: GRPOConfig, on_gpu: bool) -> str:
    """The name (:data:`SAMPLER_LABELS`) of what ``config`` samples with, on a CUDA GPU or not.

    ``merge_adapters_for_sampling`` and ``static_cache`` of None are on on a GPU
    only (:mod:`grpo_tutorial.fast_sampler`). A sampler copy of chapter 15 other
    than float16 is named by ``GRPOConfig.sampler`` itself.

    >>> sampler_name(GRPOConfig(use_peft=True), on_gpu=True), sampler_name(GRPOConfig(use_peft=True), on_gpu=False)
    ('plain_static', 'lora')
    """
    if config.sampler not in ("policy", "float16"):
        return config.sampler
    merge = on_gpu if config.merge_adapters_for_sampling is None else config.merge_adapters_for_sampling
    static = on_gpu if config.static_cache is None else config.static_cache
    kind = "float16" if config.sampler == "float16" else "lora" if config.use_peft and not merge else "plain"
    return kind + ("_static" if static else "")


def gpu_sampler(config: GRPOConfig) -> str:
    """The name (:data:`SAMPLER_LABELS`) of what ``config`` samples with on a CUDA GPU (:func:`sampler_name`).

    The LoRA preset's is ``"plain_static"``: the adapters merged into a copy, the static cache.

    >>> gpu_sampler(GRPOConfig(use_peft=True, static_cache=False, merge_adapters_for_sampling=False))
    'lora'
    """
    name = sampler_name(config, on_gpu=True)
    if name not in SAMPLER_LABELS:
        raise ValueError(f"GRPOConfig.sampler={config.sampler!r}: the T4 estimates know the policy's own sampling and "
                         "the float16 copy; estimate with sampler='policy'")
    return name


def measured_mode(record: dict, config: GRPOConfig) -> dict:
    """The record's measured step for ``config``'s mode (:func:`step_mode`), or :class:`MissingMeasurement`.

    A dry run (made on a CPU) measured no GPU, and a mode that is absent or was not
    measured (a record made before LoRA could be measured, an out-of-memory step)
    cannot stand for the other one: a LoRA step samples and trains at other speeds.
    """
    mode, made = step_mode(config), f"made at {str(record.get('package_commit'))[:10]} on {record['device']['name']}"
    if record.get("dry_run") or record["device"].get("type") != "cuda":
        raise MissingMeasurement(f"the GPU record ({made}) is a dry run on a CPU: it measured no GPU step to scale to a "
                                 "T4. Run `make gpu-proof` on a CUDA GPU")
    entry = record["qwen_step"]["modes"].get(mode)
    status = "absent" if entry is None else entry.get("status")
    if status != "measured":
        error = f": {entry['error']}" if entry and entry.get("error") else ""
        raise MissingMeasurement(
            f"the GPU record ({made}) has no measured {mode!r} step (status {status!r}{error}), and the estimate of a "
            f"{'LoRA' if mode == 'lora' else 'full fine-tuning'} run reads that mode only, never another's. Run "
            "`make gpu-proof` on a CUDA GPU to measure it")
    return entry


def measured_sampler(record: dict, config: GRPOConfig) -> str:
    """The sampler the record's step of ``config``'s mode was measured with: its own ``sampler`` field, or, in a
    record made before issue 43 (none), the only one there was: ``"lora"`` for LoRA, ``"plain"`` otherwise."""
    entry = measured_mode(record, config)
    return entry.get("sampler") or ("lora" if step_mode(config) == "lora" else "plain")


def measured_samplers(record: dict) -> list[str]:
    """Every sampler name the record has a measurement of (its modes' steps and its sampler table)."""
    names = [entry.get("sampler") or ("lora" if mode == "lora" else "plain")
             for mode, entry in record["qwen_step"]["modes"].items() if entry.get("status") == "measured"]
    names += [name for name, m in record["qwen_step"].get("samplers", {}).items()
              if m.get("status") == "measured" and name in SAMPLER_LABELS]
    return list(dict.fromkeys(names))


def _generation_source(record: dict, config: GRPOConfig, sampler: str | None, prefix: str = "") -> dict:
    """Where an estimate's generation comes from: the mode's own step, or the record's sampler table.

    Returns ``seconds`` for ``tokens`` new tokens of ``prompts`` x ``group_size`` rows, ``compile_seconds`` (a
    static sampler's first call at a new shape, less a later call's), ``weight_bytes`` and ``source``.
    """
    entry, shapes = measured_mode(record, config), record["qwen_step"]["shapes"]
    name = gpu_sampler(config) if sampler is None else sampler
    if name not in SAMPLER_LABELS:
        raise ValueError(f"sampler={name!r} is not a sampler name; expected one of {list(SAMPLER_LABELS)}")
    weight_bytes = 2 if name.startswith("float16") else 4
    if not prefix and name == measured_sampler(record, config):
        step = entry["step"]
        generation = step["stages"]["generation"]["seconds"]
        warm = entry.get("warmup_step", {}).get("stages", {}).get("generation", {}).get("seconds", generation)
        return {"name": name, "seconds": generation, "tokens": round(step["completion_tokens_mean"]),
                "prompts": shapes["prompts"], "group_size": shapes["group_size"], "weight_bytes": weight_bytes,
                "compile_seconds": max(0.0, warm - generation) if name.endswith("_static") else 0.0,
                "source": f"the {step_mode(config)!r} step"}
    table = record["qwen_step"].get("samplers", {})  # issue 43's sampler table; absent in older records
    measured = table.get(prefix + name, {})
    if measured.get("status") != "measured":
        raise MissingMeasurement(
            f"the GPU record measured no {prefix + name!r} sampler ({SAMPLER_LABELS[name]}), which this estimate needs "
            f"({'GRPOConfig.sampler and the fast-sampler settings' if sampler is None else 'sampler='}); it has "
            f"{measured_samplers(record)}. Estimate with one of those (sampler=...), or run `make gpu-proof` on a GPU")
    return {"name": name, "seconds": measured["ms_per_step"]["median"] / 1000 * measured["new_tokens"],
            "tokens": measured["new_tokens"], "prompts": measured["prompts"], "group_size": measured["group_size"],
            "weight_bytes": weight_bytes, "compile_seconds": measured["compile_seconds"] or 0.0,
            "source": f"the record's {prefix + name!r} sampler"}


def t4_step_estimate(record: dict, mode: str = "full") -> dict:
    """An ESTIMATE of the GPU preset's step on a T4, from the step of ``mode`` measured on another GPU.

    ``record`` is ``make gpu-proof``'s (``read_data("gpu_proof.json")``), ``mode``
    ``"full"`` or ``"lora"`` (:class:`MissingMeasurement` when it was not measured). For each
    phase, generation and training (the scoring forward and the backward), the
    roofline of :func:`estimate_step_seconds` is computed for the GPU that
    measured it (its :func:`published_peaks`) and for a T4, at the measured
    shapes; the measured seconds over the first say how close that GPU came to
    its bound (``share_of_bound``). Two figures for the T4:

    - ``t4_scaled``: the measured seconds times the ratio of the two rooflines,
      as if the T4 reached the same share of its bound. Where the measuring GPU
      was far below its bound (a small model's generation waits on Python and
      kernel launches, which a T4 does not do faster), this overstates the T4.
    - ``t4_low``: the larger of the measured seconds (a T4 is slower at
      everything a step does, on a host that is no faster) and the T4's roofline.

    The reward (on the CPU) is taken as measured, the optimizer step (memory-bound)
    scaled by the bandwidths. Returns ``phases`` ({phase: the figures above, with
    ``measured``, ``bound_here`` and ``t4_bound``}), ``other`` (reward and optimizer
    on the T4), ``step_scaled`` and ``step_low``.
    """
    if mode not in ("full", "lora"):
        raise ValueError(f"mode must be 'full' or 'lora', got {mode!r}")
    entry = measured_mode(record, GRPOConfig(use_peft=mode == "lora"))
    arch, shapes = record["qwen_step"]["model"]["architecture"], record["qwen_step"]["shapes"]
    stages = {name: stage["seconds"] for name, stage in entry["step"]["stages"].items()}
    here_flops, here_bandwidth = published_peaks(record["device"]["name"])
    shape = dict(
        num_params=record["qwen_step"]["model"]["parameters"], vocab_size=arch["vocab_size"],
        hidden_size=arch["hidden_size"], tied_embeddings=arch["tie_word_embeddings"], prompts=shapes["prompts"],
        group_size=shapes["group_size"], prompt_tokens=shapes["prompt_tokens"],
        completion_tokens=round(entry["step"]["completion_tokens_mean"]), gradient_checkpointing=True,
        lora=mode == "lora",
    )
    here = estimate_step_seconds(**shape, peak_flops=here_flops, bandwidth=here_bandwidth)
    t4 = estimate_step_seconds(**shape)
    measured = {"generation": stages["generation"], "training": stages["scoring_forward"] + stages["backward"]}
    bounds = {"generation": "generate_seconds", "training": "train_seconds"}
    phases = {}
    for phase, seconds in measured.items():
        key = bounds[phase]
        phases[phase] = {
            "measured": seconds, "bound_here": here[key], "share_of_bound": here[key] / seconds,
            "t4_bound": t4[key], "t4_scaled": seconds * t4[key] / here[key], "t4_low": max(seconds, t4[key]),
        }
    other = stages["reward"] + stages["optimizer_step"] * here_bandwidth / T4_BANDWIDTH
    return {
        "phases": phases,
        "other": other,
        "step_scaled": other + sum(p["t4_scaled"] for p in phases.values()),
        "step_low": other + sum(p["t4_low"] for p in phases.values()),
    }


# ---------------------------------------------------------------------------
# Any configuration's session on a T4, from the same record
# ---------------------------------------------------------------------------

#: How many times slower than the measuring machine's the T4 session's host does the per-token work no FLOP
#: or byte count sees (Python's loop around each generated token, kernel launches): an ASSUMPTION, for the
#: high end of :func:`t4_run_estimate` (the low end takes 1: no slower).
HOST_SLOWDOWN = 2.0
#: How many times longer than on the measuring machine compiling a static cache's decoding step takes on Colab's
#: host (two virtual CPUs for inductor's compile workers): an ASSUMPTION, for the high end (the low end takes 1).
COMPILE_SLOWDOWN = 4.0


def lora_trainable_params(architecture: dict, rank: int) -> int:
    """LoRA's trained parameters on every linear layer of a Qwen2-style decoder: ``r * (in + out)`` per layer.

    Seven linear layers per block (``q, k, v, o`` and the MLP's ``gate, up,
    down``); PEFT's ``"all-linear"`` leaves out the output layer.
    """
    check_int(None, "rank", rank, 1)
    h, inter = architecture["hidden_size"], architecture["intermediate_size"]
    kv = architecture["num_key_value_heads"] * (h // architecture["num_attention_heads"])
    per_block = (h + h) + (h + kv) + (h + kv) + (h + h) + 2 * (h + inter) + (inter + h)
    return rank * per_block * architecture["num_hidden_layers"]


def t4_run_estimate(record: dict, config: GRPOConfig, *, prompt_tokens: int | None = None,
                    sampler: str | None = None) -> dict:
    """An ESTIMATE of ``config``'s step and of one evaluation batch on a T4, from the record's measured step.

    The record (``make gpu-proof``) measured a step of each mode, full fine-tuning
    and LoRA, at its own shapes on another GPU, and (since issue 43) each sampler
    on its own. The estimate reads the mode ``config`` trains (:func:`measured_mode`)
    and the sampler it generates with on a GPU (:func:`gpu_sampler`, or ``sampler``,
    a name of :data:`SAMPLER_LABELS`), and refuses (:class:`MissingMeasurement`)
    when the record lacks either. Each phase is carried over to ``config``'s
    shapes (prompts, group size, token budget, micro-batches, LoRA or not) and
    to a T4 with :func:`estimate_step_seconds` and one more piece each:

    - **generation** is split into the time its roofline explains and the rest:
      ``overhead_per_token = (measured - its bound there) / tokens``, the
      per-token work of Python and kernel launches that no FLOP count sees and
      that does not grow with the rows. A T4's generation of ``C`` tokens is
      ``C * overhead_per_token + the T4's bound`` at the low end, and
      ``C * overhead_per_token * HOST_SLOWDOWN + the T4's bound / share`` at the
      high end, where ``share`` is the share of its bound the measured training
      reached (arithmetic no more efficient than the measured). A float16
      sampler's bound reads 2 bytes a weight. The evaluation batch uses the
      record's evaluation measurement of the sampler where it has one.
    - **training** (arithmetic): the T4's bound at the low end (and no less than
      the measured phase carried to the new shapes on the measuring GPU), the
      bound over ``share`` at the high end.
    - the reward, scaled by the tokens generated, and the optimizer step, by
      the trainable weights and the two GPUs' bandwidths.
    - a static sampler's **compile**, once per new shape: the measured seconds at
      the low end, ``COMPILE_SLOWDOWN`` times them at the high end.

    Every completion is taken to run to the budget (the worst case; greedy
    answers that end sooner finish sooner when a whole batch has ended).

    Returns ``step`` (low, high), ``generation`` and ``training`` (low, high),
    ``other``, ``eval_batch`` (low, high: one evaluation batch of
    ``config.eval_batch_size`` problems, greedy), ``compile`` (low, high: seconds
    per compiled shape, 0 without a static cache), ``sampler`` (its name),
    ``source``, ``overhead_per_token``, ``share`` and ``trainable``.
    """
    entry = measured_mode(record, config)
    gen_source = _generation_source(record, config, sampler)
    try:
        eval_source = _generation_source(record, config, gen_source["name"], prefix="eval_")
    except MissingMeasurement:
        eval_source = gen_source  # no evaluation batch measured: the same per-token time at another row count
    arch, shapes = record["qwen_step"]["model"]["architecture"], record["qwen_step"]["shapes"]
    n_params = record["qwen_step"]["model"]["parameters"]
    stages = {name: stage["seconds"] for name, stage in entry["step"]["stages"].items()}
    here_flops, here_bw = published_peaks(record["device"]["name"])
    prompt_tokens = shapes["prompt_tokens"] if prompt_tokens is None else prompt_tokens
    model = dict(num_params=n_params, vocab_size=arch["vocab_size"], hidden_size=arch["hidden_size"],
                 tied_embeddings=arch["tie_word_embeddings"], gradient_checkpointing=True)
    measured_c = round(entry["step"]["completion_tokens_mean"])
    measured = dict(prompts=shapes["prompts"], group_size=shapes["group_size"], prompt_tokens=shapes["prompt_tokens"],
                    completion_tokens=measured_c, lora=config.use_peft)
    minibatches = config.batch_completions // (config.minibatch_size or config.batch_completions)
    wanted = dict(prompts=config.prompts_per_step, group_size=config.group_size, prompt_tokens=prompt_tokens,
                  completion_tokens=config.max_new_tokens, num_iterations=config.num_iterations,
                  minibatches=minibatches, reference_model=config.beta > 0, lora=config.use_peft)
    here0 = estimate_step_seconds(**model, **measured, peak_flops=here_flops, bandwidth=here_bw)
    train0 = stages["scoring_forward"] + stages["backward"]
    share = here0["train_seconds"] / train0

    def overhead(source: dict) -> float:
        bound = estimate_step_seconds(**model, prompts=source["prompts"], group_size=source["group_size"],
                                      prompt_tokens=shapes["prompt_tokens"], completion_tokens=source["tokens"],
                                      weight_bytes=source["weight_bytes"], peak_flops=here_flops,
                                      bandwidth=here_bw)["generate_seconds"]
        return max(0.0, source["seconds"] - bound) / source["tokens"]

    def generation(prompts: int, group_size: int, source: dict) -> tuple[float, float]:
        bound = estimate_step_seconds(**model, prompts=prompts, group_size=group_size, prompt_tokens=prompt_tokens,
                                      completion_tokens=config.max_new_tokens,
                                      weight_bytes=source["weight_bytes"])["generate_seconds"]
        tokens, per_token = config.max_new_tokens, overhead(source)
        return tokens * per_token + bound, tokens * per_token * HOST_SLOWDOWN + bound / share

    t4_train = estimate_step_seconds(**model, **wanted)["train_seconds"]
    here_train = estimate_step_seconds(**model, **wanted, peak_flops=here_flops, bandwidth=here_bw)["train_seconds"]
    training = (max(t4_train, train0 * here_train / here0["train_seconds"]), t4_train / share)
    trainable = lora_trainable_params(arch, config.lora_r) if config.use_peft else n_params
    tokens_ratio = (config.batch_completions * config.max_new_tokens) / (
        shapes["prompts"] * shapes["group_size"] * measured_c)
    other = (stages["reward"] * tokens_ratio
             + stages["optimizer_step"] * (trainable / n_params) * here_bw / T4_BANDWIDTH)
    gen = generation(config.prompts_per_step, config.group_size, gen_source)
    compile_seconds = gen_source["compile_seconds"]
    return {
        "generation": gen,
        "training": training,
        "other": other,
        "step": (gen[0] + training[0] + other, gen[1] + training[1] + other),
        "eval_batch": generation(config.eval_batch_size, 1, eval_source),
        "compile": (compile_seconds, compile_seconds * COMPILE_SLOWDOWN),
        "sampler": gen_source["name"],
        "source": gen_source["source"],
        "overhead_per_token": overhead(gen_source),
        "share": share,
        "trainable": trainable,
    }


#: Installing the package and downloading Qwen2.5-0.5B-Instruct (about 1 GB) and GSM8K: an assumption, in minutes.
SETUP_MINUTES = 5.0


def session_estimate(record: dict, config: GRPOConfig, steps: int, n_eval: int,
                     setup_minutes: float = SETUP_MINUTES, *, sampler: str | None = None) -> dict:
    """An ESTIMATE of chapter 9's GPU notebook on a T4, part by part, in minutes: ``(low, high)`` each.

    Training is ``steps`` times :func:`t4_run_estimate`'s ``step``; an
    evaluation generates greedily for ``n_eval`` problems,
    ``config.eval_batch_size`` at a time (its ``eval_batch``, once per batch);
    the probe of section 9.2 is one step's generation. Setup is an assumed
    ``setup_minutes`` for both ends. With a static cache each new shape is
    compiled once (its ``compile``): the probe's, the first evaluation's batch
    sizes (the full batch and a smaller last one), the training step's; the
    second evaluation reuses the first's. ``sampler``: as :func:`t4_run_estimate`'s.

    Returns ``parts`` ({part: (low, high)}: ``setup``, ``probe``, ``evaluation
    before``, ``training``, ``evaluation after``), ``total`` (low, high),
    ``compiles`` (how many shapes are compiled) and ``run``
    (:func:`t4_run_estimate`'s dict, in seconds).
    """
    check_int(None, "steps", steps, 1)
    check_int(None, "n_eval", n_eval, 1)
    run = t4_run_estimate(record, config, sampler=sampler)
    batches = -(-n_eval // config.eval_batch_size)
    eval_shapes = 1 + (batches > 1 and n_eval % config.eval_batch_size != 0)
    compile_low, compile_high = run["compile"]

    def minutes(low: float, high: float, compiles: int = 0) -> tuple[float, float]:
        return (low + compiles * compile_low) / 60, (high + compiles * compile_high) / 60

    evaluation = (batches * run["eval_batch"][0], batches * run["eval_batch"][1])
    parts = {
        "setup": (setup_minutes, setup_minutes),
        "probe": minutes(*run["generation"], compiles=1),
        "evaluation before": minutes(*evaluation, compiles=eval_shapes),
        "training": minutes(steps * run["step"][0], steps * run["step"][1], compiles=1),
        "evaluation after": minutes(*evaluation),
    }
    total = (sum(low for low, _ in parts.values()), sum(high for _, high in parts.values()))
    compiles = (2 + eval_shapes) if compile_high > 0 else 0
    return {"parts": parts, "total": total, "compiles": compiles, "run": run}


def t4_memory_estimate(record: dict, config: GRPOConfig, *, prompt_tokens: int | None = None,
                       sampler: str | None = None) -> dict:
    """An ESTIMATE of ``config``'s peak GPU memory on a T4, carried over from the record's step of its mode.

    The record measured a step of each mode (:func:`measured_mode`; it refuses a
    mode the record lacks). Its training peak is the model state (full
    fine-tuning: 16 bytes a weight, float32 weights, gradients and AdamW's two
    moments; LoRA: 4 bytes a frozen weight and 16 a trained one) plus the
    activations and logits of one micro-batch; its generation peak, the state kept
    between steps (full: 12 bytes a weight; LoRA: 4 a frozen and 12 a trained one),
    the sampler's copy of the weights if it keeps one (a merged float32 copy: 4
    bytes a weight, a float16 copy: 2) plus the KV cache and logits of its rows.
    Here the state and the copy are ``config``'s (its mode, and its sampler on a
    GPU: :func:`gpu_sampler`, or ``sampler``), and the rest is scaled by the
    tokens in flight: ``micro_batch_size * (prompt + budget)`` in training,
    ``eval_batch_size * (prompt + budget)`` for an evaluation batch (the larger of
    that and a step's generation). Reserved memory is the allocated times the
    record's own reserved-to-allocated ratio.

    Returns ``training`` and ``generation`` (estimated bytes allocated),
    ``peak_reserved`` (bytes), ``cap`` (the record's T4 cap) and ``fits``.
    """
    entry = measured_mode(record, config)
    step = entry["step"]
    shapes, n = record["qwen_step"]["shapes"], record["qwen_step"]["model"]["parameters"]
    arch = record["qwen_step"]["model"]["architecture"]
    prompt_tokens = shapes["prompt_tokens"] if prompt_tokens is None else prompt_tokens
    measured_c = round(step["completion_tokens_mean"])
    measured_tokens = shapes["prompt_tokens"] + measured_c
    trainable = lora_trainable_params(arch, config.lora_r) if config.use_peft else n
    measured_trainable = entry.get("trainable_parameters", trainable)
    lora = config.use_peft

    def state(t: int) -> int:  # training: weights, gradients, moments
        return (4 * n + 16 * t) if lora else 16 * n

    def kept(t: int) -> int:  # between steps: weights and moments
        return (4 * n + 12 * t) if lora else 12 * n

    def copy_bytes(name: str) -> int:  # the sampler's own copy of the weights
        return 2 * n if name.startswith("float16") else 4 * n if (lora and name.startswith("plain")) else 0

    activations0 = step["stages"]["backward"]["peak_allocated"] - state(measured_trainable)
    wanted_sampler = gpu_sampler(config) if sampler is None else sampler
    generation0 = (step["stages"]["generation"]["peak_allocated"] - kept(measured_trainable)
                   - copy_bytes(measured_sampler(record, config)))
    tokens = prompt_tokens + config.max_new_tokens
    micro = config.micro_batch_size or config.batch_completions
    training = state(trainable) + activations0 * (micro * tokens) / (shapes["micro_batch_size"] * measured_tokens)
    rows = max(config.eval_batch_size, config.batch_completions)
    generation = (kept(trainable) + copy_bytes(wanted_sampler)
                  + generation0 * (rows * tokens) / (shapes["completions"] * measured_tokens))
    ratio = step["peak_reserved"] / step["peak_allocated"]
    peak = max(training, generation) * ratio
    cap = record["memory_cap"]["bytes"]
    return {"training": training, "generation": generation, "peak_reserved": peak, "cap": cap, "fits": peak <= cap}


def chapter9_estimate(record: dict, config: GRPOConfig, steps: int, n_eval: int) -> dict:
    """What chapter 9 prints about its GPU session, from whichever record the package ships.

    First the sampler ``config`` runs on a GPU (:func:`gpu_sampler`); a record that
    did not measure it (every record before issue 43: its fast samplers wait for a
    lent GPU) says so, and the estimate falls back to the sampler the record's step
    of ``config``'s mode was measured with (:func:`measured_sampler`; for LoRA before
    issue 43, the adapters unmerged with the dynamic cache, which the fast sampler is
    meant to beat), said so too. A record without ``config``'s mode, or a dry run,
    gives no estimate at all: it says why, and never borrows another mode's step.

    Returns ``session`` (:func:`session_estimate`'s dict, or None), ``sampler`` (the
    one it read, or None), ``fast`` (the estimate with ``config``'s own GPU sampler,
    or None when unmeasured), ``lines`` (sentences to print) and ``shown`` (what a
    run record keeps of it: ``minutes`` (low, high) or None, ``sampler``,
    ``gpu_record`` (the record's commit), ``steps`` and ``n_eval``).
    """
    wanted, lines = gpu_sampler(config), []

    def out(session: dict | None, sampler: str | None, fast: dict | None) -> dict:
        shown = {"minutes": None if session is None else [round(m, 1) for m in session["total"]],
                 "sampler": sampler, "gpu_record": record.get("package_commit"), "steps": steps, "n_eval": n_eval}
        return {"session": session, "sampler": sampler, "fast": fast, "lines": lines, "shown": shown}

    try:
        fast = session_estimate(record, config, steps, n_eval)
    except MissingMeasurement as error:
        fast = None
        lines.append(f"UNMEASURED: the sampler this run uses on a GPU, {wanted!r} ({SAMPLER_LABELS[wanted]}): "
                     f"{error}")
    if fast is not None:
        return out(fast, wanted, fast)
    try:
        sampler = measured_sampler(record, config)
        session = session_estimate(record, config, steps, n_eval, sampler=sampler)
    except MissingMeasurement as error:
        lines.append(f"NO ESTIMATE: {error}")
        return out(None, None, None)
    lines.append(f"The estimate below reads the sampler the record measured for this mode instead, {sampler!r} "
                 f"({SAMPLER_LABELS[sampler]}).")
    return out(session, sampler, None)

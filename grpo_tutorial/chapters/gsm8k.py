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
- the GPU estimates (the roofline :func:`estimate_step_seconds`, the T4's peaks and
  memory, :func:`t4_run_estimate`, :func:`session_estimate`, :func:`t4_memory_estimate`,
  :func:`chapter9_estimate`, :class:`MissingMeasurement`) live in
  :mod:`grpo_tutorial.chapters.gpu_estimates` and are re-exported here.

The chat template, the system prompt, the token budget and the micro-batches
all come from the preset, so nothing here is specific to one model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .recipes import accuracy_with_se, paired_gain
from .gpu_estimates import (  # noqa: F401  (chapter 9 and the benchmarks import them from here too)
    COMPILE_SLOWDOWN,
    GPU_PEAKS,
    HOST_SLOWDOWN,
    MissingMeasurement,
    SAMPLER_LABELS,
    SETUP_MINUTES,
    STAGES_BEFORE,
    T4_BANDWIDTH,
    T4_CAP_BYTES,
    T4_CONTEXT_BYTES,
    T4_FP32_FLOPS,
    T4_TOTAL_BYTES,
    chapter9_estimate,
    estimate_step_seconds,
    forward_flops_per_token,
    gpu_sampler,
    lora_trainable_params,
    measured_mode,
    measured_sampler,
    measured_samplers,
    published_peaks,
    sampler_name,
    session_estimate,
    stage_names,
    step_mode,
    t4_memory_estimate,
    t4_run_estimate,
    t4_step_estimate,
)
from .._checks import check_flag, check_int
from ..answers import answer_readings, answers_match, completion_to_text, extract_answer, last_boxed, last_number
from ..rewards import compute_rewards, correctness_reward
from ..sampling.fast import use_static_cache
from ..rollout import generate_rollouts, sampling_kwargs
from ..tasks import DatasetUnavailableError, gsm8k_rows, load_gsm8k, train_test_split_arithmetic
from ..run import dataset_fingerprint, disk_errors, find_checkpoint, read_meta
from ..run.disk import write_durably
from ..run.completions import sample_completions
from ..doctor import Run, diagnose
from ..doctor.rules import TRUNCATED_SHARE, ZERO_STD_SHARE
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
    "STAGES_BEFORE",
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
    "stage_names",
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
#: The GPU run's steps: what fits, with both evaluations, in an hour on a T4 by the eager LoRA sampler the record
#: of 335aac1 measured (:func:`session_estimate`; 40 before issue 43, whose first measured LoRA step put 40 at up
#: to 113 minutes). The record of 5bd90c7 measured the GPU's own sampler (merged, static): 20 steps fit with room.
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
#: The probe's limits are the doctor's (chapter 18): a quarter of the completions cut, ...
PROBE_TRUNCATED_LIMIT = TRUNCATED_SHARE
#: ... and most groups all-equal (at one step: every group).
PROBE_ZERO_STD_LIMIT = ZERO_STD_SHARE


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
    total, per_fn = compute_rewards(fns, config.reward_weights, rollout.prompts, rollout.completions, answers,
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
        # what the doctor reads of each completion (probe_advice): the same fields a run keeps
        "kept": sample_completions(1, rollout.prompts, list(rollout.completions), total.tolist(),
                                   {k: v.tolist() for k, v in per_fn.items()}, [0.0] * len(answers), count=None,
                                   seed=0, details={"answers": answers, "truncated": rollout.truncated.tolist(),
                                                    "lengths": rollout.completion_lengths.tolist()}, group_size=G,
                                   readings=answer_readings),
    }


def probe_run(probe: dict) -> Run:
    """The probe as a one-step run, for the doctor: its shares as the step's row, its completions as kept rows."""
    right = [h for group in probe.get("right", []) for h in group]
    totals = [r for group in probe.get("rewards", []) for r in group]
    row = {"step": 1, "frac_truncated": probe["frac_truncated"], "frac_zero_std": probe["frac_zero_std"]}
    if right:
        row["accuracy"] = sum(right) / len(right)
    elif "all_right" in probe:  # shares only: the groups all right stand for the accuracy's floor
        row["accuracy"] = probe["all_right"]
    if totals:
        row["reward_mean"] = sum(totals) / len(totals)
    return Run([row], list(probe.get("kept", [])), {}, "probe")


def probe_advice(probe: dict, config: GRPOConfig) -> tuple[bool, list[str]]:
    """What :func:`probe_groups` says about the session ahead: ``(fine, sentences)``.

    The probe is read by chapter 18's doctor as a one-step run (:func:`probe_run`), with the rules and
    thresholds it applies to a whole run and to the trainer's live warnings: ``fine`` is False when it finds a
    fault or a warning, ``truncation`` (:data:`PROBE_TRUNCATED_LIMIT` or more of the completions cut by the
    budget, the cut ones unpaid) or a zero-variance fault (at one step: every group all-equal). Each sentence
    names the finding, what the probe showed and what to change, in the config's own field names.
    """
    budget = config.max_new_tokens
    diagnosis = diagnose(probe_run(probe))
    lines = []
    for finding in diagnosis.findings:
        if finding.severity == "note":
            continue
        text = f"{finding.name}: {finding.summary}. {finding.fix[0].upper() + finding.fix[1:]}"
        if finding.name == "truncation":
            text += f" (max_new_tokens={budget} now: try about {2 * budget}; the time estimate grows with it)"
        lines.append(text + "; then probe again.")
    if lines:
        return False, lines
    truncated, zero = probe["frac_truncated"], probe["frac_zero_std"]
    return True, [f"{truncated:.0%} of the completions hit the budget of {budget} tokens and {zero:.0%} of the "
                  f"groups teach nothing, and the doctor finds no fault in one step's sampling (its limits: "
                  f"{PROBE_TRUNCATED_LIMIT:.0%} cut, or every group all-equal): the settings give GRPO something to "
                  "learn from."]


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

"""After stage 5 of a GRPO step: the history row, the step's output, and the warnings it can raise.

Every number a step logs is assembled here from what the stages returned, and
:func:`check_failure_modes` reads the row for the failure modes chapters 8 and 10
show: no learning signal, collapse, truncation. (Non-finite losses are caught
where they happen, in the step's update, ``step.py``.)
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch

__all__ = [
    "StageClock",
    "TIMING_KEYS",
    "check_failure_modes",
    "step_row",
    "timed",
    "watch_stages",
]

#: History fields that measure wall-clock time. They are the only fields allowed
#: to differ between two runs with the same seed (or a run and its resumption).
#: The ``*_seconds`` fields split ``step_seconds`` by stage; ``forward``, ``backward``
#: and ``optimizer`` split ``update_seconds``. On a GPU, where kernels run
#: asynchronously, each stage waits for its kernels before its clock stops.
STAGE_SECONDS = ("generate_seconds", "reward_seconds", "score_seconds", "reference_seconds", "update_seconds")
UPDATE_SECONDS = ("forward_seconds", "backward_seconds", "optimizer_seconds")
#: A fast sampler's timings (:mod:`grpo_tutorial.fast_sampler`): ms per decoding step, the seconds of compiling calls.
SAMPLER_SECONDS = ("sampler/decode_ms", "sampler/compile_seconds")
TIMING_KEYS = frozenset(
    {"step_seconds", "rollout_seconds", "tokens_per_s", "other_seconds", *STAGE_SECONDS, *UPDATE_SECONDS,
     *SAMPLER_SECONDS}
)


#: Who is told when a stage ends (:func:`watch_stages`).
_WATCHERS: list[Callable[[str], None]] = []


def _stage_ended(name: str) -> None:
    """A stage's work is done: wait for its GPU kernels (if CUDA runs), then tell the watchers."""
    if torch.cuda.is_initialized():  # kernels run asynchronously: the stage ends when they do
        torch.cuda.synchronize()
    for watcher in tuple(_WATCHERS):
        watcher(name)


@contextmanager
def watch_stages(watcher: Callable[[str], None]) -> Iterator[None]:
    """Call ``watcher(name)`` each time a stage of a training step ends, inside the block.

    The names are :class:`StageClock`'s laps (``"generate"``, ``"reward"``,
    ``"score"``, ``"reference"``, ``"update"``) and, within ``"update"``, each
    micro-batch's ``"forward_seconds"`` and ``"backward_seconds"`` and each
    update's ``"optimizer_seconds"`` (:func:`timed`). On a GPU the call comes
    after the stage's kernels have finished, so a watcher can read the stage's
    peak memory (``benchmarks/gpu_proof.py`` does).
    """
    if not callable(watcher):
        raise TypeError(f"watcher must be a function of the stage name, got {type(watcher).__name__}")
    _WATCHERS.append(watcher)
    try:
        yield
    finally:
        _WATCHERS.remove(watcher)


class StageClock:
    """Wall-clock seconds per stage of one step (the ``*_seconds`` history fields)."""

    def __init__(self) -> None:
        self.start = self.mark = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, name: str) -> None:
        _stage_ended(name)
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.mark
        self.mark = now

    def done(self) -> dict[str, float]:
        total = time.perf_counter() - self.start
        stages = {f"{k}_seconds": v for k, v in self.seconds.items()}
        for name in ("generate", "reward", "score", "reference", "update"):
            stages.setdefault(f"{name}_seconds", 0.0)
        stages["other_seconds"] = max(0.0, total - sum(stages.values()))
        return {"step_seconds": total, "rollout_seconds": stages["generate_seconds"], **stages}


@contextmanager
def timed(seconds: dict[str, float], name: str) -> Iterator[None]:
    """Add the wall-clock seconds of the ``with`` block to ``seconds[name]`` (the update's forward,
    backward and optimizer split of ``update_seconds``)."""
    started = time.perf_counter()
    yield
    _stage_ended(name)
    seconds[name] += time.perf_counter() - started


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1.0))


def measured_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """:func:`masked_mean` over the rows that were measured: a row of NaN (never scored) is left out.

    NaN if no row was measured. With every row measured it is ``masked_mean``, bit for bit.
    """
    measured = ~torch.isnan(values).any(dim=1, keepdim=True)  # [N, 1]
    kept = mask * measured  # [N, T]
    if not bool(measured.any()):
        return math.nan
    return masked_mean(torch.where(measured, values, torch.zeros_like(values)), kept)


def nanmean(values: Sequence[float]) -> float:
    """Mean of the non-NaN values (NaN if there are none)."""
    kept = [v for v in values if not math.isnan(v)]
    return float(sum(kept) / len(kept)) if kept else math.nan


def finite_mean(values: Sequence[float]) -> float:
    """Mean of the finite values; if none is finite, the first value (NaN or inf) itself."""
    kept = [v for v in values if math.isfinite(v)]
    if kept:
        return float(sum(kept) / len(kept))
    return float(values[0]) if values else math.nan


def nanmax(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return float(max(kept)) if kept else math.nan


def step_row(
    *,
    step: int,
    rewards: torch.Tensor,
    per_function: dict[str, float],
    correct: Sequence[float] | None,
    update_stats: Sequence[dict],
    losses: Sequence[float],
    grad_norms: Sequence[float],
    entropy: torch.Tensor,
    mask: torch.Tensor,
    zero_std: torch.Tensor,
    truncated: torch.Tensor,
    lr: float,
    skipped_updates: int,
    seconds: dict[str, float],
) -> dict[str, Any]:
    """The history row of one step: plain numbers.

    Its fields: ``step``; ``reward_mean``, ``reward_std`` and
    ``reward/<function name>``; ``accuracy`` (NaN if rows have no answer);
    ``kl`` (NaN when beta = 0: no reference is kept); ``clip_frac_low``,
    ``clip_frac_high``, ``clip_frac``, ``ratio_mean``, ``ratio_max`` (means over
    the step's micro-batches, the max for ``ratio_max``); ``entropy`` (mean per
    completion token, under the sampling policy); ``completion_len_mean``,
    ``completion_len_max``; ``frac_zero_std`` (groups whose rewards are all
    equal); ``frac_truncated``; ``grad_norm`` (before clipping) and ``loss``
    (means over the step's updates that were finite; NaN/inf only if none
    was); ``lr``; ``skipped_updates`` (cumulative); and the timing fields
    (:data:`TIMING_KEYS`): ``step_seconds``, ``tokens_per_s``, and seconds per
    stage (``generate``, ``reward``, ``score``, ``reference``, ``update``,
    ``other``; ``rollout_seconds`` = ``generate_seconds``). The trainer adds
    ``groups_drawn`` (groups sampled this step: ``prompts_per_step``, more with
    dynamic sampling), with an entropy bonus ``entropy_coef`` and, with a
    sampler that is not the learner, the ``mismatch/...`` diagnostics
    (:func:`~grpo_tutorial.mismatch.sampler_correction`).

    Args: ``rewards`` is ``[N]`` with NaN for completions no reward function
    could score; ``update_stats`` holds one ``grpo_loss`` stats dict per
    micro-batch (of every update of the step); ``losses`` and ``grad_norms``
    one value per optimizer update; ``entropy`` and ``mask`` are ``[N, T]``;
    ``seconds`` holds ``step_seconds``, ``rollout_seconds`` and the per-stage
    timings.
    """
    lengths = mask.sum(dim=1)  # [N]
    scored = rewards[~torch.isnan(rewards)]  # [K]
    row: dict[str, Any] = {
        "step": step,
        "reward_mean": float(scored.mean()) if scored.numel() else math.nan,
        "reward_std": float(scored.std()) if scored.numel() > 1 else 0.0,
    }
    row.update({f"reward/{name}": value for name, value in per_function.items()})
    row.update(
        {
            "accuracy": nanmean(correct) if correct is not None else math.nan,
            "kl": nanmean([s["kl"] for s in update_stats]),
            "clip_frac_low": nanmean([s["clip_frac_low"] for s in update_stats]),
            "clip_frac_high": nanmean([s["clip_frac_high"] for s in update_stats]),
            "clip_frac": nanmean([s["clip_frac"] for s in update_stats]),
            "ratio_mean": nanmean([s["ratio_mean"] for s in update_stats]),
            "ratio_max": nanmax([s["ratio_max"] for s in update_stats]),
            "entropy": measured_mean(entropy, mask),
            "completion_len_mean": float(lengths.mean()),
            "completion_len_max": float(lengths.max()),
            "frac_zero_std": float(zero_std.float().mean()),
            "frac_truncated": float(truncated.float().mean()),
            "grad_norm": finite_mean(grad_norms),
            "loss": finite_mean(losses),
            "lr": lr,
            "skipped_updates": float(skipped_updates),
        }
    )
    step_seconds = seconds["step_seconds"]
    generated = float(lengths.sum())
    row.update(seconds)
    row["tokens_per_s"] = generated / step_seconds if step_seconds > 0 else math.nan
    return row


#: Accuracy at or above this, with most groups all-equal, reads as "solved", not "collapsed".
MASTERED_ACCURACY = 0.8


def check_failure_modes(
    row: dict, history: Sequence[dict], *, group_size: int, learning_rate: float, max_new_tokens: int,
    warn: Callable[[str, str], None],
) -> None:
    """Warn (through ``warn(kind, message)``) about the failure modes ``row`` shows.

    Most groups with all-equal rewards has two opposite causes, told apart by
    the reward level and trend: a policy that has *solved* the batch (every
    completion right: accuracy >= 0.8, or rising reward when there is no
    accuracy) versus one that has *collapsed* (low accuracy and falling reward).
    ``history`` is the rows before ``row``.
    """
    step = row["step"]
    accuracy = row.get("accuracy", math.nan)
    earlier = [r["reward_mean"] for r in history[-10:] if math.isfinite(r.get("reward_mean", math.nan))]
    trend = row["reward_mean"] - sum(earlier) / len(earlier) if earlier else math.nan
    solved = accuracy >= MASTERED_ACCURACY if math.isfinite(accuracy) else (math.isfinite(trend) and trend > 0)
    level = f"accuracy {accuracy:.2f}" if math.isfinite(accuracy) else f"reward {row['reward_mean']:.3f}"
    trend_text = f", {trend:+.3f} against the mean of the last {len(earlier)} steps" if earlier else ""
    if row["frac_zero_std"] > 0.8 and solved:
        warn(
            "mastered",
            f"step {step}: {row['frac_zero_std']:.0%} of groups have all-equal rewards because the policy "
            f"solves them ({level}{trend_text}): these groups carry no learning signal. Not a collapse; "
            "give it harder problems to keep learning.",
        )
    elif row["frac_zero_std"] == 1.0:
        warn(
            "zero_std",
            f"no learning signal at step {step}: in every group all {group_size} completions got "
            f"the same reward ({level}), so every advantage is 0. Make the task easier (or warm-start the "
            "model), raise group_size or temperature, or use a reward with partial credit.",
        )
    elif row["frac_zero_std"] > 0.8:
        warn(
            "collapse",
            f"possible collapse at step {step}: {row['frac_zero_std']:.0%} of groups have zero reward "
            f"std while the policy is not solving them ({level}{trend_text}); healthy tiny-model runs sit "
            "at about 16-42%. The policy may have become deterministic; lower learning_rate "
            f"(now {learning_rate:g}) or add a KL penalty (beta).",
        )
    if row["frac_truncated"] > 0.5:
        warn(
            "truncated",
            f"step {step}: {row['frac_truncated']:.0%} of completions hit max_new_tokens="
            f"{max_new_tokens} without an EOS; raise max_new_tokens, or ask for shorter answers.",
        )

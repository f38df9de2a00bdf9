"""After stage 5 of a GRPO step: the history row, the step's output, and the warnings it can raise.

Every number a step logs is assembled here from what the stages returned. The
failure modes the rows show (no learning signal, collapse, truncation, and the
rest) are read by chapter 18's doctor (:mod:`grpo_tutorial.doctor`), live in the
trainer and afterwards on a run's files; non-finite losses are caught where they
happen, in the step's update (``step.py``).
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import torch

from .rewards import reward_function_means
from .stages import STAGES

if TYPE_CHECKING:
    from .stage_results import Rewards, Scores, Updates

__all__ = [
    "STAGE_SECONDS",
    "StageClock",
    "TIMING_KEYS",
    "history_row",
    "stage_seconds",
    "step_row",
    "timed",
    "tool_metrics",
    "watch_stages",
]

#: History fields that measure wall-clock time. They are the only fields allowed
#: to differ between two runs with the same seed (or a run and its resumption).
#: ``<stage>_seconds`` splits ``step_seconds`` by stage, one field per stage of
#: :data:`~grpo_tutorial.stages.STAGES`, named as the stage; the pieces of a stage split
#: it further: ``reference_seconds`` is the reference's part of ``score_seconds``, and
#: ``forward``, ``backward`` and ``optimizer`` split ``update_seconds``. On a GPU, where
#: kernels run asynchronously, each stage waits for its kernels before its clock stops.
STAGE_SECONDS = tuple(f"{s.name}_seconds" for s in STAGES)
SCORE_SECONDS = ("reference_seconds",)
UPDATE_SECONDS = ("forward_seconds", "backward_seconds", "optimizer_seconds")
#: A fast sampler's timings (:mod:`grpo_tutorial.sampling.fast`): ms per decoding step, the seconds of compiling calls.
SAMPLER_SECONDS = ("sampler/decode_ms", "sampler/compile_seconds")
#: Older histories' names (before issue 44): stage 1 was ``generate`` (and ``rollout_seconds`` its alias), and
#: ``score_seconds`` left out the reference's ``reference_seconds`` and held stage 3's time.
LEGACY_SECONDS = ("generate_seconds", "rollout_seconds")
TIMING_KEYS = frozenset(
    {"step_seconds", "tokens_per_s", "other_seconds", *STAGE_SECONDS, *SCORE_SECONDS, *UPDATE_SECONDS,
     *SAMPLER_SECONDS, *LEGACY_SECONDS}
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

    The names are :class:`StageClock`'s laps, the stages' names (``"sample"``,
    ``"reward"``, ``"advantages"``, ``"score"``, ``"update"``), and the pieces
    :func:`timed` measures inside a stage: within ``"score"`` the reference's
    ``"reference_seconds"``, within ``"update"`` each micro-batch's
    ``"forward_seconds"`` and ``"backward_seconds"`` and each update's
    ``"optimizer_seconds"``. On a GPU the call comes
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
    """Wall-clock seconds per stage of one step (the ``<stage>_seconds`` history fields).

    ``lap(name)`` ends the stage ``name`` (a name of :data:`~grpo_tutorial.stages.STAGES`);
    a stage that runs again (dynamic sampling's rounds of stages 1 and 2) adds up."""

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
        stages = {key: self.seconds.get(key.removesuffix("_seconds"), 0.0) for key in STAGE_SECONDS}
        stages.update({f"{k}_seconds": v for k, v in self.seconds.items()})
        stages["other_seconds"] = max(0.0, total - sum(stages.values()))
        return {"step_seconds": total, **stages}


def stage_seconds(row: dict[str, Any]) -> dict[str, float]:
    """Seconds per stage of one history row, by the stages' names (``{"sample": ..., ..., "update": ...}``).

    It reads older histories too (before issue 44): their ``generate_seconds`` is
    stage 1's, and their ``score_seconds`` (which held stage 3's few microseconds)
    plus ``reference_seconds`` is stage 4's; stage 3 then reads 0.
    """
    if "generate_seconds" in row or "rollout_seconds" in row:  # an older row
        sample = row.get("generate_seconds", row.get("rollout_seconds"))
        score = row.get("score_seconds", 0.0) + row.get("reference_seconds", 0.0)
        return {"sample": sample, "reward": row.get("reward_seconds", 0.0), "advantages": 0.0, "score": score,
                "update": row.get("update_seconds", 0.0)}
    return {s.name: row[f"{s.name}_seconds"] for s in STAGES}


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
    stage (``sample``, ``reward``, ``advantages``, ``score``, ``update``, and
    ``other``; read them with :func:`stage_seconds`) and per piece of a stage
    (``reference``, ``forward``, ``backward``, ``optimizer``). The trainer adds
    ``groups_drawn`` (groups sampled this step: ``prompts_per_step``, more with
    dynamic sampling), with an entropy bonus ``entropy_coef`` and, with a
    sampler that is not the learner, the ``mismatch/...`` diagnostics
    (:func:`~grpo_tutorial.mismatch.sampler_correction`).

    Args: ``rewards`` is ``[N]`` with NaN for completions no reward function
    could score; ``update_stats`` holds one ``grpo_loss`` stats dict per
    micro-batch (of every update of the step); ``losses`` and ``grad_norms``
    one value per optimizer update; ``entropy`` and ``mask`` are ``[N, T]``;
    ``seconds`` holds ``step_seconds`` and the per-stage timings.
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


def history_row(config: Any, rewards: Rewards, scores: Scores, updates: Updates, seconds: dict[str, float], state: Any,
                history: Sequence[dict], entropy_coef: float | None = None) -> dict[str, Any]:
    """A step's history row from what its stages returned (:mod:`grpo_tutorial.stage_results`). (The trainer
    reads the rows for failure modes as they come: chapter 18's doctor, :mod:`grpo_tutorial.doctor`.)

    ``rewards``: stage 2's :class:`~grpo_tutorial.stage_results.Rewards`; ``scores``: stage 4's ``Scores`` (its
    entropy, and a sampler copy's ``mismatch`` fields); ``updates``: stage 5's ``Updates``; the entropy is stage 4's
    pass's, or on-policy the update's own; ``entropy_coef``: the entropy bonus's coefficient after the step's last
    update (logged with an entropy bonus, as TRL logs it).
    """
    rollout = rewards.rollout
    entropy = updates.entropy if scores.entropy is None else scores.entropy  # [N, Tc]
    row = step_row(
        step=state.step, rewards=rewards.rewards, per_function=reward_function_means(rewards.per_fn),
        correct=rewards.correct, update_stats=updates.stats, losses=updates.losses,
        grad_norms=updates.grad_norms, entropy=entropy, mask=rollout.loss_mask,  # the policy's tokens
        zero_std=rewards.zero_std, truncated=rollout.truncated, lr=updates.lr,
        skipped_updates=state.skipped_updates, seconds=seconds,
    )
    row["groups_drawn"] = rewards.groups_drawn
    row.update(tool_metrics(rollout))  # with tools: the calls, failures and share (tools/loop.py)
    row.update(scores.mismatch)  # a sampler that is not the learner: how far apart they are (mismatch.py)
    if config.use_adaptive_entropy or config.entropy_coef != 0.0:
        row["entropy_coef"] = entropy_coef
    return row


def tool_metrics(rollout: Any) -> dict[str, float]:
    """The history's tool fields: calls and failures this step, and TRL's frequencies.

    ``tool_call_count`` and ``tool_failure_count`` (sums over the step's completions),
    ``tool_call_share`` (the share of completions that called a tool at least once),
    ``tool_call_frequency`` (calls per completion, TRL's ``tools/call_frequency``) and
    ``tool_failure_frequency`` (failures per call, TRL's ``tools/failure_frequency``; 0 without calls).
    """
    if rollout.tool_calls is None:
        return {}
    calls, failed = rollout.tool_calls.float(), rollout.tool_failures.float()
    total = float(calls.sum())
    return {
        "tool_call_count": total, "tool_failure_count": float(failed.sum()),
        "tool_call_share": int((calls > 0).sum()) / len(calls), "tool_call_frequency": total / len(calls),
        "tool_failure_frequency": float(failed.sum()) / total if total else 0.0,
    }

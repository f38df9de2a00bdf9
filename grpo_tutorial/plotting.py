"""Training curves: the small multiples every GRPO chapter looks at.

``plot_history`` reads the per-step history the trainer writes (a list of dicts,
or the ``history.jsonl`` file) and draws one small panel per quantity against
the step: reward (the step's mean, with a band of +-1 standard error of that
mean when the number of completions per step is given), accuracy, KL, clip fraction,
completion length and the fraction of groups with zero reward std (the cheap
collapse detector of chapter 10).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ._checks import check_int

__all__ = ["DEFAULT_PANELS", "moving_average", "plot_history"]

#: Panels drawn by default: (history key, title). "reward_mean" also gets a
#: band of +-1 standard error of the step's mean (given ``completions_per_step``),
#: and "completion_len_mean" a dashed max line.
DEFAULT_PANELS: tuple[tuple[str, str], ...] = (
    ("reward_mean", "reward (mean)"),
    ("accuracy", "accuracy (sampled)"),
    ("kl", "KL to reference"),
    ("clip_frac", "clip fraction"),
    ("completion_len_mean", "completion length"),
    ("frac_zero_std", "groups with zero reward std"),
)


def moving_average(values: Sequence[float], window: int) -> np.ndarray:
    """Trailing moving average that skips NaNs (the first points use what exists).

    >>> moving_average([1.0, 2.0, 3.0, 4.0], 2).tolist()
    [1.0, 1.5, 2.5, 3.5]
    """
    check_int(None, "smooth", window, 1, hint="; it is a window in steps")
    x = np.asarray(values, dtype=float)  # [S]
    valid = ~np.isnan(x)  # [S]
    sums = np.cumsum(np.where(valid, x, 0.0))  # [S]
    counts = np.cumsum(valid)  # [S]
    sums[window:] = sums[window:] - sums[:-window].copy()
    counts[window:] = counts[window:] - counts[:-window].copy()
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _load_rows(history_or_path: Any) -> list[dict]:
    if isinstance(history_or_path, (str, os.PathLike)):
        from .run.history import read_history

        return read_history(Path(history_or_path))
    if isinstance(history_or_path, dict) or not isinstance(history_or_path, Sequence):
        raise TypeError(
            "history_or_path must be a list of history rows (dicts) or a path to history.jsonl, "
            f"got {type(history_or_path).__name__}"
        )
    for i, row in enumerate(history_or_path):
        if not isinstance(row, dict):
            raise TypeError(f"history row {i} must be a dict, got {type(row).__name__}: {row!r:.80}")
    return list(history_or_path)


def _column(rows: list[dict], key: str) -> np.ndarray:
    """One history field as floats, NaN where a row lacks it."""
    out = []
    for row in rows:
        value = row.get(key)
        out.append(float(value) if isinstance(value, (int, float)) and value is not None else math.nan)
    return np.asarray(out, dtype=float)


def _panels(keys: Sequence[str] | None, rows: list[dict]) -> list[tuple[str, str]]:
    titles = dict(DEFAULT_PANELS)
    if keys is None:
        wanted = [k for k, _ in DEFAULT_PANELS]
    else:
        if isinstance(keys, str) or not isinstance(keys, Sequence):
            raise TypeError(f"keys must be a list of history keys, got {keys!r}")
        wanted = list(keys)
    present = [k for k in wanted if not np.all(np.isnan(_column(rows, k)))]
    return [(k, titles.get(k, k)) for k in present]


def plot_history(
    history_or_path: Any,
    *,
    keys: Sequence[str] | None = None,
    smooth: int | None = None,
    ax: Any = None,
    completions_per_step: int | None = None,
):
    """Draw training curves against the step; return the matplotlib Figure.

    Args:
        history_or_path: the list of rows from ``GRPOTrainer.train``, or a path to
            a ``history.jsonl`` (or to the run directory holding it).
        keys: history keys to draw, one panel each (default: reward, accuracy,
            KL, clip fraction, completion length, zero-std fraction). Keys that
            are missing or all NaN are skipped, so a beta = 0 run (KL is NaN)
            simply has no KL panel.
        smooth: a window in steps; curves are then trailing moving averages,
            with the raw values drawn faintly behind.
        ax: None for a new figure; one Axes to overlay every key on it; or a
            sequence of Axes, one per panel drawn.
        completions_per_step: the number of completions whose rewards each
            step's ``reward_mean`` averages (``prompts_per_step * group_size``).
            Given, the reward panel gets a band of +-1 standard error of that
            mean, ``reward_std / sqrt(completions_per_step)`` (divided again by
            ``sqrt(smooth)`` for a moving average); for a 0/1 reward the band
            never leaves [0, 1]. Not given, no band: a band of +-1 *standard
            deviation* of the rewards would run below 0 and above 1 for a 0/1
            reward, and says nothing about how well the mean is known.

    In a notebook, end the call with ``;`` so the figure is shown only once.
    """
    import matplotlib.pyplot as plt

    rows = _load_rows(history_or_path)
    if not rows:
        raise ValueError("the history is empty; there is nothing to plot")
    if smooth is not None:
        moving_average([0.0], smooth)  # validates the window
    if completions_per_step is not None:
        check_int(None, "completions_per_step", completions_per_step, 2, hint="; it is prompts_per_step * group_size")
    panels = _panels(keys, rows)
    if not panels:
        wanted = keys if keys is not None else [k for k, _ in DEFAULT_PANELS]
        raise ValueError(f"none of the keys {list(wanted)} has a value in the history; available: {sorted(rows[0])}")
    steps = _column(rows, "step")
    if np.all(np.isnan(steps)):
        steps = np.arange(1, len(rows) + 1, dtype=float)
    fig, axes, overlay = _figure_and_axes(plt, ax, panels)
    for (key, title), axis in zip(panels, axes):
        _draw_panel(axis, key, title, rows, steps, smooth=smooth, overlay=overlay,
                    completions_per_step=completions_per_step)
    if overlay:
        axes[0].legend(fontsize=8)
    else:
        fig.tight_layout()
    return fig


def _figure_and_axes(plt: Any, ax: Any, panels: list[tuple[str, str]]) -> tuple[Any, list, bool]:
    """The figure, one Axes per panel, and whether every panel is overlaid on one Axes (see ``plot_history``'s ``ax``).

    ``plt`` is ``matplotlib.pyplot``, which makes a new figure when ``ax`` is None.
    """
    if ax is None:
        cols = min(3, len(panels))
        nrows = math.ceil(len(panels) / cols)
        fig, grid = plt.subplots(nrows, cols, figsize=(4.2 * cols, 2.9 * nrows), squeeze=False)
        axes = list(grid.ravel())
        for extra in axes[len(panels) :]:
            extra.set_visible(False)
        overlay = False
    elif hasattr(ax, "plot"):
        axes, fig, overlay = [ax] * len(panels), ax.figure, True
    else:
        axes = list(np.ravel(ax))
        if len(axes) < len(panels):
            raise ValueError(f"ax has {len(axes)} axes but {len(panels)} panels are drawn ({[k for k, _ in panels]})")
        fig, overlay = axes[0].figure, False
    return fig, axes, overlay


def _draw_panel(
    axis: Any,
    key: str,
    title: str,
    rows: list[dict],
    steps: np.ndarray,
    *,
    smooth: int | None,
    overlay: bool,
    completions_per_step: int | None,
) -> None:
    """One history key against the step on ``axis``: the curve, and the reward's band or the length's max line."""

    def curve(values: np.ndarray) -> np.ndarray:
        return values if smooth is None else moving_average(values, smooth)

    values = _column(rows, key)
    label = key if overlay else None
    band = key == "reward_mean" and "reward_std" in rows[0] and completions_per_step is not None
    if smooth is not None:
        axis.plot(steps, values, alpha=0.25, linewidth=0.8, color=None if overlay else "C0")
    line = axis.plot(steps, curve(values), label=label, color=None if overlay else "C0")[0]
    if band:
        # +-1 standard error of the step's mean reward (of the moving average, when smoothed)
        se = curve(_column(rows, "reward_std")) / math.sqrt(completions_per_step * (smooth or 1))
        mean = curve(values)
        axis.fill_between(steps, mean - se, mean + se, alpha=0.2, color=line.get_color(), linewidth=0)
    if key == "completion_len_mean" and not overlay:
        longest = _column(rows, "completion_len_max")
        if not np.all(np.isnan(longest)):
            axis.plot(steps, curve(longest), linestyle="--", color=line.get_color(), label="max")
            axis.plot([], [], color=line.get_color(), label="mean")
            axis.legend(fontsize=8)
    if not overlay:
        axis.set_title(title.replace("(mean)", "(mean ± 1 s.e.)") if band else title, fontsize=10)
    axis.set_xlabel("step")
    axis.grid(alpha=0.3)

"""Looking inside one GRPO step (chapter 7): per-token tensors as text and as pictures.

A step works with many ``[N, T]`` tensors, one row per completion and one column
per completion token: the mask, the old, new and reference log-probs, the ratio,
the per-token loss and its gradient. Printed raw they are hard to read, because
padding positions carry meaningless numbers. The helpers here show them with the
completion's tokens next to the numbers and padding blanked out:

* :func:`token_strings`: the token each position holds, as readable text.
* :func:`format_token_matrix`: a ``[N, T]`` tensor as a small text table.
* :func:`plot_token_heatmaps`: several ``[N, T]`` tensors side by side as heatmaps.

The chapter's policy is a tiny Qwen2 after 100 supervised steps
(:func:`make_step_policy`). Those 100 steps amplify the last-bit differences
between two machines' floating-point kernels until the sampled batch can differ,
so the chapter steps from the weights the package ships (:func:`load_step_policy`,
made by ``python -m benchmarks.step_policy``) and every machine sees the batch and
the step the prose describes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from grpo_tutorial._checks import check_int, require_tensor

__all__ = [
    "STEP_POLICY_FILE",
    "format_token_matrix",
    "load_step_policy",
    "make_step_policy",
    "plot_token_heatmaps",
    "token_strings",
]

#: The shipped weights of chapter 7's policy (package data, written by ``python -m benchmarks.step_policy``).
STEP_POLICY_FILE = "step_policy.safetensors"
#: The tiny model of chapter 7: narrower than chapter 8's, so a step's tables fit on a page.
STEP_POLICY_SHAPE = dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256, seed=0)


def make_step_policy(progress: bool = False):
    """Chapter 7's policy made from scratch: the tiny Qwen2, then 100 supervised steps on one-digit sums.

    Returns ``(model, tokenizer, history)``, ``history`` being the warm start's rows
    (``loss`` per step). Run at one thread, as the chapter and the command that
    made the shipped weights do; on another machine's kernels the weights come out
    slightly different (see the module docstring).
    """
    from grpo_tutorial.models import build_tiny_policy
    from grpo_tutorial.sft import SFTConfig, supervised_warmup
    from grpo_tutorial.tasks import make_arithmetic_dataset

    rows = make_arithmetic_dataset(2000, seed=0, digits=1)  # "4+9=" -> "13"
    model, tokenizer = build_tiny_policy(**STEP_POLICY_SHAPE)
    config = SFTConfig(steps=100, batch_size=64, learning_rate=1e-3, warmup_steps=20, seed=0)
    history = supervised_warmup(model, tokenizer, rows, config, progress=progress)
    model.eval()
    return model, tokenizer, history


def load_step_policy():
    """Chapter 7's policy from the shipped weights, its tokenizer, and the file's metadata.

    The metadata names the command and package commit that wrote the file and the
    kernel fingerprint of the machine it ran on (``tests/test_records.py`` re-makes
    the weights with that command: bit for bit where the fingerprint matches).
    """
    from importlib import resources

    from safetensors import safe_open
    from safetensors.torch import load_model

    from grpo_tutorial.models import build_tiny_policy

    model, tokenizer = build_tiny_policy(**STEP_POLICY_SHAPE)
    with resources.as_file(resources.files("grpo_tutorial.data").joinpath(STEP_POLICY_FILE)) as path:
        load_model(model, str(path))
        with safe_open(str(path), framework="pt") as f:
            metadata = dict(f.metadata())
    model.eval()
    return model, tokenizer, metadata

MASKED = "·"  # what a padding position shows instead of its number


def token_strings(tokenizer: Any, ids: torch.Tensor) -> list[list[str]]:
    """The text of every token of a ``[N, T]`` id tensor, row by row.

    Special tokens keep their names (``"<eos>"``, ``"<pad>"``) and a space is
    shown as ``"␣"``, so every position has something visible.
    """
    require_tensor("ids", ids, dim=2, floating=False)
    rows = []
    for row in ids.tolist():
        tokens = tokenizer.convert_ids_to_tokens(row)
        rows.append([("␣" if t == " " else str(t)) for t in tokens])
    return rows


def _check_matrix(values: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    require_tensor("values", values, dim=2)
    if mask is None:
        mask = torch.ones_like(values, dtype=torch.float32)
    require_tensor("mask", mask, dim=2)
    if mask.shape != values.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)} but values has {tuple(values.shape)}")
    return values.detach().float().cpu(), mask.detach().cpu().bool()


def format_token_matrix(
    values: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    row_labels: Sequence[str] | None = None,
    tokens: Sequence[Sequence[str]] | None = None,
    fmt: str = "{:+.3f}",
    title: str | None = None,
) -> str:
    """A ``[N, T]`` tensor as a text table, padding positions shown as ``·``.

    Args:
        values: ``[N, T]`` numbers (any dtype; shown with ``fmt``).
        mask: ``[N, T]``, nonzero for real completion tokens (None = all real).
        row_labels: one label per row, e.g. the decoded completion.
        tokens: ``[N][T]`` token texts (see :func:`token_strings`); each cell then
            shows ``token number``.
        fmt: format of one number.
        title: an optional first line.

    Returns:
        The table as one string (print it).

    Example:
        >>> print(format_token_matrix(torch.tensor([[1.0, 2.0]]), torch.tensor([[1, 0]]), fmt="{:.1f}"))
        row  t0   t1
          0  1.0  ·
    """
    vals, real = _check_matrix(values, mask)
    n, t = vals.shape
    if row_labels is not None and len(row_labels) != n:
        raise ValueError(f"row_labels has {len(row_labels)} entries but values has {n} rows")
    if tokens is not None and (len(tokens) != n or any(len(r) != t for r in tokens)):
        raise ValueError(f"tokens must be {n} rows of {t} token strings, matching values")
    header = ["row"] + ([""] if row_labels is not None else []) + [f"t{j}" for j in range(t)]
    body = []
    for i in range(n):
        cells = []
        for j in range(t):
            if not real[i, j]:
                cells.append(MASKED)
                continue
            number = fmt.format(vals[i, j].item())
            cells.append(f"{tokens[i][j]} {number}" if tokens is not None else number)
        label = [repr(str(row_labels[i]))] if row_labels is not None else []
        body.append([str(i)] + label + cells)
    table = [header] + body
    widths = [max(len(r[k]) for r in table) for k in range(len(header))]
    lines = []
    for r in table:
        first = r[0].rjust(widths[0])
        rest = [c.ljust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  ".join([first] + rest).rstrip())
    if title is not None:
        lines.insert(0, title)
    return "\n".join(lines)


def plot_token_heatmaps(
    panels: Mapping[str, torch.Tensor],
    mask: torch.Tensor,
    *,
    tokens: Sequence[Sequence[str]] | None = None,
    row_labels: Sequence[str] | None = None,
    group_size: int | None = None,
    diverging: Sequence[str] = (),
    fmt: str = "{:.2f}",
    figsize: tuple[float, float] | None = None,
):
    """Several ``[N, T]`` tensors side by side as heatmaps, padding left blank.

    Args:
        panels: ``{title: [N, T] tensor}``, drawn left to right.
        mask: ``[N, T]``, nonzero for real completion tokens; other cells are blank.
        tokens: ``[N][T]`` token texts, written in each real cell above its number.
        row_labels: one label per row for the y axis (e.g. the advantage).
        group_size: draw a line between groups of this many rows.
        diverging: titles of panels centred on 0 with a red-blue colour map
            (use it for signed quantities such as advantages or gradients).
        fmt: format of the number written in each cell.
        figsize: matplotlib figure size (default: from the number of panels).

    Returns:
        The matplotlib figure.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    if not isinstance(panels, Mapping) or not panels:
        raise ValueError("panels must be a non-empty dict {title: [N, T] tensor}")
    for name in diverging:
        if name not in panels:
            raise ValueError(f"diverging names {name!r}, which is not a panel; panels: {list(panels)}")
    arrays = {}
    for title, values in panels.items():
        vals, real = _check_matrix(values, mask)
        arrays[title] = np.where(real.numpy(), vals.numpy(), np.nan)  # [N, T], NaN = blank
    n, t = next(iter(arrays.values())).shape
    check_int(None, "group_size", group_size, 1, optional=True)
    if group_size is not None and n % group_size:
        raise ValueError(f"group_size must be a positive int dividing the {n} rows, got {group_size!r}")
    if figsize is None:
        figsize = (1.1 + 0.75 * t * len(arrays), 0.9 + 0.36 * n)
    fig, axes = plt.subplots(1, len(arrays), figsize=figsize, sharey=True, squeeze=False)
    for ax, (title, grid) in zip(axes[0], arrays.items()):
        finite = grid[np.isfinite(grid)]
        if title in diverging:
            limit = float(np.abs(finite).max()) if finite.size else 1.0
            limit = limit if limit > 0 else 1.0
            image = ax.imshow(grid, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
        else:
            image = ax.imshow(grid, cmap="viridis", aspect="auto")
        fig.colorbar(image, ax=ax, fraction=0.08, pad=0.03)
        for i in range(n):
            for j in range(t):
                value = grid[i, j]
                if math.isnan(value):
                    continue
                text = fmt.format(value)
                if tokens is not None:
                    text = f"{tokens[i][j]}\n{text}"
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="black",
                        bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.6))
        if group_size is not None:
            for k in range(group_size, n, group_size):
                ax.axhline(k - 0.5, color="black", lw=1.5)
        ax.set_xticks(range(t))
        ax.set_xticklabels([f"t{j}" for j in range(t)])
        ax.set_title(title, fontsize=10)
    axes[0][0].set_yticks(range(n))
    axes[0][0].set_yticklabels(list(row_labels) if row_labels is not None else [str(i) for i in range(n)])
    fig.tight_layout()
    return fig

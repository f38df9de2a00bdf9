"""The picture of one GRPO step, drawn with matplotlib (chapter 0 and every chapter header).

The boxes are the stages of :data:`grpo_tutorial.stages.STAGES`, numbered and named
as there, left to right, then the loop closes:

- ``prompts``    -- a batch of B prompts: the input of the step, not a stage, so
  its box carries no number;
- ``1. sample``     -- the current policy writes G completions per prompt;
- ``2. reward``     -- a reward function scores every completion;
- ``3. advantages`` -- each reward against its own group (a z-score);
- ``4. score``      -- log-probs of the sampled tokens under the old policy and the
  frozen reference model, without gradient;
- ``5. update``     -- the policy's log-probs with gradient, the clipped,
  KL-penalised loss and an optimizer step; mu passes over the batch.

``draw_grpo_step(highlight=...)`` draws it and can colour one box;
``chapter_header(n)`` draws the small copy that opens chapter ``n``.
"""

from __future__ import annotations

from typing import Any

from ..stages import STAGES as STEP_STAGES

__all__ = ["CHAPTER_STAGES", "INPUT", "STAGES", "chapter_header", "draw_grpo_step", "highlighted_stages", "stage_boxes"]

#: The box before stage 1: the step's input, unnumbered.
INPUT = "prompts"

# The second line of each box, by stage name (the first is "<number>. <name>").
_DETAILS = {
    "sample": "G samples per prompt\n(policy, no grad)",
    "reward": "r_i = R(q, o_i)",
    "advantages": "A_i = (r_i - mean) / std\nwithin each group",
    "score": "old policy + reference\nlog-probs (no grad)",
    "update": "policy log-probs (grad),\nclipped loss + beta * KL;\nmu passes",
}

#: Box name -> (title, detail) as written in the boxes: the unnumbered input, then the
#: stages of :data:`grpo_tutorial.stages.STAGES`, titled "<number>. <name>".
STAGES: dict[str, tuple[str, str]] = {
    INPUT: (INPUT, "B questions"),
    **{s.name: (f"{s.number}. {s.name}", _DETAILS[s.name]) for s in STEP_STAGES},
}

#: Chapter number -> the stage it opens up (None: the chapter covers the whole step).
#: Stages are named as in :data:`grpo_tutorial.stages.STAGES`.
CHAPTER_STAGES: dict[int, str | None] = {
    1: "update",      # policy gradients: the update itself
    2: "advantages",  # group-relative advantages
    3: "score",       # log-probs and masks
    4: "update",      # the clipped objective
    5: "update",      # the KL penalty, a term of the loss (kl is a module of stage 5)
    6: "reward",      # verifiable rewards
    7: None,          # one training step: all of it
    8: None,          # a tiny transformer learns
    9: None,          # a real LLM
    10: "update",     # variants (loss types) and pitfalls
    11: "sample",     # scaling out: generation dominates the cost
}

# (x, y) of each box's lower-left corner in a 0..12 x 0..5 canvas.
_POSITIONS = {
    INPUT: (0.1, 3.0),
    "sample": (2.6, 3.0),
    "reward": (5.1, 3.0),
    "advantages": (7.6, 3.0),
    "score": (5.1, 0.5),
    "update": (10.1, 1.75),
}
_BOX_W, _BOX_H = 2.1, 1.5
_ARROWS = [
    (INPUT, "sample"),
    ("sample", "reward"),
    ("reward", "advantages"),
    ("advantages", "update"),
    ("sample", "score"),
    ("score", "update"),
]
_PLAIN, _HIGHLIGHT, _DIM = "#e8eef7", "#f6b93b", "#f2f2f2"
_GID_PREFIX = "grpo-stage:"


def _check_stage(highlight: Any) -> None:
    if highlight is None:
        return
    if not isinstance(highlight, str) or highlight not in STAGES:
        raise ValueError(
            f"highlight={highlight!r} is not a stage of the GRPO step; "
            f"use None (no highlight) or one of {list(STAGES)}"
        )


def draw_grpo_step(highlight: str | None = None, *, small: bool = False, ax=None):
    """Draw one GRPO step as labelled boxes with arrows (the prompts, then the five stages); return the Figure.

    Args:
        highlight: a key of ``STAGES`` to colour (the others are greyed), or None
            to draw every box the same.
        small: the compact header version (titles only, smaller figure).
        ax: an existing matplotlib Axes to draw into (default: a new figure).

    Each box is a ``FancyBboxPatch`` whose gid is ``"grpo-stage:<name>"`` and,
    when highlighted, ``"grpo-stage:<name>:highlight"`` (see
    ``highlighted_stages``), so tests and readers can find them.
    """
    _check_stage(highlight)
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 2.2) if small else (11, 4.6))
    else:
        fig = ax.figure
    ax.set_xlim(0, 12.3)
    ax.set_ylim(0.3, 5.6)
    ax.set_axis_off()

    for name, (title, detail) in STAGES.items():
        x, y = _POSITIONS[name]
        lit = highlight == name
        face = _HIGHLIGHT if lit else (_DIM if highlight is not None else _PLAIN)
        box = FancyBboxPatch(
            (x, y), _BOX_W, _BOX_H, boxstyle="round,pad=0.05,rounding_size=0.15",
            facecolor=face, edgecolor="#333333" if lit or highlight is None else "#aaaaaa",
            linewidth=2.2 if lit else 1.0, label=name,
        )
        box.set_gid(_GID_PREFIX + name + (":highlight" if lit else ""))
        ax.add_patch(box)
        cx, cy = x + _BOX_W / 2, y + _BOX_H / 2
        if small:  # the name alone
            ax.text(cx, cy, name, ha="center", va="center", fontsize=8,
                    fontweight="bold" if lit else "normal")
        else:
            ax.text(cx, y + _BOX_H - 0.3, title, ha="center", va="center", fontsize=10, fontweight="bold")
            ax.text(cx, y + 0.55, detail, ha="center", va="center", fontsize=8)

    def anchor(name: str, side: str) -> tuple[float, float]:
        x, y = _POSITIONS[name]
        return {
            "right": (x + _BOX_W + 0.05, y + _BOX_H / 2),
            "left": (x - 0.05, y + _BOX_H / 2),
            "bottom": (x + _BOX_W / 2, y - 0.05),
            "top": (x + _BOX_W / 2, y + _BOX_H + 0.05),
        }[side]

    for a, b in _ARROWS:
        if a == "sample" and b == "score":
            start, end = anchor(a, "bottom"), anchor(b, "left")
            style = "arc3,rad=0.3"
        else:
            start, end = anchor(a, "right"), anchor(b, "left")
            style = "arc3,rad=0.0"
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12,
                                     color="#555555", connectionstyle=style))
    # the loop: the updated policy samples the next batch
    ax.add_patch(FancyArrowPatch(anchor("update", "top"), anchor("sample", "top"), arrowstyle="-|>",
                                 mutation_scale=12, color="#555555", linestyle="--",
                                 connectionstyle="arc3,rad=0.25"))
    if not small:
        ax.text(7.9, 5.35, "next step: the updated policy samples again", ha="center", fontsize=8, style="italic")
        ax.set_title("One GRPO step", fontsize=12)
    fig.tight_layout()
    return fig


def stage_boxes(fig) -> dict[str, Any]:
    """The stage boxes of a figure drawn by ``draw_grpo_step``: name -> patch."""
    boxes = {}
    for ax in fig.axes:
        for patch in ax.patches:
            gid = patch.get_gid() or ""
            if gid.startswith(_GID_PREFIX):
                boxes[gid[len(_GID_PREFIX):].split(":")[0]] = patch
    return boxes


def highlighted_stages(fig) -> list[str]:
    """Names of the highlighted stage boxes, in drawing order."""
    found = []
    for ax in fig.axes:
        for patch in ax.patches:
            gid = patch.get_gid() or ""
            if gid.startswith(_GID_PREFIX) and gid.endswith(":highlight"):
                found.append(gid[len(_GID_PREFIX):].split(":")[0])
    return found


def chapter_header(chapter: int):
    """The small diagram that opens chapter ``chapter`` (1-11), its stage highlighted."""
    if isinstance(chapter, bool) or chapter not in CHAPTER_STAGES:
        raise ValueError(f"chapter={chapter!r} has no place on the diagram; expected one of {sorted(CHAPTER_STAGES)}")
    return draw_grpo_step(CHAPTER_STAGES[chapter], small=True)

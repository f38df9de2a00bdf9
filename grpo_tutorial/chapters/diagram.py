"""The picture of one GRPO step, drawn with matplotlib (chapter 0 and every chapter header).

One step has six stages, left to right, then the loop closes:

1. ``prompts``   -- a batch of B prompts;
2. ``rollout``   -- the current policy samples G completions per prompt;
3. ``reward``    -- a reward function scores every completion;
4. ``advantage`` -- each reward minus its group's mean (over the group's std);
5. ``scoring``   -- log-probs of the sampled tokens under the old policy and the
   frozen reference model (no gradient), plus the current policy (with gradient);
6. ``update``    -- the clipped, KL-penalised loss and an optimizer step, mu times.

``draw_grpo_step(highlight=...)`` draws it and can colour one stage;
``chapter_header(n)`` draws the small copy that opens chapter ``n``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHAPTER_STAGES", "STAGES", "chapter_header", "draw_grpo_step", "highlighted_stages", "stage_boxes"]

#: Stage name -> (title, detail) as written in the boxes.
STAGES: dict[str, tuple[str, str]] = {
    "prompts": ("1. prompts", "B questions"),
    "rollout": ("2. rollout", "G samples per prompt\n(policy, no grad)"),
    "reward": ("3. rewards", "r_i = R(q, o_i)"),
    "advantage": ("4. group advantages", "A_i = (r_i - mean) / std\nwithin each group"),
    "scoring": ("5. score log-probs", "old policy + reference\n(no grad), policy (grad)"),
    "update": ("6. update (x mu)", "clipped ratio loss\n+ beta * KL(policy || ref)"),
}

#: Chapter number -> the stage it opens up (None: the chapter covers the whole step).
CHAPTER_STAGES: dict[int, str | None] = {
    1: "update",      # policy gradients: the update itself
    2: "advantage",   # group-relative advantages
    3: "scoring",     # log-probs and masks
    4: "update",      # the clipped objective
    5: "scoring",     # the KL penalty needs the reference's log-probs
    6: "reward",      # verifiable rewards
    7: None,          # one training step: all of it
    8: None,          # a tiny transformer learns
    9: None,          # a real LLM
    10: "update",     # variants (loss types) and pitfalls
    11: "rollout",    # scaling out: generation dominates the cost
}

# (x, y) of each box's lower-left corner in a 0..12 x 0..5 canvas.
_POSITIONS = {
    "prompts": (0.1, 3.0),
    "rollout": (2.6, 3.0),
    "reward": (5.1, 3.0),
    "advantage": (7.6, 3.0),
    "scoring": (5.1, 0.5),
    "update": (10.1, 1.75),
}
_BOX_W, _BOX_H = 2.1, 1.5
_ARROWS = [
    ("prompts", "rollout"),
    ("rollout", "reward"),
    ("reward", "advantage"),
    ("advantage", "update"),
    ("rollout", "scoring"),
    ("scoring", "update"),
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
    """Draw one GRPO step as six labelled boxes with arrows; return the Figure.

    Args:
        highlight: a key of ``STAGES`` to colour (the others are greyed), or None
            to draw every stage the same.
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
        if small:
            ax.text(cx, cy, title.split(" ", 1)[1], ha="center", va="center", fontsize=8,
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
        if a == "rollout" and b == "scoring":
            start, end = anchor(a, "bottom"), anchor(b, "left")
            style = "arc3,rad=0.3"
        else:
            start, end = anchor(a, "right"), anchor(b, "left")
            style = "arc3,rad=0.0"
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12,
                                     color="#555555", connectionstyle=style))
    # the loop: the updated policy samples the next batch
    ax.add_patch(FancyArrowPatch(anchor("update", "top"), anchor("rollout", "top"), arrowstyle="-|>",
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

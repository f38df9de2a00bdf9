"""The GRPO-step diagram (chapter 0 and the chapter headers)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from grpo_tutorial.chapters.diagram import (
    CHAPTER_STAGES,
    STAGES,
    chapter_header,
    draw_grpo_step,
    highlighted_stages,
    stage_boxes,
)


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_stages_in_order():
    assert list(STAGES) == ["prompts", "rollout", "reward", "advantage", "scoring", "update"]


def test_every_stage_is_a_labelled_box():
    fig = draw_grpo_step()
    boxes = stage_boxes(fig)
    assert list(boxes) == list(STAGES)
    texts = [t.get_text() for t in fig.axes[0].texts]
    for title, detail in STAGES.values():
        assert title in texts and detail in texts
    assert highlighted_stages(fig) == []
    faces = {tuple(b.get_facecolor()) for b in boxes.values()}
    assert len(faces) == 1, "without highlight every box looks the same"


@pytest.mark.parametrize("stage", list(STAGES))
def test_highlight_marks_exactly_one_stage(stage):
    fig = draw_grpo_step(stage)
    assert highlighted_stages(fig) == [stage]
    boxes = stage_boxes(fig)
    lit = tuple(boxes[stage].get_facecolor())
    others = {tuple(b.get_facecolor()) for name, b in boxes.items() if name != stage}
    assert len(others) == 1 and lit not in others


@pytest.mark.parametrize("bad", ["rewards", "Rollout", 3, ""])
def test_bad_stage_names_raise(bad):
    with pytest.raises(ValueError, match="highlight=.*one of \\['prompts'"):
        draw_grpo_step(bad)


def test_small_version_titles_only():
    fig = draw_grpo_step("reward", small=True)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == [title.split(" ", 1)[1] for title, _ in STAGES.values()]
    assert fig.get_size_inches()[0] < draw_grpo_step().get_size_inches()[0]


def test_chapter_headers():
    assert sorted(CHAPTER_STAGES) == list(range(1, 12))
    assert highlighted_stages(chapter_header(2)) == ["advantage"]
    assert highlighted_stages(chapter_header(7)) == []
    with pytest.raises(ValueError, match="chapter=12"):
        chapter_header(12)

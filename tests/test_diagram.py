"""The GRPO-step diagram (chapter 0 and the chapter headers)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from grpo_tutorial import stages
from grpo_tutorial.chapters.diagram import (
    CHAPTER_STAGES,
    INPUT,
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
    assert list(STAGES) == ["prompts", "sample", "reward", "advantages", "score", "update"]
    assert INPUT == "prompts"
    assert list(STAGES)[1:] == [s.name for s in stages.STAGES]


def test_titles_carry_the_numbers_of_grpo_tutorial_stages():
    """The prompts box is unnumbered (the input); every other box is "<number>. <name>" of stages.STAGES."""
    assert STAGES[INPUT][0] == "prompts"
    assert [title for title, _ in list(STAGES.values())[1:]] == [f"{s.number}. {s.name}" for s in stages.STAGES]
    assert [t for t, _ in STAGES.values()] == ["prompts", "1. sample", "2. reward", "3. advantages", "4. score", "5. update"]


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


@pytest.mark.parametrize("bad", ["rewards", "Sample", "rollout", "scoring", 3, ""])
def test_bad_stage_names_raise(bad):
    with pytest.raises(ValueError, match="highlight=.*one of \\['prompts'"):
        draw_grpo_step(bad)


def test_small_version_titles_only():
    fig = draw_grpo_step("reward", small=True)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == list(STAGES)  # the names, without numbers or details
    assert texts == ["prompts", *(s.name for s in stages.STAGES)]
    assert fig.get_size_inches()[0] < draw_grpo_step().get_size_inches()[0]


def test_chapter_headers():
    assert sorted(CHAPTER_STAGES) == list(range(1, 12))
    names = {s.name for s in stages.STAGES}
    assert {s for s in CHAPTER_STAGES.values() if s is not None} <= names
    assert highlighted_stages(chapter_header(2)) == ["advantages"]
    assert highlighted_stages(chapter_header(3)) == ["score"]
    assert highlighted_stages(chapter_header(7)) == []
    with pytest.raises(ValueError, match="chapter=12"):
        chapter_header(12)

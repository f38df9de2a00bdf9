"""One numbering of a GRPO step's stages, and one vocabulary for its update (issue 31, item 6).

``grpo_tutorial.stages.STAGES`` numbers and names the stages once: 1 sample,
2 reward, 3 advantages, 4 score, 5 update. The batch of prompts is the input
before stage 1 and the history row the output after stage 5; neither has a number.
Each place that numbers the stages is read here and compared with ``STAGES``:

- chapter 0's loop (the ``# 1. sample`` comments of its code), its prose, its
  algorithm box and its diagram (``chapters.diagram``), and every chapter header;
- chapter 7's table of the step;
- the introduction of the book (``book/intro.md``), the stage table of
  ``book/architecture.md`` and the README's module table;
- everything that labels a stage with a number (``4. score``, ``stage 4, score``,
  ``Stage 4 (score)``) or names a stage number, in the notebooks, the book's pages
  and the package: the number must be one of the five and must be that stage's.

``grpo_tutorial.stages.VOCABULARY`` defines the five words for the batch and the
pieces of stage 5 once; chapter 4's table (label ``vocabulary-updates``) must say
exactly that, and the chapters that use the words link to it.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import nbformat
import pytest

from grpo_tutorial.stages import STAGES, VOCABULARY
from test_architecture_doc import table_rows

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
BOOK = ROOT / "book"
PACKAGE = ROOT / "grpo_tutorial"
CHAPTER_0 = NOTEBOOKS / "00_grpo_at_a_glance.ipynb"
CHAPTER_4 = NOTEBOOKS / "04_clipped_objective.ipynb"
CHAPTER_7 = NOTEBOOKS / "07_one_training_step.ipynb"

NUMBER = {s.name: s.number for s in STAGES}
EXPECTED = [(s.number, s.name) for s in STAGES]
_NAMES = "|".join(sorted(map(re.escape, NUMBER), key=len, reverse=True))
#: A stage name labelled with a number: "4. score", "# 4. score", "stage 4, score",
#: "Stage 4 (score)", "stage 4: the score", "1. **Sample**". Group 1 or 2 is the number, 3 the name.
LABEL_RE = re.compile(
    rf"(?:\bstage\s+(\d+)\s*[,:(]?\s*|(?<![\d.\-–])\b(\d+)\.\s+)(?:the\s+)?\**({_NAMES})\b(?![-\w])",
    re.I,
)
#: A stage number: "stage 4", "Stages 2-3", "stages 4 and 5", "stage 1 to 2".
NUMBER_RE = re.compile(r"\bstages?\s+(\d+)(?:\s*(?:-|–|and|to)\s*(\d+))?\b", re.I)
VOCABULARY_LABEL = "vocabulary-updates"
#: The chapters that use the words of VOCABULARY and must link to chapter 4's table.
LINK_TO_VOCABULARY = [
    "00_grpo_at_a_glance.ipynb", "07_one_training_step.ipynb", "08_tiny_transformer.ipynb",
    "09_real_llm.ipynb", "11_scaling_out.ipynb",
]
#: Files that still number the stages the old way (0 tasks ... 6 loss, 7 metrics), by a change
#: that was not free to edit them; the scan skips them and the last test demands they are stale.
WAITING_FOR_RENUMBERING: dict[str, str] = {}


# ---------------------------------------------------------------------------
# readers
# ---------------------------------------------------------------------------


def labels(text: str) -> list[tuple[int, str]]:
    """(number, stage name) of every stage a text labels with a number, in order."""
    return [(int(m[1] or m[2]), m[3].lower()) for m in LABEL_RE.finditer(text)]


def wrong_labels(text: str) -> list[str]:
    """The labels whose number is not their stage's, and stage numbers that are not 1-5."""
    wrong = [f"{n}. {name} (is stage {NUMBER[name]})" for n, name in labels(text) if NUMBER[name] != n]
    for m in NUMBER_RE.finditer(text):
        wrong += [f"{m[0]!r}: no stage {n}" for n in (m[1], m[2]) if n and not 1 <= int(n) <= len(STAGES)]
    return wrong


def cells(path: Path, cell_type: str | None = None) -> list[nbformat.NotebookNode]:
    nb = nbformat.read(path, as_version=4)
    return [c for c in nb.cells if cell_type is None or c.cell_type == cell_type]


def cell(path: Path, cell_id: str) -> str:
    (found,) = [c.source for c in cells(path) if c.get("id") == cell_id]
    return found


def spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def numbered(label: str) -> tuple[int, str] | None:
    """``"4. score"`` -> ``(4, "score")``; None for a label without a number."""
    m = re.fullmatch(r"(\d+)\.\s+(\S+)", label.strip())
    return (int(m[1]), m[2]) if m else None


def step_module_comments() -> list[tuple[int, str]] | None:
    """The (number, name) of the stage comments of ``grpo_tutorial/step.py``'s step (``GRPOStep.__call__``), in order.

    Read beside chapter 0's loop, whose comments the test above compares with ``STAGES`` too.
    """
    from grpo_tutorial.step import GRPOStep

    return labels(inspect.getsource(GRPOStep.__call__))


# ---------------------------------------------------------------------------
# the places that number the stages
# ---------------------------------------------------------------------------


def test_the_stages_are_five_numbered_in_order():
    assert [s.number for s in STAGES] == list(range(1, len(STAGES) + 1))
    assert EXPECTED == [(1, "sample"), (2, "reward"), (3, "advantages"), (4, "score"), (5, "update")]
    modules = [m for s in STAGES for m in s.modules]
    assert len(modules) == len(set(modules)), "a module belongs to one stage"
    assert all((PACKAGE / f"{m}.py").exists() or (PACKAGE / m / "__init__.py").exists() for m in modules), modules


def test_the_diagram_draws_the_stages():
    from grpo_tutorial.chapters import diagram

    boxes = list(diagram.STAGES.items())
    assert boxes[0][0] == diagram.INPUT and numbered(boxes[0][1][0]) is None, "the prompts box has no number"
    assert [(name, numbered(title)) for name, (title, _) in boxes[1:]] == [(name, (n, name)) for n, name in EXPECTED]


def test_every_chapter_header_names_a_stage():
    from grpo_tutorial.chapters.diagram import CHAPTER_STAGES

    assert set(CHAPTER_STAGES.values()) - {None} <= set(NUMBER)
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        calls = [int(n) for c in cells(path, "code") for n in re.findall(r"chapter_header\((\d+)\)", c.source)]
        assert calls in ([], [int(path.name[:2])]), f"{path.name} draws the header of chapter(s) {calls}"
        if calls:
            assert calls[0] in CHAPTER_STAGES


def test_chapter_0s_loop_comments_number_the_stages():
    loop = cell(CHAPTER_0, "ch0-grpo-loop")
    assert labels(loop) == EXPECTED, "the loop's body labels each stage once, in order (# 1. sample ... # 5. update)"
    functions = labels(cell(CHAPTER_0, "ch0-grpo-functions"))
    assert sorted(set(functions)) == EXPECTED and functions == sorted(functions), functions
    for n, name in EXPECTED:
        assert re.search(rf"# {n}\. {name}\b", loop), f"chapter 0's loop lacks '# {n}. {name}'"


def test_chapter_0s_prose_and_algorithm_number_the_stages():
    for cell_id in ("ch0-loop-md", "d984c1ab"):  # section 0.2's list, section 0.4's algorithm box
        items = re.findall(r"^\s*(\d+)\.\s+\*\*(\w+)", cell(CHAPTER_0, cell_id), re.M)
        assert [(int(n), name.lower()) for n, name in items] == EXPECTED, (cell_id, items)
    assert labels(cell(CHAPTER_0, "ch0-picture-md")) == EXPECTED  # section 0.3, the picture's text


def test_chapter_7s_table_numbers_the_stages():
    text = next(c.source for c in cells(CHAPTER_7, "markdown") if "| stage | what happens |" in c.source)
    rows = [r[0] for r in table_rows(text, "| stage | what happens |")]
    assert [numbered(r) for r in rows[1:-1]] == EXPECTED
    assert numbered(rows[0]) is None and numbered(rows[-1]) is None, "the input and the output have no number"
    headings = [h for c in cells(CHAPTER_7, "markdown") for h in re.findall(r"^## .*", c.source, re.M)]
    assert sorted({label for h in headings for label in labels(h)}) == EXPECTED, headings


def test_the_introduction_lists_each_stages_modules():
    text = (BOOK / "intro.md").read_text(encoding="utf8")
    paragraph = text[text.index("**The package behind the chapters.**"):]
    paragraph = " ".join(paragraph[:paragraph.index("\n\n")].split())
    found = re.findall(r"stage (\d+), (\w+), (?:is )?((?:`\w+`(?:, | and )?)+)", paragraph)
    assert [(int(n), name) for n, name, _ in found] == EXPECTED, found
    for (_, _, modules), s in zip(found, STAGES):
        assert spans(modules) == list(s.modules), (s.name, modules)
    assert paragraph.index("`tasks`") < paragraph.index("stage 1,") and paragraph.index("`metrics`") > paragraph.index("stage 5,")


def test_the_architecture_table_renumbers_the_modules():
    rows = table_rows((BOOK / "architecture.md").read_text(encoding="utf8"), "| Stage | Module |")
    stage_of = {spans(module)[0]: label for label, module, *_ in rows}
    assert rows[0][0] == "before 1" and spans(rows[0][1]) == ["tasks"]
    assert rows[-1][0] == "after 5" and spans(rows[-1][1]) == ["metrics"]
    middle = [numbered(label) for label, *_ in rows[1:-1]]
    assert None not in middle and middle == sorted(middle), "numbered rows, in the order of the step"
    assert sorted(set(middle)) == EXPECTED
    for s in STAGES:
        assert {m for m, label in stage_of.items() if numbered(label) == (s.number, s.name)} == set(s.modules), s.name


def test_the_readme_module_table_renumbers_the_modules():
    rows = table_rows((ROOT / "README.md").read_text(encoding="utf8"), "| Module | Stage / role |")
    for s in STAGES:
        row = next(role for modules, role in rows if s.modules[0] in spans(modules))
        assert row.startswith(f"{s.number}. {s.name}"), (s.name, row)
    assert "before stage 1" in next(role for modules, role in rows if "tasks" in spans(modules))
    assert "after stage 5" in next(role for modules, role in rows if "metrics" in spans(modules))


def places() -> list[tuple[str, str]]:
    """(where, text) of every notebook cell, book page, README and package module the scan reads."""
    found = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        found += [(f"{path.name}, cell {i}", c.source) for i, c in enumerate(cells(path))]
    for path in [*sorted(BOOK.glob("*.md")), ROOT / "README.md", ROOT / "CONTRIBUTING.md"]:
        found.append((str(path.relative_to(ROOT)), path.read_text(encoding="utf8")))
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(ROOT))
        if where not in WAITING_FOR_RENUMBERING:
            found.append((where, path.read_text(encoding="utf8")))
    return found


def test_every_numbered_stage_carries_its_own_number():
    wrong = [f"{where}: {w}" for where, text in places() for w in wrong_labels(text)]
    assert wrong == [], "stages numbered otherwise than grpo_tutorial.stages.STAGES:\n" + "\n".join(wrong)


def test_the_step_module_comments_number_the_stages():
    comments = step_module_comments()
    if comments is None:
        pytest.skip("step_module_comments() is a hook for grpo_tutorial/step.py, not filled in yet")
    assert sorted(set(comments)) == EXPECTED and comments == sorted(comments), comments


def test_files_waiting_for_renumbering_still_need_it():
    """When one of them is renumbered, take it off WAITING_FOR_RENUMBERING so that the scan reads it."""
    done = [p for p in WAITING_FOR_RENUMBERING if (ROOT / p).exists() and not wrong_labels((ROOT / p).read_text())]
    assert done == [], f"renumbered now, remove from WAITING_FOR_RENUMBERING: {done}"


def test_the_checks_catch_a_misnumbered_stage():
    assert labels("# 1. sample ... stage 4, score; Stage 5 (update) and 2. **Reward**") == [
        (1, "sample"), (4, "score"), (5, "update"), (2, "reward"),
    ]
    assert wrong_labels("# 4. update") == ["4. update (is stage 5)"]
    assert wrong_labels("stage 6: the update") and wrong_labels("stages 4-7") and wrong_labels("Stage 0 of a step")
    assert wrong_labels("section 0.2. Reward, samples, 3. scores, stages 4 and 5, 1-2. sample and reward") == []
    assert labels("the loss (6, update)") == [] and numbered("prompts") is None


# ---------------------------------------------------------------------------
# one vocabulary
# ---------------------------------------------------------------------------


def plain(text: str) -> str:
    """A table cell as plain text: no code spans, bold or math delimiters; B \\cdot G -> B*G, \\mu -> mu."""
    text = text.replace("`", "").replace("**", "")
    text = re.sub(r"\$([^$]*)\$", lambda m: m[1], text)
    text = text.replace("\\cdot", "*").replace("\\times", "*").replace("\\mu", "mu")
    text = re.sub(r"\s*\*\s*", "*", text)
    return " ".join(text.split())


def vocabulary_cell() -> str:
    found = [(p.name, c.source) for p in sorted(NOTEBOOKS.glob("*.ipynb")) for c in cells(p, "markdown")
             if f"({VOCABULARY_LABEL})=" in c.source]
    found += [(p.name, p.read_text()) for p in sorted(BOOK.glob("*.md")) if f"({VOCABULARY_LABEL})=" in p.read_text()]
    assert [name for name, _ in found] == [CHAPTER_4.name], f"the label ({VOCABULARY_LABEL})= is defined in {found}"
    return found[0][1]


def test_chapter_4_defines_the_vocabulary_once():
    text = vocabulary_cell()
    lines = text.splitlines()
    assert lines[0] == f"({VOCABULARY_LABEL})=" and lines[1].startswith("### "), "the label sits on a heading"
    rows = table_rows(text, "| word | what it means |")
    assert [plain(word) for word, _ in rows] == list(VOCABULARY)
    for word, meaning in rows:
        assert plain(meaning) == plain(VOCABULARY[plain(word)]), word


@pytest.mark.parametrize("name", LINK_TO_VOCABULARY)
def test_chapters_that_use_the_words_link_to_the_table(name):
    text = "\n".join(c.source for c in cells(NOTEBOOKS / name, "markdown"))
    assert re.search(rf"\{{ref\}}`[^`<]*<{VOCABULARY_LABEL}>`", text), f"{name} does not link to chapter 4's words"


def test_every_link_to_the_vocabulary_resolves():
    vocabulary_cell()  # the label exists, once
    refs = [m for p in NOTEBOOKS.glob("*.ipynb") for c in cells(p, "markdown")
            for m in re.findall(r"\{ref\}`([^`]*)`", c.source) if VOCABULARY_LABEL in m]
    assert len(refs) >= len(LINK_TO_VOCABULARY)
    assert all(re.fullmatch(rf"(?:[^<]+<)?{VOCABULARY_LABEL}>?", r) for r in refs), refs


def test_the_packages_public_names_are_grouped_by_stage_in_order():
    """``grpo_tutorial.__all__`` lists the stages' names under ``# stage N, name`` comments, in stage order, and
    each name under a stage comes from one of that stage's modules (issue 44: ``completion_mask`` is stage 1's)."""
    import grpo_tutorial

    source = (PACKAGE / "__init__.py").read_text()
    block = source[source.index("__all__ = ["):]
    groups: list[tuple[int, str, list[str]]] = []
    for line in block.splitlines()[1:]:
        comment = re.match(r"\s*# stage (\d+), (\w+)", line)
        if comment:
            groups.append((int(comment[1]), comment[2], []))
        elif re.match(r"\s*#", line):
            groups.append((0, "", []))  # a group that is no stage (tasks, models, training)
        elif groups and (name := re.match(r'\s*"(\w+)",', line)):
            groups[-1][2].append(name[1])
    staged = [(number, name) for number, name, _ in groups if number]
    assert staged == EXPECTED, staged
    for number, _, names in groups:
        if number:
            modules = {f"grpo_tutorial.{m}" for m in STAGES[number - 1].modules}
            assert names and {getattr(grpo_tutorial, n).__module__ for n in names} <= modules, (number, names)
    assert [n for _, _, names in groups for n in names] == list(grpo_tutorial.__all__)

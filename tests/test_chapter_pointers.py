"""Chapters point at the line of chapter 0's loop they zoom into (issue 25, item 2).

A chapter quotes chapter 0's code in a fenced ``python`` block whose first line is a
comment starting with ``# chapter 0``, for example::

    ```python
    # chapter 0, section 0.2: stage 2
    rewards = rewards_of(texts, answers)  # 2. reward
    ```

Every other non-empty line of such a block must appear, as it stands (leading and
trailing spaces aside), among the lines of chapter 0's code cells, so a quote cannot
drift from the loop it quotes. A line that is only ``...`` marks an omission.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CHAPTER_0 = NOTEBOOKS / "00_grpo_at_a_glance.ipynb"
QUOTE_RE = re.compile(r"^```python[ \t]*\n(#[ \t]*chapter 0\b[^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S | re.I)
# the chapters that must point at chapter 0's loop (chapters 1-4 may add themselves)
MUST_POINT = ["05_kl_penalty.ipynb", "06_verifiable_rewards.ipynb", "07_one_training_step.ipynb"]


def quotes(path: Path) -> list[tuple[int, str, list[str]]]:
    """(cell index, header comment, quoted lines) of every chapter-0 quote in a notebook."""
    nb = nbformat.read(path, as_version=4)
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for m in QUOTE_RE.finditer(cell.source):
            lines = [line.strip() for line in m.group(2).splitlines()]
            found.append((i, m.group(1), [line for line in lines if line and line != "..."]))
    return found


def chapter_0_lines() -> set[str]:
    nb = nbformat.read(CHAPTER_0, as_version=4)
    return {line.strip() for cell in nb.cells if cell.cell_type == "code" for line in cell.source.splitlines()}


@pytest.mark.parametrize("name", MUST_POINT)
def test_chapter_quotes_the_loop_of_chapter_0(name):
    assert quotes(NOTEBOOKS / name), f"{name} quotes no line of chapter 0's loop (a ```python block opening with '# chapter 0')"


@pytest.mark.parametrize("path", sorted(p for p in NOTEBOOKS.glob("*.ipynb") if p != CHAPTER_0), ids=lambda p: p.name)
def test_every_quote_matches_chapter_0(path):
    code = chapter_0_lines()
    for cell, header, lines in quotes(path):
        missing = [line for line in lines if line not in code]
        assert not missing, f"{path.name}, cell {cell} ({header}): not in chapter 0's code: {missing}"


def test_the_check_catches_a_drifted_quote(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("```python\n# chapter 0: stage 2\nrewards = nothing_like_it()\n...\n```")]
    path = tmp_path / "99_x.ipynb"
    nbformat.write(nb, path)
    ((_, _, lines),) = quotes(path)
    assert lines == ["rewards = nothing_like_it()"]
    assert "rewards = nothing_like_it()" not in chapter_0_lines()

"""Chapter 0's fifty-line GRPO loop is the package's GRPO.

The test runs the notebook's OWN code cells, extracted from the .ipynb (not a retyped
copy): the cell that defines the loop's functions and the cell that compares them with
the package (advantages with ``group_advantages``, log-probs with
``completion_logprobs``, loss and every weight's gradient with ``grpo_loss``). It runs
them on an untrained tiny model with rewards drawn at random, so that the advantages,
the loss and the gradients are not all zero, and checks that the comparison really
compared something (gradients that are not zero, tokens that were clipped).

It also checks that the lines of the loop that chapters 1-7 quote ("the line of
chapter 0's loop this chapter zooms into") are lines of the loop.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import nbformat
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
CHAPTER0 = ROOT / "notebooks" / "00_grpo_at_a_glance.ipynb"
FUNCTIONS, LOOP, CHECK = "ch0-grpo-functions", "ch0-grpo-loop", "ch0-check"
ZOOM_RE = re.compile(r"^```python\n(?P<code>.*?)^```", re.M | re.S)


def cell_source(cell_id: str) -> str:
    nb = nbformat.read(CHAPTER0, as_version=4)
    found = [c.source for c in nb.cells if c.get("id") == cell_id and c.cell_type == "code"]
    assert len(found) == 1, f"chapter 0 must have exactly one code cell with id {cell_id!r}"
    return found[0]


def run_check(functions: str, check: str, seed: int = 0) -> dict:
    """Execute chapter 0's function cell, then its check cell, on an untrained tiny model."""
    from grpo_tutorial.chapters.recipes import TinyAdditionRecipe, build_recipe_model, make_recipe_data

    recipe = TinyAdditionRecipe.quick(digits=2, hidden_size=64, num_layers=2, intermediate_size=128)
    model, tok = build_recipe_model(recipe, seed=seed)
    torch.manual_seed(seed)
    namespace: dict = {"torch": torch, "copy": __import__("copy"), "model": model, "tok": tok,
                       "data": make_recipe_data(recipe), "rng": random.Random(seed), "B": 8}
    exec(compile(functions, "chapter0:functions", "exec"), namespace)
    coin = torch.Generator().manual_seed(seed)

    def random_rewards(texts, answers):  # an untrained model is never right: mixed 0/1 instead
        return torch.randint(0, 2, (len(texts),), generator=coin).float()

    namespace["rewards_of"] = random_rewards
    exec(compile(check, "chapter0:check", "exec"), namespace)
    return namespace


def test_the_loop_cells_exist_and_use_no_package_algorithm():
    functions, loop = cell_source(FUNCTIONS), cell_source(LOOP)
    for source in (functions, loop):
        assert "grpo_tutorial" not in source, "the loop must be written out, not imported"
        assert "grpo_loss" not in source and "group_advantages" not in source
    code_lines = [line for line in (functions + "\n" + loop).splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(code_lines) <= 70, f"the loop should stay about fifty lines, it has {len(code_lines)}"


def test_chapter0_loop_equals_grpo_loss_on_the_same_batch():
    ns = run_check(cell_source(FUNCTIONS), cell_source(CHECK))
    # the comparison was not vacuous: real advantages, real gradients, clipped tokens
    assert ns["adv"].abs().sum() > 0
    assert any(g.abs().sum() > 0 for g in ns["grads_package"])
    assert ns["stats"]["clip_frac"] > 0
    assert len(ns["grads_inline"]) == len(list(ns["moved"].parameters()))


@pytest.mark.parametrize(
    "bug, replacement",
    [
        ("torch.min(", "torch.max("),  # the pessimistic min
        ("(objective * mask).sum(1) / mask.sum(1)", "(objective * mask).sum(1) / mask.shape[1]"),  # the mean per completion
        ("r.std(1, keepdim=True)", "r.std(1, keepdim=True, unbiased=False)"),  # the sample std
        ("[:, -T - 1:-1]", "[:, -T:]"),  # the shift by one
    ],
)
def test_a_changed_loop_line_fails_the_check(bug, replacement):
    functions = cell_source(FUNCTIONS)
    assert bug in functions
    with pytest.raises(AssertionError):
        run_check(functions.replace(bug, replacement), cell_source(CHECK))


def loop_lines() -> set[str]:
    """The loop's lines, stripped, with and without their trailing comments."""
    lines = set()
    for line in (cell_source(FUNCTIONS) + "\n" + cell_source(LOOP)).splitlines():
        lines.add(line.strip())
        lines.add(line.split("  #")[0].strip())
    return lines


SOURCE_RE = re.compile(r"# chapter 0, section (?P<section>0\.\d+): .+")


def chapter0_sections() -> set[str]:
    """The numbers of chapter 0's sections ("0.2"), read from its headings."""
    nb = nbformat.read(CHAPTER0, as_version=4)
    return {m[1] for c in nb.cells if c.cell_type == "markdown"
            for m in re.finditer(r"^## (0\.\d+) ", c.source, re.M)}


def test_zoom_quotes_in_later_chapters_are_lines_of_the_loop():
    """A chapter's "the line of chapter 0's loop" block quotes the loop verbatim."""
    known = loop_lines()
    sections = chapter0_sections()
    quoted = 0
    for path in sorted((ROOT / "notebooks").glob("0[1-7]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type != "markdown" or "chapter 0's loop" not in cell.source:
                continue
            for block in ZOOM_RE.finditer(cell.source):
                lines = block["code"].splitlines()
                source = SOURCE_RE.fullmatch(lines[0].strip()) if lines else None
                if source:  # "# chapter 0, section 0.2: ..." names where the quote is from
                    assert source["section"] in sections, (
                        f"{path.name} cites section {source['section']} of chapter 0, which has {sorted(sections)}")
                    lines = lines[1:]
                for line in lines:
                    if line.strip() and line.strip() != "...":
                        assert line.strip() in known, f"{path.name} quotes a line that is not in chapter 0's loop: {line!r}"
                        quoted += 1
    assert quoted >= 4, "chapters 1-4 each quote the line of the loop they zoom into"

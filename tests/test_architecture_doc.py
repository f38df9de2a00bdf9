"""The architecture page and the README's layout tables stay true to the tree (issue 26, item 6).

``book/architecture.md`` is the design of record. These tests check that it names
every module of the package, that every file, test and entry point it names exists,
and that its list of the stable API is ``tests/test_public_api.py``'s CONTRACT. The
README's layout tables must list every notebook, every chapter tool, every top-level
module and every module of ``run/``.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import grpo_tutorial

ROOT = Path(grpo_tutorial.__file__).resolve().parent.parent
PACKAGE = ROOT / "grpo_tutorial"
PAGE = ROOT / "book" / "architecture.md"
README = ROOT / "README.md"


def spans(text: str) -> list[str]:
    """The contents of the inline code spans of a markdown text."""
    return re.findall(r"`([^`\n]+)`", text)


def stems(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py")} - {"__init__"}


def names_module(text: str, stem: str, prefix: str = "") -> bool:
    """``text`` names the module in a code span: `tasks`, `tasks.py`, `run/lock`, `grpo_tutorial/run/lock.py`..."""
    forms = {stem, f"{stem}.py", f"{prefix}{stem}", f"{prefix}{stem}.py", f"grpo_tutorial/{prefix}{stem}.py"}
    return bool(forms & set(spans(text)))


def resolve(path: str) -> Path | None:
    """A path as the page writes it, in the repository; None when it is not one of ours."""
    if "<" in path or path.startswith("../") or "/" not in path and not path.endswith((".py", ".md", ".yml")):
        return None
    if path.split("/")[0] in ("run", "chapters", "data", "sampling", "doctor", "tools", "ppo") or "/" not in path and path.endswith(".py"):
        return PACKAGE / path
    return ROOT / path


# ---------------------------------------------------------------------------
# book/architecture.md
# ---------------------------------------------------------------------------


def test_the_page_names_every_module_of_the_package():
    text = PAGE.read_text()
    missing = [f"grpo_tutorial/{s}.py" for s in sorted(stems(PACKAGE)) if not names_module(text, s)]
    missing += [f"run/{s}.py" for s in sorted(stems(PACKAGE / "run")) if not names_module(text, s, "run/")]
    missing += [f"chapters/{s}.py" for s in sorted(stems(PACKAGE / "chapters")) if not names_module(text, s, "chapters/")]
    for sub in ("sampling", "doctor", "tools", "ppo"):  # a subpackage's section names its modules, as `base` or `sampling/base`
        section = text[text.index(f"\n`grpo_tutorial/{sub}/`"):]  # the paragraph that opens its section
        section = section[:section.index("\n### ")]
        missing += [f"{sub}/{s}.py" for s in sorted(stems(PACKAGE / sub)) if not names_module(section, s, f"{sub}/")]
    assert missing == [], f"book/architecture.md does not name {missing}: add them where they belong"


def test_every_path_the_page_names_exists():
    wrong = []
    for span in spans(PAGE.read_text()):
        path = span.split("::")[0]
        target = resolve(path)
        if target is not None and not target.exists():
            wrong.append(span)
    assert wrong == [], f"book/architecture.md names files that do not exist: {wrong}"


def test_every_test_the_page_names_exists():
    named = [s for s in spans(PAGE.read_text()) if "::" in s]
    assert len(named) >= 10
    wrong = []
    for span in named:
        path, test = span.split("::")
        tree = ast.parse((ROOT / path).read_text())
        if test not in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}:
            wrong.append(span)
    assert wrong == [], f"book/architecture.md names tests that do not exist: {wrong}"


def table_rows(text: str, header: str) -> list[list[str]]:
    """The rows of the markdown table whose header line starts with ``header`` (tests/test_stages.py reads them too)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_the_stage_tables_entry_points_exist_in_their_modules():
    text = PAGE.read_text()
    rows = table_rows(text, "| Stage | Module |")
    # numbered as grpo_tutorial.stages.STAGES: the input before stage 1, the history row after stage 5
    assert [r[0] for r in rows][:2] == ["before 1", "1. sample"] and rows[-1][0] == "after 5"
    wrong = []
    for stage, module, _, entry_points in rows:
        mod = importlib.import_module(f"grpo_tutorial.{spans(module)[0]}")
        wrong += [f"{module}.{name}" for name in spans(entry_points) if not hasattr(mod, name)]
    assert wrong == [], wrong


def test_the_page_lists_the_contract_of_test_public_api():
    import test_public_api

    text = PAGE.read_text()
    bullet = text[text.index("- `CONTRACT`, the stable core:"):text.index("Their names,")]
    listed = [s for s in spans(bullet) if s != "CONTRACT"]
    assert listed == test_public_api.CONTRACT


def test_the_page_is_in_the_book_and_linked_from_readme_and_contributing():
    assert "- file: book/architecture" in (ROOT / "_toc.yml").read_text()
    assert "](book/architecture.md)" in README.read_text()
    assert "](book/architecture.md)" in (ROOT / "CONTRIBUTING.md").read_text()
    assert "design of record" in PAGE.read_text()


# ---------------------------------------------------------------------------
# README.md's layout tables
# ---------------------------------------------------------------------------


def _readme_row(path: str) -> str:
    row = next(line for line in README.read_text().splitlines() if line.startswith(f"| `{path}` |"))
    return row


def test_readme_lists_every_notebook():
    listed = set(spans(_readme_row("notebooks/")))
    missing = sorted({p.stem for p in (ROOT / "notebooks").glob("*.ipynb")} - listed)
    assert missing == [], f"README's notebooks/ row lacks {missing}"


def test_readme_lists_every_chapter_tool():
    listed = set(spans(_readme_row("grpo_tutorial/chapters/")))
    missing = sorted(stems(PACKAGE / "chapters") - listed)
    assert missing == [], f"README's chapters/ row lacks {missing}"


def test_readme_lists_every_book_page():
    listed = set(spans(_readme_row("book/")))
    missing = sorted({p.name for p in (ROOT / "book").glob("*.md")} - listed)
    assert missing == [], f"README's book/ row lacks {missing}"


def test_readme_module_table_lists_every_top_level_module_and_only_those():
    text = README.read_text()
    rows = table_rows(text, "| Module | Stage / role |")
    listed = {name for row in rows for name in spans(row[0])}
    assert listed == stems(PACKAGE), (
        f"README's module table: missing {sorted(stems(PACKAGE) - listed)}, not modules {sorted(listed - stems(PACKAGE))}"
    )


def test_readme_names_every_run_module():
    text = README.read_text()
    paragraph = text[text.index("Around the stages, `grpo_tutorial/run/`"):]
    paragraph = paragraph[:paragraph.index("\n\n")]
    missing = sorted(stems(PACKAGE / "run") - set(spans(paragraph)))
    assert missing == [], f"README's run/ paragraph lacks {missing}"


@pytest.mark.parametrize("path", ["book/architecture.md", "README.md", "CONTRIBUTING.md"])
def test_no_document_cites_the_design_notes_outside_the_repository_as_a_source(path):
    """DESIGN.md is background: the package and its docs state facts directly or point at the architecture page."""
    text = (ROOT / path).read_text()
    if path == "book/architecture.md":
        text = text.replace("(`../shared/DESIGN.md`, outside this\nrepository) are background only", "")
    assert "DESIGN" not in text


def test_the_package_and_the_tests_do_not_cite_design_md():
    cited = [
        str(p.relative_to(ROOT)) for folder in ("grpo_tutorial", "tests", "benchmarks")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if p.name not in ("__main__.py", Path(__file__).name) and "DESIGN" in p.read_text()
    ]
    assert cited == [], f"these cite DESIGN.md, which contributors do not have: {cited}"

"""The book's conventions, checked on every chapter notebook and on the book config.

Every notebook in notebooks/ must:
- be committed without outputs or execution counts;
- start with a "# N. Title" markdown cell (N from the file name, e.g. 02_...),
  then a Colab-only install cell that pip-installs the repository named in
  _config.yml, then a cell that calls describe_environment();
- number its "## " sections "N.k ..." and end with "## Summary" and "## Exercises";
- put every solution in a dropdown (":class: dropdown");
- put solution code in executed code cells of a gated solution
  ({solution-start} ... {solution-end}), never in a code fence of a plain
  {solution} block, so that nbmake and the book build run it after the chapter's
  cells; a solution cell too slow for a CPU is tagged "skip-execution", says so in
  its first line, and is listed with its reason in SKIPPED_SOLUTIONS;
- carry a per-notebook timeout (<= 600 s) for both nbmake and myst-nb.
Every notebook and book page is listed in _toc.yml, and everything listed exists.

To clear the outputs of notebooks before committing:
    .venv/bin/python tests/test_notebooks_meta.py --clear notebooks/*.ipynb
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_TIMEOUT = 600
NAME_RE = re.compile(r"^(\d{2})_[a-z0-9_]+\.ipynb$")
# (notebook, exercise label): why its solution code is not executed
SKIPPED_SOLUTIONS = {
    ("08_tiny_transformer.ipynb", "ch8-ex-target"): "trains two recipe models for all their GRPO steps",
    ("08_tiny_transformer.ipynb", "ch8-ex-mu"): "a full GRPO run of the recipe with mu = 2",
    ("13_thinking_longer.ipynb", "ch13-ex-warm"): "two warm starts of the long-addition model, minutes each",
    ("16_tools_in_the_loop.ipynb", "ch16-ex-unmasked"): "two more GRPO runs of 20 steps and a scoring pass",
    ("17_why_no_critic.ipynb", "ch17-ex-critic"): "two PPO runs of 20 steps from the warm start, minutes on a CPU",
}
SKIP_TAG = "skip-execution"
SKIP_FIRST_LINE = "# Not run by the tests or the book build:"
PLAIN_SOLUTION_RE = re.compile(r"^(?P<fence>`{3,}|:{3,})\{solution\}[ \t]*(?P<label>\S*)[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S)
CODE_FENCE_RE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*(\{code-cell\}|\{code-block\}|\{code\}|[A-Za-z]\w*)", re.M)
SOLUTION_RE = re.compile(r"^(?:`{3,}|:{3,})\{solution(?:-start)?\}[^\n]*\n((?:[ \t]*:[^\n]*\n)*)", re.M)


# ---------------------------------------------------------------- helpers


def load_config() -> dict:
    """The parsed _config.yml."""
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf8"))


def repository_url() -> str:
    """The repository URL, defined once in _config.yml."""
    return load_config()["repository"]["url"]


def toc_files(toc: dict) -> list[str]:
    """Every document named in a jb-book _toc.yml: the root, then all `file:` entries."""
    found = [toc["root"]]

    def walk(node) -> None:
        if isinstance(node, dict):
            if "file" in node:
                found.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return found


def book_documents(root: Path) -> set[str]:
    """Pages and notebooks that must appear in the toc, as suffix-less posix paths."""
    docs = {p.relative_to(root).with_suffix("").as_posix() for p in (root / "notebooks").glob("*.ipynb")}
    for pattern in ("*.md", "*.ipynb"):
        for page in (root / "book").rglob(pattern):
            rel = page.relative_to(root)
            if rel.parts[:2] == ("book", "data") or ".ipynb_checkpoints" in rel.parts:
                continue
            docs.add(rel.with_suffix("").as_posix())
    return docs


def notebook_problems_outputs(nb: nbformat.NotebookNode) -> list[str]:
    """Cells that carry outputs or execution counts (both must be empty when committed)."""
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if cell.get("outputs"):
            problems.append(f"cell {i} has {len(cell.outputs)} output(s)")
        if cell.get("execution_count") is not None:
            problems.append(f"cell {i} has execution_count={cell.execution_count}")
    return problems


def clear_outputs(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Remove outputs and execution counts in place; return the notebook."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def headings(nb: nbformat.NotebookNode, level: int) -> list[str]:
    """Text of the markdown headings of one level, outside fenced code blocks."""
    prefix = "#" * level + " "
    found = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        fence = ""  # the open fence ("```", "````", "~~~"), or "" outside any fence
        for line in cell.source.splitlines():
            stripped = line.strip()
            marker = re.match(r"(`{3,}|~{3,})", stripped)
            if fence:
                # only a bare run of the same character, at least as long, closes it
                # (so a ```python block nested in a ````{solution} stays inside)
                if marker and stripped == marker.group(1) and marker.group(1)[0] == fence[0] and len(marker.group(1)) >= len(fence):
                    fence = ""
            elif marker:
                fence = marker.group(1)
            elif line.startswith(prefix):
                found.append(line[len(prefix):].strip())
    return found


def solutions_without_dropdown(markdown: str) -> list[str]:
    """The opening lines of {solution} / {solution-start} directives lacking :class: dropdown."""
    bad = []
    for match in SOLUTION_RE.finditer(markdown):
        options = match.group(1)
        classes = re.findall(r":class:\s*([^\n]*)", options)
        if not any("dropdown" in c.split() for c in classes):
            bad.append(match.group(0).splitlines()[0])
    return bad


def plain_solutions_with_code(markdown: str) -> list[str]:
    """Labels of plain {solution} blocks whose body holds a code fence (code that never runs)."""
    return [m.group("label") for m in PLAIN_SOLUTION_RE.finditer(markdown) if CODE_FENCE_RE.search(m.group("body"))]


def solution_code_cells(nb: nbformat.NotebookNode) -> list[tuple[str, nbformat.NotebookNode]]:
    """(label, cell) for every code cell between a {solution-start} and its {solution-end}."""
    found, label = [], None
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                start = re.match(r"^(?:`{3,}|:{3,})\{solution-start\}\s*(\S+)", line)
                if start:
                    label = start.group(1)
                elif re.match(r"^(?:`{3,}|:{3,})\{solution-end\}", line):
                    label = None
        elif label is not None:
            found.append((label, cell))
    return found


def code_cells(nb: nbformat.NotebookNode) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


# ------------------------------------------------------ the helpers themselves


def test_helpers_detect_outputs_and_clear_them():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 1. T"),
        nbformat.v4.new_code_cell("1 + 1", execution_count=3, outputs=[nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=3)]),
        nbformat.v4.new_code_cell("x = 1"),
    ]
    assert notebook_problems_outputs(nb) == ["cell 1 has 1 output(s)", "cell 1 has execution_count=3"]
    assert notebook_problems_outputs(clear_outputs(nb)) == []


def test_solution_check_finds_missing_dropdown():
    text = (
        "```{solution} ex-a\n:class: dropdown\nok\n```\n"
        "````{solution-start} ex-b\n:label: x\n````\n"
        ":::{solution} ex-c\n:class: tip dropdown\n:::\n"
        "```{solution} ex-d\nno options\n```\n"
    )
    assert solutions_without_dropdown(text) == ["````{solution-start} ex-b", "```{solution} ex-d"]


def test_plain_solution_with_code_is_found():
    text = (
        "````{solution} ex-a\n:class: dropdown\nProse.\n```python\nx = 1\n```\n````\n"
        "```{solution} ex-b\n:class: dropdown\nOnly prose, with `inline code`.\n```\n"
        "```{solution-start} ex-c\n:class: dropdown\n```\n"
    )
    assert plain_solutions_with_code(text) == ["ex-a"]


def test_solution_code_cells_are_found_between_start_and_end():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("chapter = 1"),
        nbformat.v4.new_markdown_cell("```{solution-start} ex-a\n:class: dropdown\n```\nProse."),
        nbformat.v4.new_code_cell("assert True"),
        nbformat.v4.new_markdown_cell("```{solution-end}\n```"),
        nbformat.v4.new_code_cell("after = 2"),
    ]
    assert [(label, cell.source) for label, cell in solution_code_cells(nb)] == [("ex-a", "assert True")]


def test_headings_skip_code_fences():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("## 3.1 A\n```python\n## not a heading\n```\n## Summary")]
    assert headings(nb, 2) == ["3.1 A", "Summary"]


def test_toc_files_walks_parts_and_sections():
    toc = {
        "format": "jb-book",
        "root": "book/intro",
        "parts": [{"caption": "A", "chapters": [{"file": "x", "sections": [{"file": "y"}]}]}],
    }
    assert toc_files(toc) == ["book/intro", "x", "y"]


# ------------------------------------------------------------- the config


def test_config_settings():
    config = load_config()
    assert config["title"] == "GRPO from the Ground Up"
    execute = config["execute"]
    assert execute["execute_notebooks"] == "force", "the cache cannot see package changes"
    assert execute["allow_errors"] is False
    assert 0 < execute["timeout"] <= MAX_TIMEOUT
    for pattern in [
        ".venv", "_build", ".pytest_cache", ".mathjax", ".hypothesis", "README.md", "CONTRIBUTING.md", "benchmarks",
        "tests",
    ]:
        assert pattern in config["exclude_patterns"], pattern
    assert config["repository"]["branch"] == "main"
    assert config["launch_buttons"]["colab_url"].startswith("https://colab.research.google.com")
    assert "sphinx_exercise" in config["sphinx"]["extra_extensions"]
    for bib in config["bibtex_bibfiles"]:
        assert (ROOT / bib).is_file(), bib


def test_mathjax_is_local():
    """MathJax must come from the build (npm package), never from a CDN."""
    sphinx = load_config()["sphinx"]["config"]
    assert "://" not in sphinx["mathjax_path"]
    assert sphinx["mathjax_path"].endswith("tex-chtml.js")
    assert not (ROOT / "_static").exists(), "JB1 would turn every MathJax .js into a script tag"


def test_repository_url_is_written_once_in_config():
    url = repository_url()
    assert url.startswith("https://github.com/")
    assert (ROOT / "_config.yml").read_text(encoding="utf8").count(url) == 1


# ------------------------------------------------------------------ the toc


def test_toc_lists_every_document_and_nothing_else():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf8"))
    assert toc["format"] == "jb-book"
    assert toc["root"] == "book/intro"
    listed = toc_files(toc)
    assert len(listed) == len(set(listed)), "a document is listed twice"
    missing_files = [f for f in listed if not any((ROOT / f"{f}{ext}").is_file() for ext in (".md", ".ipynb"))]
    assert not missing_files, f"listed in _toc.yml but no such file: {missing_files}"
    unlisted = sorted(book_documents(ROOT) - set(listed))
    assert not unlisted, f"not listed in _toc.yml: {unlisted}"


# ---------------------------------------------------------- every notebook


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ is empty"


@pytest.fixture(params=NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def notebook(request) -> tuple[Path, nbformat.NotebookNode]:
    path = request.param
    return path, nbformat.read(path, as_version=4)


def test_file_name(notebook):
    path, _ = notebook
    assert NAME_RE.match(path.name), f"{path.name}: expected NN_lowercase_words.ipynb"


def committed_version(path: Path) -> nbformat.NotebookNode:
    """The notebook as git's index holds it (what a commit stores), or the file outside a git checkout.

    `make test` executes the notebooks in parallel with these tests, and CI's ``--overwrite`` writes
    their outputs into the working tree while they run; what must be free of outputs is what is
    committed.
    """
    import subprocess

    shown = subprocess.run(["git", "-C", str(ROOT), "show", f":{path.relative_to(ROOT).as_posix()}"],
                           capture_output=True, text=True)
    if shown.returncode != 0:  # not a git checkout (an sdist, a copy): the file itself
        return nbformat.read(path, as_version=4)
    return nbformat.reads(shown.stdout, as_version=4)


def test_no_outputs_committed(notebook):
    path, _ = notebook
    nb = committed_version(path)
    problems = notebook_problems_outputs(nb)
    assert not problems, f"{path.name}: {problems}; clear with: python tests/test_notebooks_meta.py --clear {path.name}"


def test_metadata_kernel_and_timeout(notebook):
    path, nb = notebook
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", path.name
    timeout = nb.metadata.get("execution", {}).get("timeout")
    assert isinstance(timeout, int) and 0 < timeout <= MAX_TIMEOUT, f"{path.name}: execution.timeout={timeout!r}"
    mystnb = nb.metadata.get("mystnb", {}).get("execution_timeout")
    assert mystnb == timeout, f"{path.name}: mystnb.execution_timeout={mystnb!r} must equal execution.timeout={timeout}"


def test_title_cell(notebook):
    path, nb = notebook
    first = nb.cells[0]
    assert first.cell_type == "markdown", f"{path.name}: the first cell must be the title"
    number = int(path.name[:2])
    title = first.source.splitlines()[0]
    assert re.match(rf"^# {number}\. \S", title), f"{path.name}: title {title!r}, expected '# {number}. ...'"
    assert len(first.source.split()) > 30, f"{path.name}: the title cell needs a 'what you will learn' paragraph"


def test_colab_install_cell(notebook):
    path, nb = notebook
    cell = code_cells(nb)[0]
    assert 'if "google.colab" in sys.modules:' in cell, f"{path.name}: the first code cell must be Colab-only"
    assert "sys.executable" in cell and '"pip"' in cell, f"{path.name}: install with sys.executable -m pip"
    assert "git+" in cell, f"{path.name}: install the package from the git repository"
    urls = re.findall(r"https?://[^\s\"'{}]+", cell)
    assert urls, f"{path.name}: no repository URL in the install cell"
    assert set(urls) == {repository_url()}, f"{path.name}: {urls} != repository.url in _config.yml"


def test_environment_cell(notebook):
    path, nb = notebook
    cell = code_cells(nb)[1]
    assert "from grpo_tutorial.env import describe_environment" in cell, path.name
    assert "describe_environment()" in cell, path.name


def test_sections_summary_and_exercises(notebook):
    path, nb = notebook
    number = int(path.name[:2])
    sections = headings(nb, 2)
    assert sections[-2:] == ["Summary", "Exercises"], f"{path.name}: must end with Summary then Exercises, got {sections[-2:]}"
    numbered = sections[:-2]
    assert numbered, f"{path.name}: no numbered sections"
    expected = [f"{number}.{k}" for k in range(1, len(numbered) + 1)]
    got = [s.split()[0] for s in numbered]
    assert got == expected, f"{path.name}: section numbers {got}, expected {expected}"
    assert len(headings(nb, 1)) == 1, f"{path.name}: exactly one '# ' title"


def test_exercises_have_dropdown_solutions(notebook):
    path, nb = notebook
    markdown = "\n".join(c.source + "\n" for c in nb.cells if c.cell_type == "markdown")
    assert "{exercise}" in markdown or "{exercise-start}" in markdown, f"{path.name}: no exercise"
    assert re.search(r"\{solution(-start)?\}", markdown), f"{path.name}: no solution"
    assert not solutions_without_dropdown(markdown), f"{path.name}: {solutions_without_dropdown(markdown)}"


def test_solution_code_is_executed(notebook):
    """No code in plain {solution} blocks; gated solution cells run unless listed as skipped."""
    path, nb = notebook
    markdown = "\n".join(c.source + "\n" for c in nb.cells if c.cell_type == "markdown")
    plain = plain_solutions_with_code(markdown)
    assert not plain, (
        f"{path.name}: solutions {plain} hold code in a plain {{solution}} block, which nothing executes; "
        "use {solution-start} ... {solution-end} with the code in code cells that assert the claim"
    )
    skipped = set()
    for label, cell in solution_code_cells(nb):
        if SKIP_TAG in cell.metadata.get("tags", []):
            skipped.add(label)
            assert cell.source.startswith(SKIP_FIRST_LINE), (
                f"{path.name}: skipped solution cell of {label} must start with {SKIP_FIRST_LINE!r} and the reason"
            )
    listed = {label for (name, label) in SKIPPED_SOLUTIONS if name == path.name}
    assert skipped == listed, f"{path.name}: skipped solution cells {sorted(skipped)}, SKIPPED_SOLUTIONS lists {sorted(listed)}"


def test_every_skipped_solution_is_listed_with_a_reason():
    for (name, label), reason in SKIPPED_SOLUTIONS.items():
        assert (ROOT / "notebooks" / name).exists(), name
        assert label and reason.strip(), (name, label)


def test_at_least_one_figure(notebook):
    path, nb = notebook
    assert any("plt.show()" in c for c in code_cells(nb)), f"{path.name}: no figure"


# ----------------------------------------------------------------- command line


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "--clear":
        sys.exit("usage: python tests/test_notebooks_meta.py --clear NOTEBOOK.ipynb ...")
    for name in sys.argv[2:]:
        nb = nbformat.read(name, as_version=4)
        nbformat.write(clear_outputs(nb), name)
        print("cleared", name)


def test_headings_skip_code_nested_in_directives():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(
        "## Exercises\n````{solution} x\n:class: dropdown\n```python\n# a comment\n```\n## Not a heading\n````\n## Summary"
    )]
    assert headings(nb, 2) == ["Exercises", "Summary"]


def test_the_book_excludes_every_environment_the_makefile_makes():
    """`make test-colab` or `make test-torch-latest` leaves a virtual environment in the tree; a
    `make book` after it must not read that environment's package files as book sources."""
    import fnmatch
    import re

    makefile = (ROOT / "Makefile").read_text(encoding="utf8")
    made = re.findall(r"^[A-Z_]*VENV\s*\?=\s*(\S+)", makefile, flags=re.M)
    assert {".venv", ".venv-colab", ".venv-torch-latest"} <= set(made), made
    patterns = load_config()["exclude_patterns"]
    for folder in made:
        assert any(fnmatch.fnmatch(folder, p) for p in patterns), f"{folder} is not in _config.yml's exclude_patterns"

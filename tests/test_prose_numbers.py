"""Prose cannot drift from outputs: the prose-number rule, checked on every notebook.

THE RULE (CONTRIBUTING.md, "Numbers in prose"). In a notebook's markdown cells, a
*measured-looking* number is

- a decimal (``0.35``, ``.5``, ``2.52x``), a number in scientific notation (``1e-4``),
- a percentage (``53%``), or
- a signed number (``+0.35``, ``-3``, ``−3``, ``±0.09``).

Plain unsigned integers (group size 8, 200 steps, seed 0, chapter 4, 2026) are not
checked: they are overwhelmingly settings, counts and references, and a rule that
flagged them would be ignored. Every measured-looking number in prose must be one of:

1. **glued**: inserted with MyST-NB's ``{glue:text}`name:fmt``` role (it then sits in a
   role, not in the prose, and is counted as bound);
2. **typed in the notebook's code**: its value equals a number literal of one of the
   notebook's code cells. Such a number is an *input* (a setting such as
   ``clip_eps=0.2``, a reward tensor, a seed) or the value a cell *asserts*
   (``assert round(share, 2) == 0.53`` binds "53%"): either way, changing the code
   changes or fails the cell, and the checker then flags the stale prose. A percentage
   matches its fraction (53% matches 0.53); signs are ignored;
3. **a constant of the method** in ``ALLOWED_CONSTANTS`` (PPO's clip range and its
   band edges, DAPO's clip-higher), which a page may name without code around it;
   written as a plain decimal (``0.2``, not ``20%``, which is a share, not the constant).

Exempt, because they are not prose that states a result:

- formulas: inside math (``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``) signs and integers
  are not checked (``$x^{-1}$``, ``$1 - 1/G$``), but a decimal or a percentage is, like any
  other: a printed output copied into math (``$[+1.08, -0.85]$``) must be bound too. Write
  an exact value exactly (``$1/\\sqrt 2$``, ``$10/3$``), or let a cell assert it. ``{math}``
  blocks count as math;
- code spans and code blocks (````` ```python `````, ``{code-block}``), and the text of
  every MyST role (``{doc}``, ``{ref}``, ``{term}``, ``{glue:text}``, ...);
- link targets and bare URLs, directive fence and option lines (``:class: dropdown``);
- a heading's own section number (``## 3.7 ...``) and cross-references: a number right
  after "section", "sections", "§", "chapter", "chapters", "Section", "Chapter",
  "Table", "Figure", "equation", "Eq.", in a list such as "sections 4.6 and 4.8";
- version numbers after a software name (``TRL 1.16``, ``Python 3.10``, ``torch 2.13.0``)
  and numbers that are part of a name (``Qwen2.5-0.5B``, ``k3``, ``SmolLM2``);
- numbers quoted from a paper: any sentence that carries a ``{cite:p}``/``{cite:t}``
  role (a paper's reported settings and results, with the citation next to them);
- ranges of dates (``2026-11-22``).

Run as a script to list the offending sentences of some notebooks:

    python tests/test_prose_numbers.py notebooks/04_clipped_objective.ipynb

With ``--stats`` it also prints how many numbers the rule binds, and how.
"""

from __future__ import annotations

import io
import re
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# Notebooks whose prose is still being converted to the rule (issue 25). This list
# must end EMPTY; the coordinator checks it. Each entry names who converts it.
NOT_YET_CONVERTED: dict[str, str] = {
}

# Constants of the method that prose may name without a code cell typing them.
ALLOWED_CONSTANTS: dict[float, str] = {
    0.2: "PPO's clip range epsilon",
    0.8: "1 - epsilon, PPO's lower band edge",
    1.2: "1 + epsilon, PPO's upper band edge",
    0.28: "DAPO's clip-higher epsilon_high",
    1.28: "1 + epsilon_high, DAPO's upper band edge",
}

# --------------------------------------------------------------- what is a number

NUMBER_RE = re.compile(
    r"""
    (?<![\w.])                          # not inside a word or after a decimal point
    (?P<sign>[+\-−±](?=[.\d]))?         # an explicit sign
    (?P<body>\d+(?:\.\d+)?|\.\d+)       # digits, optional fraction
    (?P<exp>[eE][+\-−]?\d+)?            # scientific notation
    (?P<percent>\s?%)?                  # a percentage
    """,
    re.X,
)
# a number preceded by a hyphenated name that starts with a letter: Qwen2.5-0.5B
IN_NAME_BEFORE_RE = re.compile(r"[A-Za-z][\w.]*-$")
# the word before a cross-reference number (a list of numbers may follow it)
REFERENCE_RE = re.compile(
    r"(?:\b(?:[Ss]ections?|[Cc]hapters?|[Tt]ables?|[Ff]igures?|[Ee]quations?|Eq\.|[Ss]teps? of section)|§)"
    r"\s*(?:\d+(?:\.\d+)*(?:\s*(?:,|and|or|to|–|-)\s*)?)*$"
)
VERSION_RE = re.compile(
    r"\b(?:TRL|Python|PyTorch|torch|transformers|CUDA|accelerate|vLLM|DeepSpeed|Jupyter Book|MyST-NB|"
    r"jupyter-book|numpy|version|v)\s*$"
)
DATE_RE = re.compile(r"\b\d{4}-\d{2}(?:-\d{2})?\b")


def is_measured_looking(match: re.Match) -> bool:
    """A decimal, a percentage, scientific notation or a signed number."""
    return bool(match["sign"] or "." in match["body"] or match["exp"] or match["percent"])


def number_value(match: re.Match) -> float:
    """The magnitude the text states: 53% -> 0.53, -0.35 -> 0.35."""
    exp = (match["exp"] or "").replace("−", "-")
    value = float(match["body"] + exp)
    return value / 100 if match["percent"] else value


# --------------------------------------------------------------- what is prose

CODE_LANGS = re.compile(r"^(?:\{(?:code-cell|code-block|code|eval-rst|raw)\}.*|[A-Za-z][\w+-]*)?\s*$")
FENCE_RE = re.compile(r"^\s*(?P<fence>`{3,}|~{3,}|:{3,})\s*(?P<info>.*)$")
ROLE_RE = re.compile(r"\{(?P<name>[\w:.-]+)\}(?P<ticks>`+)(?P<body>.*?)(?P=ticks)", re.S)
CODE_SPAN_RE = re.compile(r"(?P<ticks>`+)(?P<body>.+?)(?P=ticks)", re.S)
MATH_RES = [
    re.compile(r"\$\$.+?\$\$", re.S),
    re.compile(r"\\\[.+?\\\]", re.S),
    re.compile(r"\\\(.+?\\\)", re.S),
    re.compile(r"(?<![\\$])\$(?!\s)[^$\n]+?(?<![\s\\])\$(?!\d)"),
]
LINK_TARGET_RE = re.compile(r"\]\([^)]*\)")
URL_RE = re.compile(r"https?://\S+")
HTML_COMMENT_RE = re.compile(r"<!--.*?-->", re.S)
OPTION_LINE_RE = re.compile(r"^\s*:[\w-]+:.*$")
HEADING_NUMBER_RE = re.compile(r"^(#{1,6}\s+)\d+(?:\.\d+)*\.?(?=\s)")
CITE = "\x00CITE\x00"  # stands in for a citation role, to exempt its sentence
GLUE = "\x00GLUE\x00"  # stands in for a glue role, to count it
MATH_MARK = "\x01"  # precedes a decimal taken out of a math span


def strip_fences(markdown: str) -> str:
    """Drop code blocks; turn {math} blocks into $$...$$; of other directives keep the body only."""
    out, stack = [], []  # stack of (fence, kind), kind in "code", "math", "directive"
    for line in markdown.splitlines():
        m = FENCE_RE.match(line)
        if m:
            fence, info = m["fence"], m["info"].strip()
            if stack and fence[0] == stack[-1][0][0] and len(fence) >= len(stack[-1][0]) and not info:
                if stack.pop()[1] == "math":  # a bare fence of the same kind closes the innermost block
                    out.append("$$")
                continue
            if not (stack and stack[-1][1] == "code"):  # a fence inside a code block is code
                if info.startswith("{math}"):
                    kind = "math"
                    out.append("$$")
                elif fence[0] != ":" and CODE_LANGS.match(info):
                    kind = "code"
                else:
                    kind = "directive"
                stack.append((fence, kind))
                continue
        if stack and stack[-1][1] == "code":
            continue
        if stack and OPTION_LINE_RE.match(line):
            continue  # a directive option such as :class: dropdown or :label: eq-1
        out.append(line)
    return "\n".join(out)


def math_numbers(m: re.Match) -> str:
    """A math span, reduced to the decimals and percentages it states (signs dropped).

    Formulas are exempt, but a decimal inside ``$...$`` is still a stated number: a
    printed output copied into math (``$[+1.08, -0.85]$``) must be bound like any other.
    """
    found = [
        n["body"] + (n["exp"] or "") + (n["percent"] or "").strip()
        for n in NUMBER_RE.finditer(m.group(0).replace("\\%", "%"))
        if "." in n["body"] or n["percent"]
    ]
    return "MATH" + "".join(f" {MATH_MARK}{x}" for x in found)


def prose_of(markdown: str) -> str:
    """The prose of a markdown cell: exempt spans removed, citations and glue marked."""
    text = HTML_COMMENT_RE.sub(" ", markdown)
    text = strip_fences(text)
    text = "\n".join(HEADING_NUMBER_RE.sub(r"\1", line) for line in text.splitlines())

    def role(m: re.Match) -> str:
        if m["name"].startswith("cite"):
            return CITE
        if m["name"].startswith("glue"):
            return GLUE
        return "ROLE"

    text = ROLE_RE.sub(role, text)
    text = CODE_SPAN_RE.sub("CODE", text)
    for math in MATH_RES:
        text = math.sub(math_numbers, text)
    text = LINK_TARGET_RE.sub("]", text)
    text = URL_RE.sub("URL", text)
    return text


SENTENCE_END_RE = re.compile(r"(?<=[.!?:;])\s+(?=[A-Z*(\[\"“_\x00-])|\n\s*\n|\n\s*[-*+]\s|\n\s*\d+\.\s|\n\s*\|")


def sentences(prose: str) -> list[str]:
    """Split prose into sentences (and list items, table rows), whitespace collapsed."""
    parts = SENTENCE_END_RE.split(prose)
    return [" ".join(p.split()) for p in parts if p.strip()]


# ------------------------------------------------------------ the code's literals


def code_literals(nb: nbformat.NotebookNode) -> set[float]:
    """Every number literal typed in the notebook's code cells (IPython magics skipped)."""
    found: set[float] = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(source + "\n").readline))
        except (tokenize.TokenError, IndentationError, SyntaxError):
            continue
        for tok in tokens:
            if tok.type == tokenize.NUMBER:
                text = tok.string.replace("_", "").rstrip("jJ")
                try:
                    found.add(float(int(text, 0)) if text[:2].lower() in ("0x", "0o", "0b") else float(text))
                except ValueError:
                    continue
    return found


def same_number(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-12 * max(1.0, abs(a), abs(b))


# ---------------------------------------------------------------- the checker


@dataclass
class Report:
    """What the rule found in one notebook."""

    offending: list[tuple[int, str, str]] = field(default_factory=list)  # (cell, number, sentence)
    glued: int = 0  # glue roles
    typed: int = 0  # numbers matching a code literal
    constants: int = 0  # numbers in ALLOWED_CONSTANTS
    cited: int = 0  # numbers in a sentence with a citation
    references: int = 0  # section numbers, versions, names, dates

    @property
    def bound(self) -> int:
        """Numbers the rule holds to a cell: glued, or typed in the code."""
        return self.glued + self.typed


def check_notebook(nb: nbformat.NotebookNode) -> Report:
    """Apply the rule to every markdown cell of one notebook."""
    literals = code_literals(nb)
    report = Report()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for sentence in sentences(prose_of(cell.source)):
            report.glued += sentence.count(GLUE)
            for m in NUMBER_RE.finditer(sentence):
                if not is_measured_looking(m):
                    continue
                before = sentence[: m.start()]
                if IN_NAME_BEFORE_RE.search(before) or REFERENCE_RE.search(before) or VERSION_RE.search(before):
                    report.references += 1
                    continue
                if any(d.start() <= m.start() < d.end() for d in DATE_RE.finditer(sentence)):
                    report.references += 1
                    continue
                if CITE in sentence:
                    report.cited += 1
                    continue
                value = number_value(m)
                if not m["percent"] and any(same_number(value, c) for c in ALLOWED_CONSTANTS):
                    report.constants += 1
                elif any(same_number(value, lit) for lit in literals):
                    report.typed += 1
                else:
                    shown = sentence.replace(CITE, "{cite}").replace(GLUE, "{glue}").replace(MATH_MARK, "")
                    report.offending.append((index, m.group(0).strip(), shown))
    return report


def format_offending(name: str, report: Report) -> str:
    lines = [f"{name}: {len(report.offending)} number(s) typed by hand in prose"]
    for index, number, sentence in report.offending:
        lines.append(f"  cell {index}: {number!r} in: {sentence}")
    lines.append(
        "  Fix: let the cell that computes it print it and assert the claim, and write 'the cell above prints ...'; "
        "or insert it with {glue:text}`name:fmt`; or, if it is a setting, type it in the code. See CONTRIBUTING.md."
    )
    return "\n".join(lines)


# ------------------------------------------------------------------- the tests


def _nb(*cells: tuple[str, str]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src) for kind, src in cells
    ]
    return nb


def _flagged(markdown: str, code: str = "x = 1") -> list[str]:
    return [number for _, number, _ in check_notebook(_nb(("code", code), ("md", markdown))).offending]


def test_measured_numbers_typed_by_hand_are_flagged():
    text = "Accuracy rose from 0.30 to 0.45, a gain of +15 points, 53% of the time; ratio 2.52x, lr 3e-4."
    assert _flagged(text) == ["0.30", "0.45", "+15", "53%", "2.52", "3e-4"]


def test_plain_integers_are_not_checked():
    assert _flagged("We train for 200 steps with 8 prompts in 2026, seed 0, chapter 4.") == []


def test_numbers_typed_in_code_or_asserted_are_bound():
    code = "clip = dict(clip_eps=0.3)\nassert round(share, 2) == 0.53\nrewards = [-0.5, 1.5]"
    text = "With clip 0.3 the share is 53%, rewards -0.5 and +1.5; but 0.54 is not typed."
    assert _flagged(text, code) == ["0.54"]
    report = check_notebook(_nb(("code", code), ("md", text)))
    assert report.typed == 4


def test_glue_code_roles_and_links_are_exempt():
    text = (
        "The gain is {glue:text}`gain:.3f` with `lr=0.7` (see {doc}`chapter <04_x>` and "
        "[a link](https://x.org/v1.5)), $x^{-1} = 1 - 1/G$."
    )
    assert _flagged(text) == []
    assert check_notebook(_nb(("md", text))).glued == 1


def test_decimals_in_math_are_checked():
    code = "beta = 0.04"
    text = "With $\\beta = 0.04$ the advantages are $[+1.08, -0.85]$, $$x = 0.5$$, \\(y = 90\\%\\)."
    assert _flagged(text, code) == ["1.08", "0.85", "0.5", "90%"]


def test_code_blocks_are_exempt_but_directive_bodies_are_prose():
    text = (
        "```python\nx = 0.35\n```\n"
        "````{admonition} Box\n:class: important\nThe ratio reached 2.52.\n```text\n0.9\n```\n````\n"
        "```{math}\n:label: eq-1\nx^{-1} = 0.77\n```\n"
    )
    assert _flagged(text) == ["2.52", "0.77"]


def test_section_numbers_versions_names_dates_are_exempt():
    text = (
        "## 3.7 Length bias\n\nAs section 4.6 and sections 8.7 and 10.9 show (§5.6), TRL 1.16 and "
        "Python 3.10 run Qwen2.5-0.5B-Instruct with k3 since 2026-11-22."
    )
    assert _flagged(text) == []


def test_cited_sentences_and_constants_are_exempt():
    text = "DeepSeekMath {cite:p}`shao2024` reports a KL weight of 0.04. The band is [0.8, 1.2] with 0.28 above."
    assert _flagged(text) == []
    assert _flagged("Clipped 20% of the tokens.") == ["20%"]  # a share, not the clip range
    assert _flagged("Our run reached 0.04, as reported.") == ["0.04"]


def test_offending_sentence_is_reported():
    nb = _nb(("md", "First sentence. The clipped run logged about 0.35 here.\n\nNext."))
    (index, number, sentence), = check_notebook(nb).offending
    assert (index, number, sentence) == (0, "0.35", "The clipped run logged about 0.35 here.")


def test_glue_helper_records_the_value_and_is_a_no_op_without_myst_nb(monkeypatch):
    from grpo_tutorial.env import glue

    calls = []
    fake = type(sys)("myst_nb")
    fake.glue = lambda name, value, display=True: calls.append((name, value, display))
    monkeypatch.setitem(sys.modules, "myst_nb", fake)
    assert glue("gain", 0.25) == 0.25
    assert calls == [("gain", 0.25, False)]
    monkeypatch.setitem(sys.modules, "myst_nb", None)  # as in Colab: import fails
    assert glue("gain", 0.5) == 0.5
    assert calls == [("gain", 0.25, False)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_prose_numbers_come_from_cells(path):
    report = check_notebook(nbformat.read(path, as_version=4))
    if path.name in NOT_YET_CONVERTED:
        assert report.offending, f"{path.name} complies now: remove it from NOT_YET_CONVERTED"
        pytest.skip(f"not yet converted ({NOT_YET_CONVERTED[path.name]}): {len(report.offending)} number(s)")
    assert not report.offending, format_offending(path.name, report)


def test_not_yet_converted_lists_only_existing_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert set(NOT_YET_CONVERTED) <= names, set(NOT_YET_CONVERTED) - names


# -------------------------------------------------------------- command line


def main(argv: list[str]) -> int:
    stats = "--stats" in argv
    paths = [Path(a) for a in argv if a != "--stats"] or NOTEBOOKS
    bad = 0
    totals = Report()
    for path in paths:
        report = check_notebook(nbformat.read(path, as_version=4))
        for key in ("glued", "typed", "constants", "cited", "references"):
            setattr(totals, key, getattr(totals, key) + getattr(report, key))
        totals.offending += report.offending
        if report.offending:
            bad += 1
            print(format_offending(path.name, report))
        elif not stats:
            print(f"{path.name}: ok")
        if stats:
            print(
                f"{path.name}: offending {len(report.offending)}, glued {report.glued}, typed in code "
                f"{report.typed}, constants {report.constants}, cited {report.cited}, references {report.references}"
            )
    if stats:
        print(
            f"all: bound {totals.bound} (glued {totals.glued}, typed in code {totals.typed}), "
            f"offending {len(totals.offending)}, constants {totals.constants}, cited {totals.cited}, "
            f"references {totals.references}"
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

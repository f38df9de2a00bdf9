"""The pure parts of .ci/check_book.py (make check-book): raw TeX, repository links, a page's verdict.

The browser part needs Chromium and a built book, so it runs in ``make check-book``
(and in .ci/run after the book build), not here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_book", ROOT / ".ci" / "check_book.py")
check_book = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_book)

REPO = "https://github.com/grpo-tutorial/grpo-from-the-ground-up"
COLAB = "https://colab.research.google.com/github/grpo-tutorial/grpo-from-the-ground-up/blob/main/"


@pytest.mark.parametrize(
    "text",
    [
        "the objective $$J = E[r]$$ is",
        r"where \(A_i\) is the advantage",
        r"the block \[ x^2 \] here",
        r"a ratio \frac{\pi}{\pi_{old}} left raw",
        r"sum \sum_i r_i untypeset",
        "inline $r_i - \\bar r$ untypeset",
        "inline $A^2$ untypeset",
    ],
)
def test_raw_tex_is_found(text):
    assert len(check_book.find_raw_tex(text)) >= 1


@pytest.mark.parametrize(
    "text",
    [
        "Typeset math leaves plain words: the advantage A and the ratio r.",
        "It costs $5 and $10 a month.",  # dollar signs in prose, no TeX inside
        "a backslash path C:\\Users\\me and \\n in prose",
        r"the word \fraction is not a macro we know",
        "",
    ],
)
def test_plain_text_passes(text):
    assert check_book.find_raw_tex(text) == []


def test_raw_tex_snippet_shows_context():
    (snippet,) = check_book.find_raw_tex("so the loss is \\frac{1}{G} times the sum")
    assert "\\frac" in snippet and "loss is" in snippet


@pytest.mark.parametrize(
    "href, path",
    [
        (COLAB + "notebooks/09_real_llm.ipynb", "notebooks/09_real_llm.ipynb"),
        (REPO + "/blob/main/notebooks/02_group_advantages.ipynb", "notebooks/02_group_advantages.ipynb"),
        (REPO + "/edit/main/book/intro.md", "book/intro.md"),
        ("https://mybinder.org/v2/gh/grpo-tutorial/grpo-from-the-ground-up/main?urlpath=tree/notebooks/01_policy_gradients.ipynb",
         "notebooks/01_policy_gradients.ipynb"),
        ("https://mybinder.org/v2/gh/grpo-tutorial/grpo-from-the-ground-up/main?filepath=notebooks/a%20b.ipynb",
         "notebooks/a b.ipynb"),
    ],
)
def test_repository_paths_from_launch_and_repository_links(href, path):
    assert check_book.repo_path_from_url(href, REPO, "main") == (path, None)


@pytest.mark.parametrize(
    "href",
    [
        REPO,  # the repository button: no file
        REPO + "/issues/new?title=x",
        "https://colab.research.google.com/",
        "https://arxiv.org/abs/2402.03300",
        "../_sources/notebooks/02_group_advantages.ipynb",
    ],
)
def test_other_links_are_not_repository_files(href):
    assert check_book.repo_path_from_url(href, REPO, "main") == (None, None)


def test_links_to_another_repository_or_branch_are_problems():
    path, problem = check_book.repo_path_from_url(
        "https://colab.research.google.com/github/someone/else/blob/main/notebooks/x.ipynb", REPO, "main"
    )
    assert path == "notebooks/x.ipynb" and "points at repository someone/else" in problem
    path, problem = check_book.repo_path_from_url(COLAB.replace("/main/", "/dev/") + "notebooks/x.ipynb", REPO, "main")
    assert "points at branch 'dev', not 'main'" in problem


def _result(**changes):
    result = {"text": "plain prose", "mathErrors": [], "broken": [], "links": [], "formulas": 3, "images": 1}
    return result | changes


def test_a_clean_page_has_no_problems():
    links = [COLAB + "notebooks/02_group_advantages.ipynb", "https://example.org/"]
    assert check_book.page_problems("p.html", _result(links=links), [], ROOT, REPO, "main") == []


def test_every_kind_of_problem_is_reported_once():
    result = _result(
        text="left raw: $$x$$",
        mathErrors=["Undefined control sequence \\foo"],
        broken=["../_images/missing.png"],
        links=[COLAB + "notebooks/99_missing.ipynb", COLAB + "notebooks/99_missing.ipynb"],
    )
    problems = check_book.page_problems("p.html", result, ["TypeError: x is undefined"], ROOT, REPO, "main")
    assert problems == [
        "p.html: raw TeX: ...left raw: $$x$$...",
        "p.html: MathJax error: Undefined control sequence \\foo",
        "p.html: image did not load: ../_images/missing.png",
        "p.html: JavaScript error: TypeError: x is undefined",
        f"p.html: link to a file not in the repository: notebooks/99_missing.ipynb ({COLAB}notebooks/99_missing.ipynb)",
    ]


def test_javascript_errors_from_devtools_events():
    events = [
        {"method": "Runtime.exceptionThrown",
         "params": {"exceptionDetails": {"text": "Uncaught", "exception": {"description": "ReferenceError: foo is not defined\n    at x.js:1"}}}},
        {"method": "Runtime.consoleAPICalled", "params": {"type": "error", "args": [{"value": "bad"}, {"value": 1}]}},
        {"method": "Runtime.consoleAPICalled", "params": {"type": "log", "args": [{"value": "fine"}]}},
        {"method": "Log.entryAdded", "params": {"entry": {"level": "error", "text": "Failed to load resource", "url": "http://h/x.png"}}},
        {"method": "Log.entryAdded", "params": {"entry": {"level": "warning", "text": "deprecated"}}},
        {"method": "Log.entryAdded", "params": {"entry": {"level": "error", "text": "404", "url": "http://h/favicon.ico"}}},
    ]
    assert check_book._errors_from(events) == [
        "ReferenceError: foo is not defined",
        "Failed to load resource http://h/x.png",
    ]


def test_redirect_target():
    assert check_book.redirect_target('<meta http-equiv="Refresh" content="0; url=book/intro.html" />') == "book/intro.html"
    assert check_book.redirect_target("<meta http-equiv=refresh content='5;URL=a.html'>") == "a.html"
    assert check_book.redirect_target('<html><head><meta charset="utf-8"></head><body>x</body></html>') is None

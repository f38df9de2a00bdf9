"""grpo_tutorial/run/progress.py: a text bar in a terminal, none in a notebook without widgets, and the bar's fields.

A Jupyter kernel is simulated by an ``IPython`` module whose shell has an
``IPKernelApp`` config, as ipykernel's has; "no ipywidgets" by an import that fails.
"""

import io
import math
import sys
import types
import warnings
from types import SimpleNamespace

import pytest
import tqdm.std

from grpo_tutorial.run.progress import postfix, progress_bar, quiet_tqdm_auto


@pytest.fixture
def in_a_kernel(monkeypatch):
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: SimpleNamespace(config={"IPKernelApp": {"connection_file": "kernel.json"}})
    monkeypatch.setitem(sys.modules, "IPython", ipython)


@pytest.fixture
def no_widgets(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # `import ipywidgets` raises ImportError


def test_a_terminal_gets_a_text_bar_that_writes():
    out = io.StringIO()
    with progress_bar(total=3, desc="train", file=out, ascii=True) as bar:
        assert type(bar) is tqdm.std.tqdm and not bar.disable
        assert (bar.total, bar.desc) == (3, "train")
        bar.update(2)
    assert "train" in out.getvalue() and "2/3" in out.getvalue()


def test_enabled_false_gives_a_silent_bar():
    out = io.StringIO()
    with progress_bar(total=3, desc="train", enabled=False, file=out) as bar:
        bar.update(3)
    assert bar.disable and out.getvalue() == ""


def test_a_plain_python_shell_with_ipython_loaded_is_still_a_terminal(monkeypatch):
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: None  # IPython imported, but no shell running
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    with progress_bar(total=1, desc="x", file=io.StringIO()) as bar:
        assert not bar.disable


def test_a_notebook_without_widgets_gets_no_bar(in_a_kernel, no_widgets):
    out = io.StringIO()
    with progress_bar(total=3, desc="train", file=out) as bar:
        assert type(bar) is tqdm.std.tqdm and bar.disable
        bar.update(3)
    assert out.getvalue() == ""  # nothing for the executed notebook to store


def test_a_notebook_with_widgets_gets_the_widget_bar(in_a_kernel):
    pytest.importorskip("ipywidgets")
    import tqdm.notebook

    with progress_bar(total=3, desc="train") as bar:
        assert isinstance(bar, tqdm.notebook.tqdm)


def test_postfix_shows_only_the_numbers_the_step_has():
    fields = {"reward": ("reward_mean", ".2f"), "kl": ("kl", ".4f"), "acc": ("accuracy", ".0%"),
              "flag": ("done", "d"), "len": ("completion_len_max", ".0f"), "none": ("missing", ".1f")}
    row = {"reward_mean": 0.5, "kl": math.nan, "accuracy": 0.25, "done": True, "completion_len_max": 4, "missing": None}
    assert postfix(row, fields) == {"reward": "0.50", "acc": "25%", "len": "4"}  # NaN, a bool, None: left out
    assert postfix({"kl": math.inf}, {"kl": ("kl", ".1f")}) == {"kl": "inf"}  # an infinite value is shown
    assert postfix({}, fields) == {}


def fresh_tqdm_auto_in_a_kernel_without_widgets(monkeypatch):
    """What makes ``import tqdm.auto`` warn: ipykernel's shell running, no ipywidgets, nothing imported yet."""
    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", types.ModuleType("ipykernel.zmqshell"))
    for name in ("tqdm.auto", "tqdm.autonotebook", "tqdm.notebook"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_quiet_tqdm_auto_silences_only_the_widget_warning_of_that_import(in_a_kernel, no_widgets, monkeypatch):
    import importlib

    fresh_tqdm_auto_in_a_kernel_without_widgets(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:  # the warning it is about
        warnings.simplefilter("always")
        importlib.import_module("tqdm.auto")
    assert any("IProgress not found" in str(w.message) for w in caught)

    fresh_tqdm_auto_in_a_kernel_without_widgets(monkeypatch)
    before = list(warnings.filters)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        filters = list(warnings.filters)
        quiet_tqdm_auto()
        assert list(warnings.filters) == filters  # the process's filters are left as they were
    assert not [w for w in caught if "IProgress not found" in str(w.message)]
    assert "tqdm.auto" in sys.modules and list(warnings.filters) == before

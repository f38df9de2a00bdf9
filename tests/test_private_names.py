"""No module reaches into another module's private names (issue 26, item 6).

A helper that two modules share is public: it has a name without a leading
underscore, a docstring, and a place in its module's ``__all__`` (``answers.
completion_texts``, ``answers.last_number``, ``rollout.encode_prompts``, ...). A
private name (``_texts``) may change without notice, so importing it from another
module, in the package or in ``benchmarks/``, fails here. ``grpo_tutorial._checks``
is a private *module* of the package: its functions are public to the package's own
modules, and nothing outside the package imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grpo_tutorial

ROOT = Path(grpo_tutorial.__file__).parent.parent
#: Known, owned elsewhere. Only shrinks.
KNOWN: set[str] = set()


def private_imports(path: Path, root: Path = ROOT) -> list[str]:
    """``from <a module of ours> import _name`` and ``<our module>._name`` reached by attribute, in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    ours = ("grpo_tutorial", "benchmarks")
    modules_bound = set()  # local names bound to one of our modules: "import grpo_tutorial.rollout as r"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and module.split(".")[0] not in ours:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(root)}: from {'.' * node.level}{module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ours:
                    modules_bound.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if ast.unparse(node.value) in modules_bound:
                found.append(f"{path.relative_to(root)}: {ast.unparse(node)}")
    return found


def test_the_detector_finds_private_imports(tmp_path):
    (tmp_path / "m.py").write_text(
        "from grpo_tutorial.answers import _texts, completion_texts\n"
        "from ..rollout import _uses_chat_template\n"
        "import grpo_tutorial.rollout as r\n"
        "x = r._uses_chat_template\n"
        "from os import _exit\n"  # not ours
        "from grpo_tutorial import __version__\n"  # a dunder is public
    )
    assert private_imports(tmp_path / "m.py", tmp_path) == [
        "m.py: from grpo_tutorial.answers import _texts",
        "m.py: from ..rollout import _uses_chat_template",
        "m.py: r._uses_chat_template",
    ]


def test_no_module_imports_another_modules_private_name():
    files = sorted((ROOT / "grpo_tutorial").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    found = {hit for path in files for hit in private_imports(path)}
    assert found - KNOWN == set(), "make the helper public (a docstring, __all__) or move it: " + "; ".join(
        sorted(found - KNOWN))
    assert KNOWN - found == set(), f"{sorted(KNOWN - found)} is gone: remove it from KNOWN"

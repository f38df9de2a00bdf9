"""The core of the package imports nothing from the chapter tools.

``grpo_tutorial/`` (top level) is the GRPO method; ``grpo_tutorial/chapters/``
holds helpers for single chapters. The dependency may only point one way:
chapter tools use the core, never the other way round.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import grpo_tutorial

PACKAGE = Path(grpo_tutorial.__file__).parent
CORE_MODULES = sorted(PACKAGE.glob("*.py"))


def chapter_imports(path: Path) -> list[str]:
    """Each import statement in ``path`` that reaches into ``grpo_tutorial.chapters``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1:  # relative to grpo_tutorial/: "from .chapters import x"
                module = f"grpo_tutorial.{module}" if module else "grpo_tutorial"
            elif node.level > 1:  # above the package: cannot reach chapters/
                continue
            # "from grpo_tutorial import chapters" and "from . import chapters"
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name == "grpo_tutorial.chapters" or name.startswith("grpo_tutorial.chapters."):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
                break
    return found


def test_core_modules_are_found():
    names = {p.stem for p in CORE_MODULES}
    assert {"__init__", "trainer", "loss", "kl", "rollout", "rewards"} <= names
    assert (PACKAGE / "chapters" / "__init__.py").exists()


def test_core_does_not_import_chapter_tools():
    offenders = [hit for path in CORE_MODULES for hit in chapter_imports(path)]
    assert offenders == [], (
        "core modules must not import from grpo_tutorial.chapters (move the shared code "
        "into the core instead): " + "; ".join(offenders)
    )


def test_detector_catches_every_spelling(tmp_path):
    source = tmp_path / "core.py"
    spellings = [
        "from .chapters import bandit",
        "from .chapters.recipes import TinyAdditionRecipe",
        "from . import chapters",
        "from grpo_tutorial.chapters.pitfalls import gallery_step",
        "from grpo_tutorial import chapters",
        "import grpo_tutorial.chapters.presets",
        "def f():\n    from .chapters import inspection",
    ]
    for line in spellings:
        source.write_text(line + "\n")
        assert len(chapter_imports(source)) == 1, line
    harmless = "from .trainer import GRPOConfig\nimport grpo_tutorial.kl\nfrom grpo_tutorial import chapterly\n"
    source.write_text(harmless)
    assert chapter_imports(source) == []


def test_importing_the_package_loads_no_chapter_tools():
    code = "import sys, grpo_tutorial; print(sorted(m for m in sys.modules if m.startswith('grpo_tutorial.chapters')))"
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_chapter_tools_live_only_in_the_subpackage():
    chapter_modules = {p.stem for p in (PACKAGE / "chapters").glob("*.py")} - {"__init__"}
    assert {"bandit", "kl_estimators", "reward_design", "inspection", "recipes", "presets", "pitfalls"} <= chapter_modules
    assert chapter_modules.isdisjoint({p.stem for p in CORE_MODULES})

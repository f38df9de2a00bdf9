"""The core of the package imports nothing from the chapter tools.

``grpo_tutorial/`` (top level) is the GRPO method; ``grpo_tutorial/chapters/``
holds helpers for single chapters. The dependency may only point one way:
chapter tools use the core, never the other way round.
"""

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import grpo_tutorial

PACKAGE = Path(grpo_tutorial.__file__).parent
CORE_MODULES = sorted(PACKAGE.glob("*.py"))
#: Subpackages of core code that are not the step's stages: an extension each (issue 56), held to the core's rules
#: (no chapter tool, no run machinery, short functions).
EXTENSION_PACKAGES = ("sampling", "tools", "ppo")
EXTENSION_MODULES = sorted(path for name in EXTENSION_PACKAGES for path in (PACKAGE / name).glob("*.py"))
#: Every subpackage, classified: the run machinery, the chapter tools, the doctor, the records, the extensions.
SUBPACKAGES = {"run", "chapters", "doctor", "data", *EXTENSION_PACKAGES}


def chapter_imports(path: Path, package: str | None = None) -> list[str]:
    """Each import statement in ``path`` that reaches into ``grpo_tutorial.chapters``; relative imports are read from
    ``package`` (default: the file's own in the package, else the top, ``grpo_tutorial``)."""
    if package is None and path.resolve().is_relative_to(PACKAGE.resolve()):
        package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    package = package or "grpo_tutorial"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: "from .chapters import x" at the top, "from ..chapters import x" a level down
                parts = package.split(".")
                if node.level > len(parts):  # above the package: cannot reach chapters/
                    continue
                module = ".".join(parts[: len(parts) - node.level + 1] + ([module] if module else []))
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
    offenders = [hit for path in CORE_MODULES + EXTENSION_MODULES for hit in chapter_imports(path)]
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
        "import grpo_tutorial.chapters.costs",
        "def f():\n    from .chapters import inspection",
    ]
    for line in spellings:
        source.write_text(line + "\n")
        assert len(chapter_imports(source)) == 1, line
    harmless = "from .trainer import GRPOConfig\nimport grpo_tutorial.kl\nfrom grpo_tutorial import chapterly\n"
    source.write_text(harmless)
    assert chapter_imports(source) == []
    # in a subpackage's module (grpo_tutorial.sampling.base) two dots reach the top, and so the chapter tools
    source.write_text("from ..chapters import bandit\n")
    assert len(chapter_imports(source, "grpo_tutorial.sampling")) == 1
    assert chapter_imports(source) == []  # from the top, two dots leave the package
    source.write_text("from .chapters import bandit\nfrom ..rollout import Rollout\n")
    assert chapter_imports(source, "grpo_tutorial.sampling") == []  # grpo_tutorial.sampling.chapters: not the tools


def test_importing_the_package_loads_no_chapter_tools():
    code = "import sys, grpo_tutorial; print(sorted(m for m in sys.modules if m.startswith('grpo_tutorial.chapters')))"
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_chapter_tools_live_only_in_the_subpackage():
    chapter_modules = {p.stem for p in (PACKAGE / "chapters").glob("*.py")} - {"__init__"}
    assert {"bandit", "kl_estimators", "reward_design", "inspection", "recipes", "costs", "pitfalls"} <= chapter_modules
    assert chapter_modules.isdisjoint({p.stem for p in CORE_MODULES})


def test_the_preset_registry_is_core_and_builds_on_the_config_alone():
    """grpo_tutorial/presets.py is the one registry of named GRPOConfigs that the command line, the
    chapters and the benchmarks share: a top-level module (so the command line may use it), importing
    nothing of the package but the config, so it stays a table of settings."""
    presets = PACKAGE / "presets.py"
    assert presets in CORE_MODULES and chapter_imports(presets) == []
    assert {name for _, name in imported_modules(presets)} == {"grpo_tutorial.config"}
    assert not (PACKAGE / "chapters" / "presets.py").exists()


# ---------------------------------------------------------------------------
# The run machinery (grpo_tutorial/run/) and the stages: imports point one way
# ---------------------------------------------------------------------------

RUN_MODULES = sorted((PACKAGE / "run").glob("*.py"))
#: Top-level modules that must not import the run machinery: the stages of a step and what they build on.
#: (The trainer, the warm start, the optimizer's warning, plotting's history reader and the CLI use it.)
NO_RUN_IMPORTS = {
    "tasks", "rollout", "speedups", "rewards", "answers", "advantages", "logprobs", "kl", "objectives", "loss",
    "config", "metrics", "evaluation", "seeding", "models", "presets", "_checks", "env", "chat",
    "pretrained", "long_addition", "step", "stages", "stage_results", "optim", "warn", "lora", "mismatch", "stats",
    "cli", "dynamic_sampling",
}
#: Leaves: top-level modules that import nothing from the package, so that both the stages and run/ may import
#: them (``chat.is_chat_messages``: run/completions prints prompts that rollout and tasks also check).
SHARED_LEAVES = {"chat", "warn"}
MAY_IMPORT_RUN = {"__init__", "__main__", "trainer", "sft", "plotting"}
#: The most lines of the two modules a learner reads to see one step and the loop around it.
MAX_LINES = {"step": 320, "trainer": 500}  # step.py: "at most about 300" (issue 31)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every ``grpo_tutorial`` module that ``path`` imports (at module level or inside a function), absolute."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] != "grpo_tutorial":
                continue
            # the longest prefix that is a module of the package ("from .run import x": grpo_tutorial.run)
            while name and not (_file_of(name) and _file_of(name).exists()):
                name = name.rpartition(".")[0]
            if name:
                found.append((node.lineno, name))
    return sorted(set(found))


def _file_of(name: str) -> Path | None:
    parts = name.split(".")[1:]
    if not parts:
        return PACKAGE / "__init__.py"
    as_package = PACKAGE.joinpath(*parts, "__init__.py")
    return as_package if as_package.exists() else PACKAGE.joinpath(*parts).with_suffix(".py")


def test_every_top_level_module_is_classified():
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages == SUBPACKAGES, f"classify the subpackage(s) {sorted(subpackages ^ SUBPACKAGES)} here"
    top = {p.stem for p in CORE_MODULES}
    assert NO_RUN_IMPORTS & MAY_IMPORT_RUN == set()
    assert top - {"__init__", "__main__"} <= (NO_RUN_IMPORTS | MAY_IMPORT_RUN) | {"plotting"}, (
        f"classify the new module(s) {sorted(top - NO_RUN_IMPORTS - MAY_IMPORT_RUN)} in tests/test_layout.py"
    )
    assert (PACKAGE / "run" / "__init__.py").exists() and len(RUN_MODULES) >= 5


def test_run_machinery_imports_nothing_outside_run():
    """run/ knows no GRPO: no stage, no trainer, no chapter tool (only run/ itself and the shared leaves)."""
    leaves = {f"grpo_tutorial.{leaf}" for leaf in SHARED_LEAVES}
    offenders = [
        f"run/{path.name}:{line}: {name}" for path in RUN_MODULES for line, name in imported_modules(path)
        if not (name == "grpo_tutorial.run" or name.startswith("grpo_tutorial.run.") or name in leaves)
    ]
    assert offenders == [], "run/ must import only from run/ and " + str(sorted(leaves)) + ": " + "; ".join(offenders)


def test_shared_leaves_import_nothing_from_the_package():
    """A leaf that both layers import must itself import nothing of the package, or run/ would reach a stage."""
    for leaf in sorted(SHARED_LEAVES):
        path = PACKAGE / f"{leaf}.py"
        assert path.exists(), path
        assert imported_modules(path) == [], f"{leaf}.py is a shared leaf and must import nothing from grpo_tutorial"


def test_stages_do_not_import_the_run_machinery():
    offenders = [
        f"{path.name}:{line}: {name}"
        for path in [p for p in CORE_MODULES if p.stem in NO_RUN_IMPORTS] + EXTENSION_MODULES
        for line, name in imported_modules(path) if name == "grpo_tutorial.run" or name.startswith("grpo_tutorial.run.")
    ]
    assert offenders == [], "these modules must not import grpo_tutorial.run: " + "; ".join(offenders)


#: The most lines a core function's code may run to (its docstring not counted) ...
MAX_FUNCTION_LINES = 60
#: ... and the few that may run longer, each read better whole (issue 44: at most two).
LONG_FUNCTIONS = {
    "loss.grpo_loss",  # the loss assembled in the order chapter 4's equation reads
    "rollout.generate_rollouts",  # stage 1 in one call: tokenise, generate, mask, the rollout
}


def long_functions(source: str, most: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """Each function of ``source`` (methods and nested ones too) whose lines from ``def`` to its end, less its
    docstring's, are more than ``most``: name -> that count."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines -= first.end_lineno - first.lineno + 1
            if lines > most:
                found[node.name] = lines
    return found


def test_the_long_function_counter_leaves_out_the_docstring():
    body = "".join(f"    x{i} = {i}\n" for i in range(58))
    doc = '    """A docstring\n    of three lines.\n    """\n'
    assert long_functions(f"def f():\n{doc}{body}    return 0\n") == {}  # def, 58 lines, return: 60 (the docstring aside)
    assert long_functions(f"def f():\n{doc}{body}    y = 1\n    return 0\n") == {"f": 61}
    assert long_functions(f"class C:\n    def g(self):\n{textwrap.indent(body * 2, '    ')}") == {"g": 117}


def test_at_most_two_core_functions_run_over_60_lines():
    """A core function over 60 lines (docstring aside) is split into named pieces, unless it reads better whole
    and is one of the two of LONG_FUNCTIONS (issue 44)."""
    found = {f"{path.stem}.{name}": n for path in CORE_MODULES + EXTENSION_MODULES
             for name, n in long_functions(path.read_text()).items()}
    assert len(LONG_FUNCTIONS) <= 2
    assert set(found) <= LONG_FUNCTIONS, f"split these, or say why one reads better whole: {found}"


def test_one_step_fits_one_readable_file_and_the_trainer_stays_small():
    """The step (step.py) is read top to bottom beside chapter 0's loop; the trainer is the loop around it."""
    for module, most in MAX_LINES.items():
        lines = len((PACKAGE / f"{module}.py").read_text().splitlines())
        assert lines <= most, f"{module}.py has {lines} lines; keep it to {most} (move what is not the method out)"
    assert not [name for _, name in imported_modules(PACKAGE / "step.py") if name.startswith("grpo_tutorial.run")]


# ---------------------------------------------------------------------------
# The stages, in the order of one step: no stage imports a later stage
# ---------------------------------------------------------------------------


def stage_levels() -> dict[str, int]:
    """Each stage module's stage number (``grpo_tutorial.stages.STAGES``); ``speedups`` sits below every stage."""
    from grpo_tutorial.stages import STAGES

    levels = {module: s.number for s in STAGES for module in s.modules}
    levels["speedups"] = 0  # the stages call the speed-ups; the speed-ups call no stage
    return levels


def later_stage_imports(module: str, imports: list[tuple[int, str]], levels: dict[str, int]) -> list[str]:
    """The imports (``imported_modules``' lines and names) by which ``module`` reaches a later stage than its own."""
    found = []
    for line, name in imports:
        target = name.split(".")[1] if name.startswith("grpo_tutorial.") else None
        if target in levels and levels[target] > levels[module]:
            found.append(f"{module}.py:{line}: {name} (stage {levels[target]} > {levels[module]})")
    return found


def test_no_stage_imports_a_later_stage():
    """A module of stage n imports modules of stages <= n only: stage 1 sampling needs nothing of stage 4 scoring.

    What two stages share lives in the earlier one (``rollout.completion_mask``) or below both
    (``speedups``, which imports no stage at all)."""
    levels = stage_levels()
    assert {"rollout", "rewards", "advantages", "logprobs", "loss", "speedups"} <= set(levels)
    assert all(levels[m] >= 1 for m in levels if m != "speedups")
    offenders = [  # a subpackage's modules are at its stage (tools/: stage 1)
        hit for path, module in [(p, p.stem) for p in CORE_MODULES] + [(p, p.parent.name) for p in EXTENSION_MODULES]
        if module in levels for hit in later_stage_imports(module, imported_modules(path), levels)
    ]
    assert offenders == [], "a stage imports a later stage (move the shared code down): " + "; ".join(offenders)


def test_the_stage_order_detector_finds_a_later_stage():
    levels = {"speedups": 0, "rollout": 1, "logprobs": 4}
    imports = [(3, "grpo_tutorial"), (4, "grpo_tutorial.chat"), (5, "grpo_tutorial.logprobs"),
               (6, "grpo_tutorial.rollout"), (7, "grpo_tutorial.run.warn"), (8, "grpo_tutorial.speedups")]
    assert later_stage_imports("rollout", imports, levels) == ["rollout.py:5: grpo_tutorial.logprobs (stage 4 > 1)"]
    assert later_stage_imports("logprobs", imports, levels) == []
    assert later_stage_imports("speedups", imports, levels) == [
        "speedups.py:5: grpo_tutorial.logprobs (stage 4 > 0)", "speedups.py:6: grpo_tutorial.rollout (stage 1 > 0)",
    ]


def _import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        me = _module_name(path)
        mine = {me.rsplit(".", k)[0] for k in range(me.count(".") + 1)}  # me and my own packages
        targets = set()
        for _, name in imported_modules(path):
            targets.add(name)
            # importing a.b.c runs a.b's __init__ first; my own packages' __init__ ran before me anyway
            parent = name.rpartition(".")[0]
            while parent and parent not in mine:
                targets.add(parent)
                parent = parent.rpartition(".")[0]
        graph[me] = targets - mine
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    graph = _import_graph()
    assert "grpo_tutorial.run.lock" in graph and "grpo_tutorial.trainer" in graph
    assert _cycles(graph) == []


def test_the_circle_detector_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


_FAKE_KERNEL_WITHOUT_WIDGETS = """
import sys, types, warnings
shell = types.SimpleNamespace(config={"IPKernelApp": {}})
sys.modules["IPython"] = types.SimpleNamespace(get_ipython=lambda: shell)
sys.modules["ipykernel.zmqshell"] = types.ModuleType("ipykernel.zmqshell")  # what tqdm.autonotebook looks for
sys.modules["ipywidgets"] = None  # "import ipywidgets" fails, as in a kernel without widgets
"""


def _run(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_importing_the_package_sets_no_process_wide_warning_filter():
    out = _run(_FAKE_KERNEL_WITHOUT_WIDGETS + textwrap.dedent("""
        import numpy, torch, transformers, matplotlib  # their own filters are theirs
        before = list(warnings.filters)
        import grpo_tutorial, grpo_tutorial.trainer
        print("ADDED", [f for f in warnings.filters if f not in before])
    """))
    assert "ADDED []" in out, out


def test_the_widget_warning_stays_out_of_a_notebook_without_widgets():
    """transformers imports tqdm.auto, which warns "IProgress not found" in such a kernel; the package keeps it quiet."""
    out = _run(_FAKE_KERNEL_WITHOUT_WIDGETS + textwrap.dedent("""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import grpo_tutorial
        print("IPROGRESS", sum("IProgress" in str(w.message) for w in caught))
        for name in [m for m in sys.modules if m.startswith("tqdm")]:
            del sys.modules[name]  # import it afresh, as a process without the package would
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import tqdm.auto
        print("PLAIN", sum("IProgress" in str(w.message) for w in caught))
    """))
    assert "IPROGRESS 0" in out and "PLAIN 1" in out, out  # the warning is real, and the package keeps it out

"""The test files get their tiny models, and their one torch thread, from ``conftest.py``.

A shape typed in a test file drifts from :data:`conftest.SMALL_SHAPE` unseen, and an autouse fixture that
sets the thread count again hides conftest's ``one_thread`` (same name) or repeats it (another name).
"""

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
#: The builder's own tests (its sizes, its checks, its determinism) and the fixtures' tests call it directly.
BUILDER_TESTS = {"test_models.py", "test_fixtures.py"}
SIZES = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")
# a call that types a size, in code or in the text of a script a test runs in a subprocess
TYPED_SHAPE = re.compile(r"\b(?:build_tiny_policy|tiny_model|small_model)\([^)]*\b(" + "|".join(SIZES) + r")\s*=")


def checked_files():
    return sorted(p for p in TESTS.glob("test_*.py") if p.name not in BUILDER_TESTS)


def calls_the_builder(node: ast.AST, names: tuple[str, ...] = ("build_tiny_policy",)) -> bool:
    return isinstance(node, ast.Call) and (
        getattr(node.func, "id", None) in names or getattr(node.func, "attr", None) in names
    )


def is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return getattr(target, "attr", getattr(target, "id", None)) == "fixture"


def is_autouse(decorator: ast.expr) -> bool:
    return isinstance(decorator, ast.Call) and is_fixture(decorator) and any(
        k.arg == "autouse" and getattr(k.value, "value", False) is True for k in decorator.keywords
    )


def sets_threads(function: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "set_num_threads" for n in ast.walk(function)
    )


def test_no_test_file_types_a_models_shape():
    typed = [
        f"{path.name}:{text[: m.start()].count(chr(10)) + 1}"
        for path in checked_files()
        for text in [path.read_text(encoding="utf-8")]
        for m in TYPED_SHAPE.finditer(text)
    ]
    assert not typed, f"use conftest's small_policy / make_small_policy(**changes) instead: {typed}"


def test_tests_and_fixtures_get_their_models_from_conftest():
    """A test or a fixture takes ``tiny_policy``, ``small_policy``, ``make_tiny_policy`` or ``make_small_policy``;
    a module-level helper calls ``helpers.tiny_model`` or ``helpers.small_model`` (what those fixtures call). Only a
    script a test runs in a subprocess, a string here, calls ``build_tiny_policy`` itself."""
    direct, in_tests = [], []
    for path in checked_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        direct += [f"{path.name}:{n.lineno}" for n in ast.walk(tree) if calls_the_builder(n)]
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and (
                node.name.startswith("test_") or any(is_fixture(d) for d in node.decorator_list)
            ):
                in_tests += [f"{path.name}:{n.lineno}" for n in ast.walk(node)
                             if calls_the_builder(n, ("tiny_model", "small_model"))]
    assert not direct, f"build_tiny_policy called in a test file (take a fixture, or helpers' tiny_model): {direct}"
    assert not in_tests, f"a test or fixture builds its own model (take tiny_policy, make_small_policy, ...): {in_tests}"


def test_only_conftest_sets_the_thread_count_for_every_test():
    again = []
    for path in sorted(TESTS.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and (
                node.name == "one_thread" or (any(is_autouse(d) for d in node.decorator_list) and sets_threads(node))
            ):
                again.append(f"{path.name}:{node.lineno} {node.name}")
    assert not again, f"conftest's autouse one_thread already runs every test on one thread: {again}"


KERNEL_NAMES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "KERNEL_VARIABLES")
ENV_WRITES = {"setenv", "delenv", "putenv", "unsetenv"}


def changes_kernel_variables(function: ast.AST, source: str) -> bool:
    """Whether a function writes a kernel variable into its own environment: monkeypatch.setenv/delenv,
    os.putenv/unsetenv, os.environ.pop, or ``os.environ[...] = ...``/``del`` with a kernel variable's name, or with
    a loop variable that runs over them (``for name in KERNEL_VARIABLES``)."""
    def names_kernel(node: ast.AST) -> bool:
        text = ast.get_source_segment(source, node) or ""
        return any(name in text for name in KERNEL_NAMES) or any(
            isinstance(n, ast.Name) and n.id in loop_names for n in ast.walk(node))

    loop_names = {t.id for n in ast.walk(function) if isinstance(n, ast.For)
                  for t in ast.walk(n.target) if isinstance(t, ast.Name) and any(
                      k in (ast.get_source_segment(source, n.iter) or "") for k in KERNEL_NAMES)}
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            attr = getattr(node.func, "attr", None)
            owner = getattr(getattr(node.func, "value", None), "attr", None)
            writes = attr in ENV_WRITES or (owner == "environ" and attr in ("pop", "update", "setdefault"))
            if writes and any(names_kernel(a) for a in [*node.args, *(k.value for k in node.keywords)]):
                return True
        if isinstance(node, (ast.Assign, ast.Delete)):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and getattr(t.value, "attr", None) == "environ" and names_kernel(t.slice):
                    return True
    return False


def test_no_test_changes_its_own_processs_kernel_variables():
    """Issue 52's flake: a test that unset the kernel variables in a worker before its first kernel ran chose the
    machine's default kernels for every later test there. A test that needs other kernels starts a subprocess
    with them (tests/test_kernels.py); a function that reads the variables takes a mapping (``env=``)."""
    found = []
    for path in sorted(TESTS.glob("test_*.py")) + [TESTS / "conftest.py"]:
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and changes_kernel_variables(node, source):
                found.append(f"{path.name}::{node.name}")
    assert not found, f"these change their own process's kernel variables: {found}"


def test_the_kernel_variable_scan_finds_what_it_looks_for():
    planted = '''
def test_a(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "AUTO")

def test_b(monkeypatch):
    for name in KERNEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)

def test_c():
    os.environ["ATEN_CPU_CAPABILITY"] = "default"

def test_d(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run({"ATEN_CPU_CAPABILITY": "default"})
'''
    tree = ast.parse(planted)
    flagged = [n.name for n in tree.body if changes_kernel_variables(n, planted)]
    assert flagged == ["test_a", "test_b", "test_c"]  # test_d writes another variable; its subprocess gets the other

"""Shared test settings, and the fixtures most test files need.

``tiny_policy`` and ``small_policy`` are fresh ``(model, tokenizer)`` pairs (a
test may train or change its model); a test that needs another seed, a second
model, or a variant of the small shape calls ``make_tiny_policy(seed=...)`` or
``make_small_policy(seed=..., **changes)``, which build a new pair at each call.
A module-level helper that many tests call builds its model with
``helpers.tiny_model(seed=...)`` or ``helpers.small_model(seed=...)``, which these
fixtures call too; a script a test runs in a subprocess calls
``build_tiny_policy(seed=...)``, with ``**SMALL_SHAPE`` (``from conftest import
SMALL_SHAPE``) for the small shape. No test file types a model's shape or calls the
builder itself (``tests/test_test_hygiene.py`` holds the rules).
``tiny_batch`` is a few rows the tiny character tokenizer can encode, and
``run_dir`` a fresh output directory. ``one_thread`` runs every test on one
torch thread; a file whose tests must not reach the Hugging Face hub marks them
``pytest.mark.usefixtures("hub_offline")``.
"""

import pytest
import torch


def shared_fixture_modules(root=None) -> set[str]:
    """The test files that define a module-, class- or package-scoped fixture (paths as in a node id)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent if root is None else root
    scoped = re.compile(r"""scope\s*=\s*["'](module|class|package)["']""")
    return {f"tests/{p.name}" for p in root.glob("test_*.py") if scoped.search(p.read_text(encoding="utf-8"))}


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unknown, and unused, without it
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s scheduling (pytest-xdist's ``--dist loadscope``, with one change): every test and
    every notebook is its own unit, handed to whichever worker is free in the order collected (the
    notebooks, the longest items, first), except the tests of a file with a module- or class-scoped
    fixture (a SmolLM2 run, the GPU proof's dry run), which go to one worker together so that the
    fixture is made once. (xdist's own ``loadgroup`` marks do not reach its scheduler under pytest 9,
    whose node ids are no longer rewritable; this needs no marks.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    shared = shared_fixture_modules()

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path in shared else nodeid

    return SharedFixtureScheduling(config, log)


def start_kernels() -> None:
    """Start ATen's dispatch, MKL and oneDNN in this process now, under the kernel variables it began with.

    Each reads its variable (``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS`` and ``MKL_CBWR``,
    ``ONEDNN_MAX_CPU_ISA``) once, when it first runs, and keeps that choice for the life of the
    process. A test process started under `make test-kernels`' variables must run every test on the
    kernels they choose; had a test changed a variable before the first kernel ran, every later test
    in that worker would run on other kernels (issue 52: the determinism test's run in a worker then
    differed from its run in a fresh subprocess from step 1). A vectorised operator, a float32 matrix
    product and oneDNN's linear start all three, in milliseconds.
    """
    x = torch.arange(64.0).reshape(8, 8) / 64  # [8, 8], exact in float32
    torch.exp(x).sum()  # ATen's vectorised kernels (its CPU capability)
    x @ x  # MKL's sgemm (its instruction set and reproducibility mode)
    try:  # oneDNN (its instruction set), where this build has the packed linear
        packed = torch.ops.mkldnn._reorder_linear_weight(x, 8)
        torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (AttributeError, RuntimeError, TypeError):
        pass


def pytest_sessionstart(session):
    start_kernels()


from helpers import SMALL_SHAPE, small_model, tiny_model  # noqa: E402 (SMALL_SHAPE: test files import it from here)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models and tensors: one thread is faster (far faster on a busy machine) and deterministic."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def hub_offline(monkeypatch):
    """``HF_HUB_OFFLINE=1`` for the test: a loader that would download fails at once instead."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def make_tiny_policy():
    """A builder of fresh ``(model, tokenizer)`` pairs: ``make_tiny_policy(seed=4)`` is ``build_tiny_policy(seed=4)``,
    the default tiny Qwen2 (hidden 128, 3 layers). Session-scoped because it holds nothing (each call builds a new
    model), so a module-scoped fixture may use it too."""
    def make(seed: int = 0):
        return tiny_model(seed=seed)

    return make


@pytest.fixture(scope="session")
def make_small_policy():
    """A builder of fresh ``(model, tokenizer)`` pairs of :data:`SMALL_SHAPE`: ``make_small_policy(seed=1)``, or a
    variant of the shape, ``make_small_policy(num_layers=1)`` (any other ``build_tiny_policy`` argument overrides
    too). Session-scoped because it holds nothing (each call builds a new model)."""
    def make(seed: int = 0, **changes):
        return small_model(seed=seed, **changes)

    return make


@pytest.fixture
def tiny_policy(make_tiny_policy):
    """A fresh ``(model, tokenizer)``: ``build_tiny_policy(seed=0)``, the default tiny Qwen2 (hidden 128, 3 layers)."""
    return make_tiny_policy(seed=0)


@pytest.fixture
def small_policy(make_small_policy):
    """A fresh ``(model, tokenizer)`` of :data:`SMALL_SHAPE` (hidden 32, 2 layers, 2 heads, MLP 64), seed 0."""
    return make_small_policy(seed=0)


@pytest.fixture
def tiny_batch():
    """Four two-digit additions, rows as ``make_arithmetic_dataset`` writes them (a new list for each test)."""
    return [
        {"prompt": "12+34=", "answer": "46"},
        {"prompt": "7+58=", "answer": "65"},
        {"prompt": "40+9=", "answer": "49"},
        {"prompt": "99+1=", "answer": "100"},
    ]


@pytest.fixture
def run_dir(tmp_path):
    """A fresh output directory for a run, ``tmp_path / "run"`` (not created: the run makes it)."""
    return tmp_path / "run"


@pytest.fixture(scope="session")
def gpu_proof_dry_run(tmp_path_factory):
    """``make gpu-proof``'s dry run on this CPU (a tiny stand-in; about half a minute), once per test session (per
    worker): the record, which must have the committed record's shape and which chapter 9 must read."""
    import json

    from benchmarks import gpu_proof

    out = tmp_path_factory.mktemp("gpu-proof") / "record.json"
    cheap = "tests/test_gpu_path.py::test_a_t4_generates_in_float16_not_emulated_bfloat16"
    assert gpu_proof.main(["--dry-run", "--out", str(out), "--tests", cheap]) == 0
    return json.loads(out.read_text())

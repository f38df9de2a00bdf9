"""Every notebook runs on its own: committed data ships in the package, nothing reads the repository.

Colab opens one ``.ipynb`` file, installs the package from git (not editable) and
has no repository around it. So:

- the runs that chapters 8 and 9 show are package data (``grpo_tutorial/data``,
  read with ``grpo_tutorial.data.read_data``), and the scripts that make them
  write there;
- no notebook code reads a path outside the notebook (``../``) or a machine path;
- the repository URL appears only in each notebook's install cell (it is defined
  once, in ``_config.yml``), never in other code cells or book pages;
- a wheel built from the source tree holds the data files, and the notebook cells
  that show committed data (tagged ``committed-data``) run from a directory
  outside the repository with only that wheel on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile

import nbformat
import pytest

from test_notebooks_meta import NOTEBOOKS, ROOT, code_cells, repository_url

DATA_DIR = ROOT / "grpo_tutorial" / "data"
TAG = "committed-data"


def test_every_data_file_is_listed_and_readable():
    from grpo_tutorial.data import DATA_FILES, read_data

    on_disk = sorted(p.name for p in DATA_DIR.iterdir() if p.suffix in (".json", ".jsonl", ".safetensors")
                     or p.name.endswith(".json.gz"))
    assert on_disk == sorted(DATA_FILES)
    assert read_data("tiny_learning.json")["runs"][0]["seed"] == 0
    assert [run["seed"] for run in read_data("tiny_learning.json")["runs"]] == list(range(8))
    history = read_data("smollm2_history.jsonl")
    assert len(history) == read_data("smollm2_eval.json")["steps"]
    assert [row["step"] for row in history] == list(range(1, len(history) + 1))
    assert read_data("doctor_zoo.json.gz")["runs"]  # gzip-compressed, read as JSON
    with pytest.raises(ValueError, match=r"no committed data file named 'missing.json'; the package ships \["):
        read_data("missing.json")


def test_writers_write_into_the_package():
    from benchmarks import smollm2_run, tiny_learning

    assert tiny_learning.DEFAULT_OUT == DATA_DIR / "tiny_learning.json"
    assert smollm2_run.DATA_DIR == DATA_DIR


def _repository_names() -> list[str]:
    url = repository_url()  # https://github.com/<owner>/<name>
    owner_name = url.removeprefix("https://github.com/")
    return [url, owner_name, owner_name.split("/")[1], "raw.githubusercontent.com"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_repository_url_only_in_the_install_cell(path):
    nb = nbformat.read(path, as_version=4)
    install = code_cells(nb)[0]
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source == install:
            continue
        for name in _repository_names():
            assert name not in cell.source, f"{path.name}: {name!r} outside the install cell:\n{cell.source[:300]}"


def test_book_pages_do_not_name_the_repository():
    pages = sorted((ROOT / "book").rglob("*.md"))
    assert pages
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for name in _repository_names():
            assert name not in text, f"{page.relative_to(ROOT)} names the repository ({name!r}); _config.yml holds it"


OUTSIDE_PATH = re.compile(r"""(\.\./|\.\.\\|["']\.\.["']|(?<![\w.])/(?:work|tmp|home|root|Users)/)""")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_notebook_reads_a_path_outside_itself(path):
    nb = nbformat.read(path, as_version=4)
    for source in code_cells(nb):
        found = OUTSIDE_PATH.search(source)
        assert found is None, f"{path.name}: {found.group()!r} in a code cell:\n{source[:300]}"


def test_the_path_check_catches_the_old_chapter_9_cell():
    assert OUTSIDE_PATH.search('DATA = Path("../book/data")')
    assert OUTSIDE_PATH.search('open("/tmp/x.json")')
    assert not OUTSIDE_PATH.search('read_data("smollm2_eval.json")')


def _tagged_cells(name: str) -> list[str]:
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code" and TAG in c.metadata.get("tags", [])]


def test_the_notebooks_tag_their_committed_data_cells():
    for name in NOTEBOOKS:
        reads = [s for s in code_cells(nbformat.read(name, as_version=4)) if "read_data(" in s]
        tagged = _tagged_cells(name.name)
        assert all(s in tagged for s in reads), f"{name.name}: a cell calls read_data but is not tagged {TAG!r}"
    assert len(_tagged_cells("08_tiny_transformer.ipynb")) >= 2
    assert len(_tagged_cells("09_real_llm.ipynb")) >= 4
    assert len(_tagged_cells("13_thinking_longer.ipynb")) >= 1
    assert len(_tagged_cells("16_tools_in_the_loop.ipynb")) >= 2  # the imports, then the record
    assert len(_tagged_cells("17_why_no_critic.ipynb")) >= 2  # the imports, then the record and its figures
    assert len(_tagged_cells("18_my_run_is_not_learning.ipynb")) >= 6  # the imports, the zoo, its figures, mysteries


CHECK_CELL = textwrap.dedent(
    """\
    import os
    import pathlib

    import grpo_tutorial
    from grpo_tutorial.data import read_data

    SITE = pathlib.Path(os.environ["GRPO_TUTORIAL_WHEEL_SITE"]).resolve()
    here = pathlib.Path(grpo_tutorial.__file__).resolve()
    assert SITE in here.parents, f"grpo_tutorial imported from {here}, not the wheel in {SITE}"
    assert not any((p / "pyproject.toml").exists() for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents])
    print("grpo_tutorial from", here.parent)
    """
)


@pytest.mark.slow
def test_wheel_ships_the_data_and_the_data_cells_run_outside_the_repository(tmp_path):
    # build from a copy of the sources, so no build/ or egg-info lands in the checkout
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "grpo_tutorial", src / "grpo_tutorial", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("grpo_tutorial-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    from grpo_tutorial.data import DATA_FILES

    missing = [f for f in DATA_FILES if f"grpo_tutorial/data/{f}" not in names]
    assert not missing, f"{wheel.name} lacks {missing}"
    assert "grpo_tutorial/chapters/gsm8k.py" in names

    site = tmp_path / "site"
    install = subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-2000:]

    # the tagged cells of each notebook, after a cell that proves where the package comes from
    run_dir = tmp_path / "alone"
    run_dir.mkdir()
    for name in ("08_tiny_transformer.ipynb", "09_real_llm.ipynb", "13_thinking_longer.ipynb", "16_tools_in_the_loop.ipynb"):
        nb = nbformat.v4.new_notebook()
        nb.metadata = nbformat.read(ROOT / "notebooks" / name, as_version=4).metadata
        nb.cells = [nbformat.v4.new_code_cell(CHECK_CELL)] + [nbformat.v4.new_code_cell(s) for s in _tagged_cells(name)]
        nbformat.write(nb, run_dir / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PYTHONPATH=str(site), GRPO_TUTORIAL_WHEEL_SITE=str(site), HF_HUB_OFFLINE="1", MPLBACKEND="Agg")
    runner = textwrap.dedent(
        """\
        import sys, nbformat
        from nbclient import NotebookClient
        for name in sys.argv[1:]:
            nb = nbformat.read(name, as_version=4)
            NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
            text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
            print(f"=== {name}\\n{text}")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", runner, "08_tiny_transformer.ipynb", "09_real_llm.ipynb", "13_thinking_longer.ipynb"],
        cwd=run_dir, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    out = proc.stdout
    assert out.count("grpo_tutorial from " + str((site / "grpo_tutorial").resolve())) == 3, out[:2000]
    assert "seed 3:" in out  # chapter 8: both benchmark records
    assert "held-out greedy accuracy, n = 200" in out  # chapter 9: the committed run
    assert "GRPO runs with the chosen settings" in out
    assert "seed 0's warm start:" in out and "loaded it from the package:" in out  # chapter 13: weights too

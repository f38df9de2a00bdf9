"""A chapter's install cell installs only what the chapter needs (issue 21, item 7).

TRL 1.16 requires datasets >= 4.7 and pyarrow >= 21; installing the ``trl`` extra in
Colab upgrades Colab's datasets and pyarrow under the running kernel. So only the
chapters that import TRL install it; the others install the package without it.
"""

from __future__ import annotations

import re

import nbformat
import pytest

from test_notebooks_meta import NOTEBOOKS, code_cells

TRL_IMPORT = re.compile(r"^\s*(?:import trl\b|from trl\b)", re.M)
EXTRAS = re.compile(r"grpo-tutorial\[(?P<extras>[^\]]*)\]")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_trl_extra_only_where_the_chapter_imports_trl(path):
    cells = code_cells(nbformat.read(path, as_version=4))
    install = next(c for c in cells if "pip" in c and "git+" in c)
    uses_trl = any(TRL_IMPORT.search(c) for c in cells if c is not install)
    match = EXTRAS.search(install)
    extras = {e.strip() for e in match["extras"].split(",")} if match else set()
    if uses_trl:
        assert "trl" in extras, f"{path.name} imports trl but its install cell does not install the trl extra"
    else:
        assert "trl" not in extras, f"{path.name} does not use TRL but installs the trl extra: {sorted(extras)}"


def test_chapter_9_installs_without_trl():
    """Chapter 9 needs SmolLM2's GGUF reader on the CPU and PEFT for the GPU run's LoRA adapters; not TRL."""
    path = next(p for p in NOTEBOOKS if p.name.startswith("09_"))
    install = next(c for c in code_cells(nbformat.read(path, as_version=4)) if "git+" in c)
    assert "grpo-tutorial[gguf,lora] @ git+" in install

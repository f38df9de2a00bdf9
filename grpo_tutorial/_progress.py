"""Progress bars that look right in a terminal, in Colab, and in the rendered book.

* terminal: tqdm's text bar on stderr;
* Jupyter with ipywidgets (Colab, JupyterLab): tqdm's widget bar;
* Jupyter without ipywidgets (CI executing the book's notebooks): no bar. A text
  bar there would be stored as hundreds of carriage-return updates in the cell
  output and render as a wall of text in the book; callers print a summary instead.
"""

from __future__ import annotations

import sys
from typing import Any


def _in_jupyter_kernel() -> bool:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def _has_widgets() -> bool:
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def progress_bar(*, total: int, desc: str, enabled: bool = True, **kwargs: Any):
    """A tqdm bar suited to where the code runs (disabled where it would be noise)."""
    if _in_jupyter_kernel():
        if _has_widgets():
            from tqdm.notebook import tqdm
        else:
            from tqdm.std import tqdm

            enabled = False
    else:
        from tqdm.std import tqdm
    return tqdm(total=total, desc=desc, disable=not enabled, **kwargs)

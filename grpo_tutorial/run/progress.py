"""Progress bars that look right in a terminal, in Colab, and in the rendered book.

* terminal: tqdm's text bar on stderr;
* Jupyter with ipywidgets (Colab, JupyterLab): tqdm's widget bar;
* Jupyter without ipywidgets (CI executing the book's notebooks): no bar. A text
  bar there would be stored as hundreds of carriage-return updates in the cell
  output and render as a wall of text in the book; callers print a summary instead.

:func:`quiet_tqdm_auto` imports ``tqdm.auto`` once with its "IProgress not found"
warning silenced (transformers imports it, and the warning means only that the
widget bar is unavailable, which :func:`progress_bar` handles). The silence is
scoped to that import: the process's warning filters are left as they were.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

__all__ = ["postfix", "progress_bar", "quiet_tqdm_auto"]


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


def quiet_tqdm_auto() -> None:
    """Import ``tqdm.auto`` (as transformers does) without its widget warning; later imports are cached."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import tqdm.auto  # noqa: F401


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


def postfix(row: dict, fields: dict[str, tuple[str, str]]) -> dict[str, str]:
    """The progress bar's fields from a history row: only those the step computed.

    ``fields`` maps a label to ``(row key, format)``, e.g.
    ``{"kl": ("kl", ".4f")}``. A value that does not exist (NaN: ``kl`` with
    beta = 0, ``accuracy`` without answers) is left out rather than shown as ``nan``.

    >>> postfix({"reward_mean": 0.5, "kl": float("nan")}, {"reward": ("reward_mean", ".2f"), "kl": ("kl", ".4f")})
    {'reward': '0.50'}
    """
    shown = {}
    for label, (key, fmt) in fields.items():
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            shown[label] = format(value, fmt)
    return shown

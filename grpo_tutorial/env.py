"""What a chapter prints first: versions, device and threads, so outputs can be compared.

There is no "are we in Colab?" helper here: the one cell that asks, each notebook's
install cell, runs before this package is installed, so it tests
``"google.colab" in sys.modules`` itself (``tests/test_notebooks_meta.py`` checks it).
"""

from __future__ import annotations

import os
import platform


def describe_environment(print_it: bool = True) -> dict[str, str]:
    """Collect (and print) the versions and the device a notebook runs on."""
    import torch
    import transformers

    import grpo_tutorial

    if torch.cuda.is_available():
        device = f"cuda ({torch.cuda.get_device_name(0)})"
    else:
        device = f"cpu ({os.cpu_count()} cores, torch threads={torch.get_num_threads()})"
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "grpo_tutorial": grpo_tutorial.__version__,
        "device": device,
        "offline": "yes" if os.environ.get("HF_HUB_OFFLINE") == "1" else "no",
    }
    if print_it:
        width = max(map(len, info))
        for key, value in info.items():
            print(f"{key:<{width}} : {value}")
    return info


def glue(name: str, value, display: bool = False):
    """Record `value` under `name` for the book's ``{glue:text}`name:fmt``` role; return it.

    The book build (MyST-NB) replaces the role by the value, so a re-run that changes
    the number changes the sentence. Where MyST-NB is not installed (Colab) this does
    nothing, and the role shows raw there: prefer a printed, asserted output for
    sentences a Colab reader needs (CONTRIBUTING.md, "Numbers in prose").
    """
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        return value
    myst_glue(name, value, display=display)
    return value

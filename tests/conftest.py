"""Shared test settings."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models and tensors: one thread is faster (far faster on a busy machine) and deterministic."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

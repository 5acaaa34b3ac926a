"""Shared fixtures."""

import pytest


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run fastest on one thread (and do not fight other processes for cores)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

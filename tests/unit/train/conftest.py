"""Torch tests of knittrans.train run single-threaded: the test machines are small and shared."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    try:
        import torch
    except ModuleNotFoundError:  # the schedule tests need no torch
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

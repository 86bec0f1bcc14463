"""Fixtures for clusterddp.train tests."""

from __future__ import annotations

import os

import pytest

from rankrun import PLACEMENT_NAMES, PLACEMENT_PREFIXES


@pytest.fixture(autouse=True)
def _one_thread_and_fresh_context(monkeypatch: pytest.MonkeyPatch):
    """In-process references: single process, one thread like the workers, no context left."""
    import torch

    from clusterddp.train import cleanup

    for name in list(os.environ):
        if name.startswith(PLACEMENT_PREFIXES) or name in PLACEMENT_NAMES:
            monkeypatch.delenv(name)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    cleanup()

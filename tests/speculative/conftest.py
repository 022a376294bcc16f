"""tests/speculative: one torch thread per test (restored after).

The statistical tests run many small elementwise ops on [N, V] tensors; on a shared 2-core
runner torch's intra-op threads oversubscribe the cores and run ~10x slower than one thread.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""A pooling output crosses the process core's delta channel whole (DeltaTracker, then
Accumulator), and pickles (the child process sends it through a pipe)."""

from __future__ import annotations

import pickle

import torch

from toolkit.entrypoints.streams import Accumulator, DeltaTracker
from toolkit.pooling import PoolingOutput, PoolingRequestOutput


def test_pooling_output_crosses_whole():
    o = PoolingRequestOutput("r", PoolingOutput(torch.arange(4, dtype=torch.float32)), [1, 2, 3], task="embed")
    d = DeltaTracker().delta(o)
    back = Accumulator().update(pickle.loads(pickle.dumps(d)))
    assert isinstance(back, PoolingRequestOutput) and back.finished
    assert torch.equal(back.outputs.data, o.outputs.data) and back.prompt_token_ids == [1, 2, 3]

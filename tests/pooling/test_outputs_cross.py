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


def test_server_metrics_take_a_finished_pooling_output():
    """/metrics observes every final output; a pooling one has no time per output token."""
    from toolkit.pooling.outputs import PoolingOutput, PoolingRequestOutput
    from toolkit.serving.metrics import ServerMetrics
    from toolkit.types import RequestMetrics

    m = ServerMetrics("tiny")
    met = RequestMetrics(arrival_time=1.0, first_scheduled_time=1.1, first_token_time=1.2, finished_time=1.3)
    m.observe_finished(PoolingRequestOutput("e0", PoolingOutput([0.5, 0.5]), [1, 2, 3], metrics=met))
    text = m.render().decode()
    assert 'toolkit_prompt_tokens_total{model_name="tiny"} 3.0' in text

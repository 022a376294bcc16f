"""Errors at the public surface name the field and what is valid."""

from __future__ import annotations

import pytest
import torch

from toolkit.samplers import Sampler, SamplingMetadata
from toolkit.samplers.beam import beam_search_step
from toolkit.types import SamplingParams


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"), ({"min_p": 1.5}, "min_p"), ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3.0}, "frequency_penalty"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"n": 0}, "n"), ({"max_tokens": 0}, "max_tokens"), ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
    ({"logprobs": -1}, "logprobs"), ({"seed": "7"}, "seed"), ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"allowed_token_ids": []}, "allowed_token_ids"), ({"bad_words": [[]]}, "bad_words"),
    ({"stop_token_ids": [-3]}, "stop_token_ids"),
])
def test_sampling_params_rejects(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_top_k_minus_one_means_off() -> None:
    assert SamplingParams(top_k=-1).top_k == 0


@pytest.mark.parametrize("params, field", [
    (SamplingParams(logit_bias={10: 1.0}), "logit_bias"),
    (SamplingParams(allowed_token_ids=[3, 10]), "allowed_token_ids"),
    (SamplingParams(bad_words=[[1, 12]]), "bad_words"),
    (SamplingParams(stop_token_ids=[10]), "stop_token_ids"),
])
def test_metadata_rejects_out_of_vocab_ids(params: SamplingParams, field: str) -> None:
    with pytest.raises(ValueError, match=rf"{field}.*\[0, 10\)"):
        SamplingMetadata.build([params], [[0]], [[]], 10, "cpu")


def test_metadata_rejects_bad_shapes() -> None:
    p = SamplingParams()
    with pytest.raises(ValueError, match="one entry per row"):
        SamplingMetadata.build([p, p], [[0]], [[], []], 10, "cpu")
    with pytest.raises(ValueError, match="eos_token_ids"):
        SamplingMetadata.build([p], [[0]], [[]], 10, "cpu", eos_token_ids=[1, 2])
    with pytest.raises(ValueError, match="eos_token_id"):
        SamplingMetadata.build([p], [[0]], [[]], 10, "cpu", eos_token_ids=[10])
    with pytest.raises(ValueError, match=r"bitmask must be int32 of shape \(1, 1\)"):
        SamplingMetadata.build([p], [[0]], [[]], 10, "cpu", bitmask=torch.zeros(1, 2, dtype=torch.int32))
    table = torch.zeros(3, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"bitmask_rows needs one index in \[0, 3\) per row"):
        SamplingMetadata.build([p, p], [[0]] * 2, [[]] * 2, 10, "cpu", bitmask=table,
                               bitmask_rows=[0, 3])
    with pytest.raises(ValueError, match="bitmask_rows needs one index"):
        SamplingMetadata.build([p, p], [[0]] * 2, [[]] * 2, 10, "cpu", bitmask=table,
                               bitmask_rows=[0])
    with pytest.raises(ValueError, match="pass bitmask too"):
        SamplingMetadata.build([p], [[0]], [[]], 10, "cpu", bitmask_rows=[0])
    meta = SamplingMetadata.build([p, p], [[0]] * 2, [[]] * 2, 10, "cpu", bitmask=table,
                                  bitmask_rows=[2, 0])
    assert meta.bitmask_rows.tolist() == [2, 0] and meta.bitmask.shape == (3, 1)
    with pytest.raises(ValueError, match="params must be SamplingParams"):
        SamplingMetadata.build([{"temperature": 0}], [[0]], [[]], 10, "cpu")
    meta = SamplingMetadata.build([p], [[0]], [[]], 10, "cpu")
    with pytest.raises(ValueError, match=r"\[num_rows, vocab_size\] = \[1, 10\]"):
        Sampler()(torch.zeros(1, 11), meta)


def test_beam_step_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="num_candidates"):
        beam_search_step(torch.zeros(2), torch.zeros(2, 5), 0)
    with pytest.raises(ValueError, match="cum_logprobs"):
        beam_search_step(torch.zeros(3), torch.zeros(2, 5), 2)


def test_metadata_sent_in_one_packed_copy_is_the_same(monkeypatch) -> None:
    """On CUDA the metadata tensors travel packed in one pinned buffer (toolkit.transfer.upload);
    the packing runs here on the CPU and must give every field back bit for bit."""
    import dataclasses
    import functools

    import toolkit.samplers.base as base
    from toolkit.transfer import upload

    v = 50
    params = [SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.1, seed=3, logprobs=2,
                             repetition_penalty=1.2, presence_penalty=0.5, logit_bias={4: 1.0},
                             allowed_token_ids=[1, 2, 4], bad_words=[[7], [3, 8]], min_tokens=3,
                             stop_token_ids=[9]),
              SamplingParams(temperature=0.0), SamplingParams(frequency_penalty=0.25)]
    args = (params, [[1, 2, 3], [4], [5, 6]], [[3], [], [6, 6, 7]], v, "cpu")
    plain = SamplingMetadata.build(*args, eos_token_ids=[0, 1, None])
    monkeypatch.setattr(base, "upload", functools.partial(upload, pack=True))
    packed = SamplingMetadata.build(*args, eos_token_ids=[0, 1, None])
    for f in dataclasses.fields(SamplingMetadata):
        a, b = getattr(plain, f.name), getattr(packed, f.name)
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            if isinstance(x, torch.Tensor):
                assert x.dtype == y.dtype and torch.equal(x, y), f.name
            else:
                assert x == y, f.name
    assert plain.bad_words is not None and plain.min_tokens is not None and plain.bias is not None


def test_metadata_from_numpy_prompts_is_the_same() -> None:
    """The engine hands prompts as int64 numpy arrays (Request.prompt_array, made once); the
    penalties' token lists come out as from Python lists, mixed rows and empty ones included."""
    import numpy as np

    v = 40
    params = [SamplingParams(repetition_penalty=1.3), SamplingParams(presence_penalty=0.5),
              SamplingParams(repetition_penalty=0.8), SamplingParams(temperature=0.0)]
    prompts = [[1, 2, 3, 2], [5], [7, 8], [9, 9, 9, 9, 9]]
    outputs = [[3], [5, 5], [], [1]]
    want = SamplingMetadata.build(params, prompts, outputs, v, "cpu")
    arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
    for given in (arrays, [arrays[0], prompts[1], arrays[2], prompts[3]]):
        got = SamplingMetadata.build(params, given, outputs, v, "cpu")
        assert torch.equal(got.prompt_tokens, want.prompt_tokens)
        assert torch.equal(got.output_tokens, want.output_tokens)
        assert got.penalty_rows.tolist() == [0, 1, 2]              # only the penalising rows
        assert got.prompt_tokens.tolist() == [[1, 2, 3, 2], [v] * 4, [7, 8, v, v]]


def test_kernel_knobs_and_saved_rows_are_checked() -> None:
    """The kernels' tuning knobs and the logprobs' saved rows: errors name what is valid."""
    from toolkit.kernels import reference_sampling as twin
    from toolkit.kernels.logprobs import gather_logprobs
    from toolkit.kernels.truncated_sample import truncated_sample

    x = torch.zeros(2, 8)
    tok = torch.zeros(2, dtype=torch.int64)
    ones, no = torch.ones(2), torch.zeros(2, dtype=torch.bool)
    with pytest.raises(ValueError, match="prefetch 0, 1 or 2"):
        truncated_sample(x, ones, no, None, None, None, tok, prefetch=3)
    with pytest.raises(ValueError, match="prefetch must be 0, 1 or 2"):
        gather_logprobs(x, tok, 1, prefetch=-1)
    for fn in (gather_logprobs, twin.gather_logprobs):
        with pytest.raises(ValueError, match="pass both or neither"):
            fn(x, tok, 1, saved=x[:1])

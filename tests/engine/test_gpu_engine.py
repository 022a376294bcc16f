"""The engine on CUDA: Triton attention + Triton model kernels + the fast sampler, fp32, equal
to HF greedy; speculative and structured paths run on the device too."""

from __future__ import annotations

import pytest

from toolkit import LLM, SamplingParams

pytestmark = pytest.mark.gpu


def _prompts():
    return [[5, 6, 7, 8, 9, 10, 11, 12] * 3, [40, 41], [100 + i for i in range(37)], [7] * 5]


def test_cuda_engine_greedy_equals_hf(tiny_llama_dir, hf_greedy):
    expected = hf_greedy(tiny_llama_dir, _prompts(), 12)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for kw in (dict(), dict(cuda_graphs=False), dict(num_blocks=24, block_size=4, max_num_batched_tokens=16),
               dict(speculative="ngram", num_speculative_tokens=3)):
        with LLM(tiny_llama_dir, dtype="float32", device="cuda", attention="triton", **kw) as llm:
            got = [o.outputs[0].token_ids for o in llm.generate(_prompts(), params, use_tqdm=False)]
        assert got == expected, kw


def test_cuda_engine_bf16_sampling_runs(tiny_llama_dir):
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, max_tokens=16, seed=3, ignore_eos=True)
    with LLM(tiny_llama_dir, dtype="bfloat16", device="cuda") as llm:
        a = llm.generate(_prompts(), params, use_tqdm=False)
        b = llm.generate(_prompts()[:1], params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 16 for o in a)
    assert a[0].outputs[0].token_ids == b[0].outputs[0].token_ids   # seeded: batch-independent

"""SampleGraphs on CUDA: the LM head and the sampler's fused tail replayed from one graph per
row bucket give the tokens the kernels give eagerly on the same logits and keys; the steady
path (metadata reused, rows not copied again) follows new hidden states; a step the tail
does not cover launches nothing; and the engine's seeded samples do not depend on it."""

from __future__ import annotations

import pytest
import torch

from toolkit import LLM, SamplingParams

pytestmark = pytest.mark.gpu


def _prompts():
    return [[5, 6, 7, 8, 9, 10, 11, 12] * 3, [40, 41], [100 + i for i in range(37)], [7] * 5]


def _meta(params, vocab):
    from toolkit.samplers import SamplingMetadata

    n = len(params)
    return SamplingMetadata.build(params, [[1]] * n, [[2]] * n, vocab, "cuda")


def test_graph_tokens_equal_the_eager_kernels_on_the_graph_logits(tiny_llama_dir):
    from toolkit.worker.sample_graphs import SampleGraphs
    from toolkit.kernels.truncated_sample import truncated_sample
    from toolkit.samplers.pipeline import Sampler

    with LLM(tiny_llama_dir, dtype="bfloat16", device="cuda", cuda_graphs=False) as llm:
        model = llm.engine.runner.model
        v = model.spec.vocab_size
        sg = SampleGraphs(model, Sampler(), 40, torch.device("cuda"))
        sg.logits.fill_(float("nan"))                   # poisoned: the graph must write its rows
        g = torch.Generator(device="cuda").manual_seed(0)
        for n in (1, 5, 16, 33, 5):                     # buckets 1, 8, 16, 40 (the largest), 8 again
            params = [SamplingParams(temperature=0.5 + 0.1 * i, top_p=0.9 if i % 2 else 1.0,
                                     seed=100 * n + i) for i in range(n)]
            meta = _meta(params, v)
            for _ in range(2):                           # the second time: rows not copied again
                hidden = torch.randn(n + 7, model.config.hidden_size, device="cuda", generator=g,
                                     dtype=torch.bfloat16)
                idx = torch.randperm(n + 7, device="cuda", generator=g)[:n]
                got = sg.sample(hidden, idx, meta)
                assert got is not None and got.shape == (n,) and got.dtype == torch.int64
                logits = sg.logits[:n].clone()
                assert not logits.isnan().any()
                torch.testing.assert_close(logits, model.compute_logits(hidden[idx]), rtol=1e-2, atol=1e-2)
                want = truncated_sample(logits, meta.temperature, meta.greedy, meta.min_p, meta.top_k,
                                        meta.top_p, meta.seed_keys)          # every row seeded
                assert torch.equal(got, want), n
        assert sg.num_replays == 10 and len(sg.graphs) == 4
        greedy = _meta([SamplingParams(temperature=0.0)] * 3, v)
        before = sg.hidden.clone()
        assert sg.sample(torch.randn(3, model.config.hidden_size, device="cuda", dtype=torch.bfloat16),
                         torch.arange(3, device="cuda"), greedy) is None
        assert torch.equal(sg.hidden, before) and sg.num_replays == 10      # nothing launched


def test_engine_samples_equal_with_and_without_sample_graphs(tiny_llama_dir):
    params = [SamplingParams(temperature=0.8, top_p=0.95 if i % 2 else 1.0, max_tokens=16, seed=i,
                             ignore_eos=True) for i in range(4)]
    runs = []
    for graphs in (True, False):
        with LLM(tiny_llama_dir, dtype="float32", device="cuda") as llm:
            sg = llm.engine.runner.sample_graphs
            assert sg is not None
            if not graphs:
                llm.engine.runner.sample_graphs = None
            runs.append([o.outputs[0].token_ids for o in llm.generate(_prompts(), params, use_tqdm=False)])
            if graphs:
                assert sg.num_replays > 0
    assert runs[0] == runs[1]
    assert all(len(t) == 16 for t in runs[0])

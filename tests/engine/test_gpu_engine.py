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


def test_cuda_forked_samples_equal_unforked(tiny_llama_dir):
    """n > 1 on CUDA: forked siblings (copy-on-write through the copy_blocks kernel, with and
    without CUDA graphs) sample the same tokens as siblings that compute the whole prompt."""
    prompt = list(range(3, 3 + 39))                      # a partial last block to copy
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    runs = []
    for kw, fork in ((dict(), True), (dict(cuda_graphs=False), True), (dict(), False)):
        with LLM(tiny_llama_dir, dtype="float32", device="cuda", block_size=4, num_blocks=64,
                 **kw) as llm:
            copies = []
            prepare = llm.engine.runner.prepare
            llm.engine.runner.prepare = lambda out, prev=None: (copies.extend(out.blocks_to_copy), prepare(out, prev))[1]
            if not fork:
                llm.engine.scheduler.fork = lambda req, parent: False
            out = llm.generate([prompt], params, use_tqdm=False)[0]
            assert llm.engine.scheduler.allocator.num_free_blocks() == 64
        assert (len(copies) == 2) == fork, (kw, copies)
        runs.append([c.token_ids for c in out.outputs])
    assert runs[0] == runs[1] == runs[2]
    assert len({tuple(t) for t in runs[0]}) > 1


def test_cuda_whole_forward_graphs_replay_decode_steps(tiny_llama_dir, hf_greedy):
    """Decode steps replay the whole-forward CUDA graph (attention over the bucket's static
    tables; a 450-token prompt alone splits its keys) and still give HF's greedy tokens;
    a step with a prefill chunk replays the pieces."""
    prompts = [[(7 * i) % 500 + 3 for i in range(450)], [40, 41], [9] * 30]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    for batch in (prompts[:1], prompts):
        expected = hf_greedy(tiny_llama_dir, batch, 20)
        with LLM(tiny_llama_dir, dtype="float32", device="cuda", attention="triton",
                 max_num_batched_tokens=64) as llm:
            graphs = llm.engine.runner.graphs
            before = graphs.num_full_replays
            got = [o.outputs[0].token_ids for o in llm.generate(batch, params, use_tqdm=False)]
            assert graphs.num_full_replays - before >= 18, graphs.num_full_replays
            if len(batch) == 1:
                assert llm.engine.runner.attention.schedule.split     # the last step split its keys
        assert got == expected, len(batch)


def test_capture_limit_past_the_decode_batch_replays_prefill_steps(tiny_llama_dir, hf_greedy):
    """max_cudagraph_capture_size above max_num_seqs: a step of a 300-token prompt replays the
    piecewise graphs (eagerly an 8B step of that size took 17-21 ms on the H200) and still
    gives HF's greedy tokens."""
    prompts = [[(5 * i) % 500 + 3 for i in range(300)], [40, 41]]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    expected = hf_greedy(tiny_llama_dir, prompts, 12)
    with LLM(tiny_llama_dir, dtype="float32", device="cuda", attention="triton", max_num_seqs=4,
             max_num_batched_tokens=512, max_cudagraph_capture_size=512) as llm:
        graphs = llm.engine.runner.graphs
        assert graphs.sizes[-1] == 512 == llm.engine.runner.graph_tokens
        before = graphs.num_piecewise_replays
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert graphs.num_piecewise_replays > before          # the prefill step (302 tokens)
    assert got == expected


def test_warm_up_leaves_nothing_to_compile(tiny_llama_dir):
    """After LLM(...), a workload's first generate compiles no Triton kernel (on the H200 the
    first generate of the nano workload compiled the sampler's late rounds and the split merge
    for 3.4 s): sampling row counts off the CUDA-graph buckets (not divisible by 16), long
    contexts alone in a step (many splits), prefill chunks beside decodes (the eager merge)."""
    import random

    from toolkit.testing import triton_compiles

    rng = random.Random(0)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(5, 400))] for _ in range(37)]
    # the kinds of rows the warm-up covers: temperature alone, greedy, top-k / top-p, mixed
    kinds = [dict(temperature=0.6), dict(temperature=0.0), dict(temperature=0.8, top_k=40, top_p=0.9)]
    params = [SamplingParams(max_tokens=rng.randint(2, 100), ignore_eos=True, **kinds[i % 3 if i < 30 else 0])
              for i in range(len(prompts))]
    with LLM(tiny_llama_dir, dtype="bfloat16", device="cuda", max_num_batched_tokens=256) as llm:
        with triton_compiles() as seen:
            llm.generate(prompts, params, use_tqdm=False)
            llm.generate(prompts[:1], params[:1], use_tqdm=False)      # one long context alone
    assert not seen, f"kernels compiled inside generate (the warm-up missed them): {seen}"


def test_cuda_penalty_history_equals_lists_rebuilt_per_step(tiny_llama_dir):
    """Penalised requests on CUDA (async steps, CUDA graphs, the history's device append after
    sampling) give the greedy tokens of the synchronous path whose lists are rebuilt per step."""
    prompts = [[5, 6, 7, 8, 9, 10] * 3, [11, 12, 13] * 5, [20, 21, 22, 23], [30, 31] * 4]
    params = [SamplingParams(max_tokens=20, temperature=0, repetition_penalty=1.5, ignore_eos=True),
              SamplingParams(max_tokens=20, temperature=0, presence_penalty=1.0, frequency_penalty=0.5,
                             ignore_eos=True),
              SamplingParams(max_tokens=20, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=20, temperature=0, repetition_penalty=1.3, n=2, ignore_eos=True)]
    outs = {}
    for mode in ("history", "lists"):
        with LLM(tiny_llama_dir, dtype="float32", device="cuda", block_size=4, num_blocks=64) as llm:
            if mode == "lists":
                llm.engine.runner.penalty_history = None
            res = llm.generate(prompts, params, use_tqdm=False)
            outs[mode] = [[o.token_ids for o in r.outputs] for r in res]
            if mode == "history":
                assert llm.engine.runner.penalty_history.num_uploaded_tokens > 0
            assert llm.engine.scheduler.allocator.num_free_blocks() == 64
    assert outs["history"] == outs["lists"]


def test_observed_cuda_steps_carry_their_gpu_time(tiny_llama_dir):
    """With an observer that asks for it, each plain CUDA step's record holds its stream time
    (events around the step's work, read when its tokens land); otherwise nothing is timed."""
    recs = []
    with LLM(tiny_llama_dir, dtype="float32", device="cuda") as llm:
        llm.generate(_prompts(), SamplingParams(max_tokens=4, ignore_eos=True))    # the bar observes
        assert llm.engine.runner.time_gpu is False
        llm.engine.add_observer(recs.append, gpu_time=True)
        llm.generate(_prompts(), SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    timed = [r.gpu_time for r in recs if r.gpu_time is not None]
    assert len(timed) >= len(recs) - 1 and len(recs) >= 8, [r.gpu_time for r in recs]
    assert all(0 < g < 1.0 for g in timed), timed
    waited = [r.wait_time for r in recs if r.wait_time is not None]    # the host's wait for tokens
    assert len(waited) >= len(recs) - 1 and all(0 <= w < 1.0 for w in waited), waited


def test_prefill_steps_past_the_decode_buckets_replay_pieces(tiny_llama_dir, hf_greedy):
    """Steps of 513-2048 tokens replay piecewise graphs (by default every step of the budget
    does; whole-forward graphs stop at 512) whose buckets share one attention output and let
    q's memory go back to the pool: steps of several such buckets, one after another, give
    HF's greedy tokens, and nothing compiles inside generate."""
    import random

    from toolkit.testing import triton_compiles

    rng = random.Random(1)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(150, 450))] for _ in range(14)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    expected = hf_greedy(tiny_llama_dir, prompts, 6)
    with LLM(tiny_llama_dir, dtype="float32", device="cuda", attention="triton", max_num_seqs=16,
             max_num_batched_tokens=2048) as llm:
        graphs = llm.engine.runner.graphs
        assert graphs.sizes[-1] == 2048 and graphs.full_tokens == 512
        assert not any(graphs.graphs[b].full for b in graphs.graphs if b > 512)
        before = graphs.num_piecewise_replays
        with triton_compiles() as seen:
            got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert graphs.num_piecewise_replays > before
        # every layer and bucket writes one attention output
        outs = {out.data_ptr() for g in graphs.graphs.values() for _, _, out in g.calls}
        assert outs == {graphs._out.data_ptr()}
    assert got == expected
    assert not seen, f"kernels compiled inside generate (the warm-up missed them): {seen}"

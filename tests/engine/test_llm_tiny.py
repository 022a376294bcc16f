"""End-to-end greedy equality on a tiny random Llama: the engine's output must not depend on
batch composition, chunk size, KV pool size (preemption), prefix caching, or the scheduler,
and must equal Hugging Face generate."""

from __future__ import annotations

import random

import pytest

from toolkit import LLM, SamplingParams

MAX_NEW = 12


def _prompts(seed: int = 0, n: int = 6) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 517) for _ in range(20)]   # a shared prefix (prefix-cache hits)
    out = []
    for i in range(n):
        tail = [rng.randrange(3, 517) for _ in range(rng.randrange(1, 40))]
        out.append((shared if i % 2 else []) + tail)
    return out


@pytest.fixture(scope="module")
def expected(tiny_llama_dir, hf_greedy):
    return hf_greedy(tiny_llama_dir, _prompts(), MAX_NEW)


def _run(model_dir, prompts, stats: dict | None = None, **kw) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    with LLM(model_dir, dtype="float32", device="cpu", **kw) as llm:
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        if stats is not None:
            stats["preemptions"] = llm.engine.num_preemptions
        return outs


CONFIGS = {
    "default": dict(),
    "small_chunks": dict(max_num_batched_tokens=7),
    "preempting_pool": dict(num_blocks=24, block_size=4, max_num_batched_tokens=16),
    "no_prefix_cache": dict(enable_prefix_caching=False, block_size=8),
    "one_seq": dict(max_num_seqs=1),
    "static": dict(scheduler="static", max_num_seqs=3),
    "reference_scheduler": dict(scheduler="reference"),
    "radix": dict(allocator="radix"),
    "radix_preempting_pool": dict(allocator="radix", num_blocks=24, block_size=4, max_num_batched_tokens=16),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_equals_hf(tiny_llama_dir, expected, name):
    stats: dict = {}
    assert _run(tiny_llama_dir, _prompts(), stats, **CONFIGS[name]) == expected
    if name.endswith("preempting_pool"):
        assert stats["preemptions"] > 0, "the small pool was meant to force preemption"


def test_batch_order_does_not_matter(tiny_llama_dir, expected):
    prompts = _prompts()
    order = list(range(len(prompts)))[::-1]
    got = _run(tiny_llama_dir, [prompts[i] for i in order], max_num_batched_tokens=23)
    assert [got[order.index(i)] for i in range(len(prompts))] == expected


def test_bad_input_is_rejected_and_engine_goes_on(tiny_llama_dir):
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", max_model_len=64, num_blocks=12,
             block_size=4) as llm:
        with pytest.raises(ValueError, match="empty"):
            llm.generate([[]], use_tqdm=False)
        with pytest.raises(ValueError, match="max_model_len"):
            llm.generate([[5] * 64], use_tqdm=False)
        with pytest.raises(ValueError, match="KV blocks"):
            llm.generate([[5] * 60], use_tqdm=False)       # 16 blocks > 12 in the cache
        with pytest.raises(ValueError, match="max_tokens"):
            SamplingParams(max_tokens=0)
        with pytest.raises(ValueError, match=r"\[0, 517\)"):
            llm.generate([[5, 999]], use_tqdm=False)
        for bad in (dict(logit_bias={999: 1.0}), dict(allowed_token_ids=[1000]),
                    dict(bad_words=[[5, 999]]), dict(stop_token_ids=[600])):
            field = next(iter(bad))
            with pytest.raises(ValueError, match=rf"{field} has token ids .* \[0, 517\)"):
                llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, **bad), use_tqdm=False)
            assert not llm.engine.has_unfinished()
        free = llm.engine.scheduler.allocator.num_free_blocks()
        out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 3
        assert llm.engine.scheduler.allocator.num_free_blocks() == free == 12


def test_unknown_component_name_lists_valid(tiny_llama_dir):
    with pytest.raises(ValueError, match="valid names"):
        LLM(tiny_llama_dir, device="cpu", scheduler="round_robin")
    with pytest.raises(ValueError, match="valid options"):
        LLM(tiny_llama_dir, device="cpu", not_an_option=3)


def test_stop_token_ids_and_max_model_len(tiny_llama_dir, expected):
    prompt = _prompts()[0]
    stop = expected[0][4]
    cut = expected[0].index(stop)
    with LLM(tiny_llama_dir, dtype="float32", device="cpu") as llm:
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True,
                                                    stop_token_ids=[stop]), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == expected[0][:cut + 1]
    assert out.outputs[0].finish_reason == "stop"
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", max_model_len=len(prompt) + 5) as llm:
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True),
                           use_tqdm=False)[0]
    assert out.outputs[0].token_ids == expected[0][:5]
    assert out.outputs[0].finish_reason == "length"


def test_abort_frees_blocks_at_once(tiny_llama_dir):
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=32, block_size=4) as llm:
        eng = llm.engine
        alloc = eng.scheduler.allocator
        rid = eng.add_request(list(range(3, 30)), SamplingParams(max_tokens=50, ignore_eos=True))
        eng.step()
        assert alloc.num_free_blocks() < 32
        eng.abort(rid)
        assert alloc.num_free_blocks() == 32
        assert not eng.has_unfinished()


def test_prompt_logprobs_equal_hf_and_survive_chunking(tiny_llama_dir):
    import torch
    from transformers import AutoModelForCausalLM

    prompt = _prompts()[1]
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), -1)   # [P, V]
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3, logprobs=1)
    for kw in (dict(), dict(max_num_batched_tokens=7)):
        with LLM(tiny_llama_dir, dtype="float32", device="cpu", **kw) as llm:
            out = llm.generate([prompt, prompt], params, use_tqdm=False)[0]
        lps = out.prompt_logprobs
        assert lps[0] is None and len(lps) == len(prompt)
        for p in range(1, len(prompt)):
            row = ref[p - 1]
            assert abs(lps[p][prompt[p]] - row[prompt[p]].item()) < 1e-4
            top = set(row.topk(3).indices.tolist()) | {prompt[p]}
            assert set(lps[p]) == top
        assert len(out.outputs[0].logprobs) == 2


def test_n_samples_share_prompt_blocks(tiny_llama_dir):
    """n > 1: samples 1.. are forked onto sample 0's prompt blocks once it has computed them
    (ref += 1, nothing recomputed but the last prompt token), and the partial last block is
    copied on write through copy_blocks: by the first two of its three holders to write, the
    third writes in place. The tokens equal those of siblings that compute the whole prompt."""
    prompt = list(range(3, 3 + 39))                      # 9 full blocks of 4 and 3 tokens
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=4, num_blocks=64) as llm:
        eng = llm.engine
        copies, forked = [], []
        prepare, fork = eng.runner.prepare, eng.scheduler.fork

        def spy_prepare(out, prev=None):
            copies.extend(out.blocks_to_copy)
            return prepare(out, prev)

        def spy_fork(req, parent):
            forked.append(fork(req, parent))
            return forked[-1]
        eng.runner.prepare, eng.scheduler.fork = spy_prepare, spy_fork
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        assert eng.scheduler.allocator.num_free_blocks() == 64
    assert forked == [True, True]
    assert len(copies) == 2 and copies[0][0] == copies[1][0] and copies[0][1] != copies[1][1]
    assert len(out.outputs) == 3 and len({tuple(c.token_ids) for c in out.outputs}) > 1
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=4, enable_prefix_caching=False) as llm:
        llm.engine.scheduler.fork = lambda req, parent: False       # every sibling computes it all
        again = llm.generate([prompt], params, use_tqdm=False)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]


def test_forked_samples_survive_preemption(tiny_llama_dir):
    """A cache too small for every sample at once: forked siblings and their parent get
    preempted and recomputed, outputs stay those of an ample cache, and no block leaks."""
    prompt = list(range(5, 5 + 22))
    params = SamplingParams(n=4, temperature=0.8, seed=11, max_tokens=24, ignore_eos=True)
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=4, num_blocks=64) as llm:
        want = llm.generate([prompt], params, use_tqdm=False)[0]
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=4, num_blocks=20) as llm:
        got = llm.generate([prompt], params, use_tqdm=False)[0]
        assert llm.engine.num_preemptions > 0
        assert llm.engine.scheduler.allocator.num_free_blocks() == 20
    assert [c.token_ids for c in got.outputs] == [c.token_ids for c in want.outputs]


def test_every_eos_id_of_the_model_stops(tiny_llama_dir, expected):
    """A model with several end tokens (Llama 3's) stops at any of them unless ignore_eos."""
    prompt, first = _prompts()[0], expected[0]
    with LLM(tiny_llama_dir, dtype="float32", device="cpu") as llm:
        m = llm.engine.model                 # the spec the engine reads at each add_request
        m.spec = __import__("dataclasses").replace(m.spec, eos_token_ids=(llm.engine.eos_token_id, first[3]))
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=MAX_NEW), use_tqdm=False)[0]
        assert out.outputs[0].token_ids == first[:first.index(first[3]) + 1]
        assert out.outputs[0].finish_reason == "stop"
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True),
                           use_tqdm=False)[0]
        assert out.outputs[0].token_ids == first


def test_output_kind_final_reports_once_with_what_cumulative_reports_last(tiny_llama_dir):
    """output_kind="final" (LLM.generate's): one RequestOutput per request, when it finishes,
    equal to the last cumulative one; a bad kind is refused with the valid ones named."""
    params = SamplingParams(temperature=0, max_tokens=7, ignore_eos=True, logprobs=1)
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=64, block_size=4) as llm:
        eng = llm.engine
        seen: dict[str, list] = {"c": [], "f": []}
        eng.add_request(list(range(3, 12)), params, request_id="c")
        eng.add_request(list(range(3, 12)), params, request_id="f", output_kind="final")
        while eng.has_unfinished():
            for o in eng.step():
                seen[o.request_id].append(o)
        assert len(seen["c"]) == 7 and len(seen["f"]) == 1 and seen["f"][0].finished
        c, f = seen["c"][-1].outputs[0], seen["f"][0].outputs[0]
        assert f.token_ids == c.token_ids and len(f.token_ids) == 7
        # two rows of one batch: an fp32 logprob may differ in its last bits between rows
        # (the GEMM's reduction order depends on the row), so equal ids, close values
        assert f.finish_reason == c.finish_reason == "length"
        assert [list(d) for d in f.logprobs] == [list(d) for d in c.logprobs]
        for fd, cd in zip(f.logprobs, c.logprobs):
            assert all(fd[t] == pytest.approx(cd[t], rel=1e-5, abs=1e-5) for t in cd)
        with pytest.raises(ValueError, match="output_kind must be one of"):
            eng.add_request([3, 4], params, output_kind="delta-ish")
        assert not eng.has_unfinished()


def test_one_kernels_switch_picks_every_reference_twin(tiny_llama_dir, expected):
    """EngineConfig.kernels="reference": the model's ops, the attention backend, the sampler
    and the block copies are the reference twins, and greedy output is unchanged."""
    from toolkit.attention.torch_ref import TorchAttention
    from toolkit.kernels import reference_model
    from toolkit.samplers.reference import ReferenceSampler

    prompt = _prompts()[0]
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", kernels="reference") as llm:
        r = llm.engine.runner
        assert isinstance(r.attention, TorchAttention) and isinstance(r.sampler, ReferenceSampler)
        assert r.model.ops.rms_norm is reference_model.rms_norm and r.executor.runner.copy_backend == "torch"
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=MAX_NEW), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == expected[0][:len(out.outputs[0].token_ids)]
    with pytest.raises(ValueError, match="kernels must be one of"):
        LLM(tiny_llama_dir, device="cpu", kernels="fast")


def test_an_eos_id_outside_the_vocabulary_is_dropped_with_a_warning(caplog):
    """OlmoeConfig's default eos 50279 kept on a small vocabulary: the engine warns and
    generates (it failed every request), as transformers only warns."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=500, eos_token_id=[50279, 7],
                      max_position_embeddings=256)
    with caplog.at_level("WARNING", logger="toolkit"), \
            LLM(cfg, device="cpu", dtype="float32", num_blocks=32) as llm:
        assert llm.engine.model.spec.eos_token_ids == (7,)
        out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    assert any("50279" in r.getMessage() and "outside the vocabulary" in r.getMessage() for r in caplog.records)

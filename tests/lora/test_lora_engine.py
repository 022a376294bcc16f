"""Multi-LoRA end to end on a tiny random Llama: per request, greedy equal to PEFT's merged
model, in one batch mixing the base model and adapters of different ranks and targets, with
more adapters than slots (eviction and reload mid-run); errors that leave the engine clean."""

from __future__ import annotations

import pytest
import torch

from lora_adapters import make_adapter

from toolkit import LLM, LoRARequest, SamplingParams

PROMPTS = [[5, 17, 99, 3, 250, 41, 7, 8, 9, 11, 12, 13, 400, 401, 402, 403, 404, 405],
           [300, 301, 7, 7, 19], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]]
NEW = 6


_GREEDY: dict = {}     # (model, prompt, n) -> tokens: each reference generation runs once


def hf_greedy(model: torch.nn.Module, prompt: list[int], n: int = NEW) -> list[int]:
    key = (id(model), tuple(prompt), n)
    if key not in _GREEDY:
        _GREEDY[key] = _hf_greedy(model, prompt, n)
    return _GREEDY[key]


def _hf_greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        ids = torch.tensor([prompt])
        g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0)
    return g[0, len(prompt):].tolist()


def lreq(name: str, adapters) -> LoRARequest:
    lid, folder, _ = adapters[name]
    return LoRARequest(name, lid, str(folder))


def assert_clean(llm: LLM) -> None:
    e = llm.engine
    pool = e.scheduler.lora_pool
    assert not e.scheduler._lora_held and all(pool.refcount(a) == 0 for a in range(1, 10))
    assert pool.num_free_slots() == pool.num_slots
    assert e.allocator.num_free_blocks() == e.allocator.num_blocks


@pytest.fixture(scope="module")
def llm(lora_base):
    _, folder = lora_base
    with LLM(str(folder), enable_lora=True, max_loras=2, max_lora_rank=16, max_cpu_loras=2, num_blocks=64,
             block_size=4, max_num_seqs=3) as llm:
        yield llm


def test_mixed_batch_equals_peft_merged(llm, lora_base, adapters):
    base, _ = lora_base
    names = [None, "qv8", "all4", "mlp16", "qv8", None, "mlp16", "all4", "qv8"]
    prompts = [PROMPTS[i % 3] for i in range(len(names))]     # one prompt under several adapters
    reqs = [lreq(n, adapters) if n else None for n in names]
    sp = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, sp, lora_request=reqs, use_tqdm=False)
    want_base = {i: hf_greedy(base, PROMPTS[i]) for i in range(3)}
    for n, p, o in zip(names, prompts, outs):
        assert (o.lora_request.lora_name if o.lora_request else None) == n      # vLLM's RequestOutput field
        ref = adapters[n][2] if n else base
        want = hf_greedy(ref, p)
        assert o.outputs[0].token_ids == want, (n, p)
        if n:                                      # the adapter matters
            assert want != want_base[PROMPTS.index(p)], n
    state = llm.engine.runner.lora
    assert state.num_loads > 3                     # 3 adapters, 2 slots: evicted and reloaded
    assert state.host.num_reads > 3                # 2 host slots: read again from the folder
    assert_clean(llm)


def test_one_request_for_all_prompts_and_prefix_cache(llm, lora_base, adapters):
    """lora_request given once applies to every prompt; the same adapter shares prompt blocks
    (a hit the second time), a different adapter never does."""
    sp = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    prompt = PROMPTS[2][::-1]                     # not seen by any other test
    first = llm.generate([prompt], sp, lora_request=lreq("all4", adapters), use_tqdm=False)[0]
    again = llm.generate([prompt] * 2, sp, lora_request=lreq("all4", adapters), use_tqdm=False)
    other = llm.generate([prompt], sp, lora_request=lreq("mlp16", adapters), use_tqdm=False)[0]
    plain = llm.generate([prompt], sp, use_tqdm=False)[0]
    assert all(o.outputs[0].token_ids == first.outputs[0].token_ids for o in again)
    assert first.metrics.num_cached_tokens == 0 and again[0].metrics.num_cached_tokens >= 16
    assert other.metrics.num_cached_tokens == 0 and plain.metrics.num_cached_tokens == 0
    assert other.outputs[0].token_ids == hf_greedy(adapters["mlp16"][2], prompt, 3)
    assert plain.outputs[0].token_ids == hf_greedy(lora_base[0], prompt, 3)
    assert_clean(llm)


def test_bad_adapters_raise_and_leave_the_engine_clean(llm, lora_base, adapters, tmp_path):
    sp = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    llm.generate([PROMPTS[1]], sp, lora_request=lreq("qv8", adapters), use_tqdm=False)   # id 1 is known
    with pytest.raises(ValueError, match="adapter_config.json"):
        llm.generate([PROMPTS[0]], sp, lora_request=LoRARequest("nope", 9, str(tmp_path / "missing")),
                     use_tqdm=False)
    big = tmp_path / "r32"
    make_adapter(lora_base[0], big, r=32, targets=["q_proj"], alpha=32.0)
    with pytest.raises(ValueError, match="max_lora_rank=16"):
        llm.generate([PROMPTS[0], PROMPTS[1]], sp, lora_request=[None, LoRARequest("big", 8, str(big))],
                     use_tqdm=False)
    with pytest.raises(ValueError, match="already adapter"):
        llm.generate([PROMPTS[0]], sp, lora_request=LoRARequest("other", 1, str(big)), use_tqdm=False)
    with pytest.raises(TypeError, match="lora_int_id"):
        LoRARequest("x", "1", "/tmp")
    assert_clean(llm)
    out = llm.generate([PROMPTS[1]], sp, lora_request=lreq("qv8", adapters), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == hf_greedy(adapters["qv8"][2], PROMPTS[1], 2)
    assert_clean(llm)


def test_lora_request_needs_enable_lora(lora_base, adapters):
    with LLM(str(lora_base[1]), num_blocks=16, block_size=4) as llm:
        with pytest.raises(ValueError, match="enable_lora=True"):
            llm.generate([PROMPTS[1]], SamplingParams(max_tokens=2), lora_request=lreq("qv8", adapters),
                         use_tqdm=False)
        assert llm.engine.allocator.num_free_blocks() == llm.engine.allocator.num_blocks


@pytest.mark.gpu
def test_cuda_graphs_replay_with_adapters(lora_base, adapters):
    """On CUDA the decode steps replay CUDA graphs whose input is the slot-index buffer: the
    mixed batch still equals PEFT's merged models (fp32), and steps were replayed."""
    base, folder = lora_base
    names = [None, "qv8", "all4", "mlp16", "qv8"]
    with LLM(str(folder), enable_lora=True, max_loras=2, max_lora_rank=16, dtype="float32",
             cuda_graphs=True, device="cuda", max_num_seqs=4) as llm:
        assert llm.engine.runner.graphs is not None
        outs = llm.generate([PROMPTS[i % 3] for i in range(5)], SamplingParams(max_tokens=NEW, ignore_eos=True),
                            lora_request=[lreq(n, adapters) if n else None for n in names], use_tqdm=False)
        for i, (n, o) in enumerate(zip(names, outs)):
            ref = adapters[n][2] if n else base
            assert o.outputs[0].token_ids == hf_greedy(ref, PROMPTS[i % 3])
        assert_clean(llm)


def test_n_samples_share_the_adapter(llm, adapters):
    """n > 1: samples 1.. fork sample 0's prompt blocks and hold its adapter's slot too."""
    out = llm.generate([PROMPTS[0]], SamplingParams(n=2, max_tokens=4, temperature=0.0, ignore_eos=True),
                       lora_request=lreq("mlp16", adapters), use_tqdm=False)[0]
    want = hf_greedy(adapters["mlp16"][2], PROMPTS[0], 4)
    assert [c.token_ids for c in out.outputs] == [want, want]
    assert_clean(llm)


@pytest.mark.slow
def test_embedded_smollm2_adapter_equals_peft_merged(tmp_path):
    """A PEFT adapter on the embedded SmolLM2-135M (tied embeddings, 30 layers): greedy equal
    to the merged model's, next to a base request in one batch."""
    from transformers import AutoModelForCausalLM

    from toolkit.models import default_model_path

    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    merged = make_adapter(hf, tmp_path / "smol", r=8, targets=["q_proj", "v_proj", "down_proj"], alpha=16.0,
                          gain=1.5)
    prompt = [1, 504, 3458, 282, 4649, 314, 216]
    with LLM(str(path), enable_lora=True, max_loras=1, max_lora_rank=8, num_blocks=32, block_size=16) as llm:
        outs = llm.generate([prompt, prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                            lora_request=[LoRARequest("smol", 1, str(tmp_path / "smol")), None], use_tqdm=False)
        assert outs[0].outputs[0].token_ids == hf_greedy(merged, prompt, 8)
        assert outs[1].outputs[0].token_ids == hf_greedy(hf, prompt, 8)
        assert_clean(llm)

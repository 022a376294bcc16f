"""Each Llama-family architecture, saved by transformers and loaded by our loader, equals
Hugging Face: logits of a ragged batch through the paged cache (prefill chunks and decode
steps mixed in one batch), and greedy generation token for token."""

from __future__ import annotations

import pytest
import torch
from model_configs import FAMILIES
from paged import PagedRunner, greedy, run_schedule

from toolkit.models import load_model
from toolkit.models.llama import LlamaForCausalLM

# sequence -> its chunks, one per step (a chunk of 1 after the prompt is a decode step)
SCHEDULE = {
    "a": [13, 1, 1, 1],     # prefill then decodes
    "b": [1, 1, 1, 1, 1],   # token by token from the start
    "c": [10, 19, 2, 1],    # chunked prefill longer than the sliding window and the block size
    "d": [7],               # one shot, finishes early
    "e": [0, 0, 5, 3],      # joins later
}


def _run_schedule(model: LlamaForCausalLM, tokens: dict[str, list[int]], runner=None) -> dict[str, torch.Tensor]:
    return run_schedule(runner or PagedRunner(model, block_size=4), SCHEDULE, tokens)


@pytest.mark.parametrize("family", FAMILIES)
def test_ragged_paged_logits_equal_hf(family, hf_checkpoint):
    hf, folder = hf_checkpoint(family)
    model = load_model(folder, dtype=torch.float32, device="cpu")
    assert isinstance(model, LlamaForCausalLM)
    g = torch.Generator().manual_seed(1)
    tokens = {s: torch.randint(0, 517, (sum(c),), generator=g).tolist() for s, c in SCHEDULE.items()}
    got = _run_schedule(model, tokens)
    for s, toks in tokens.items():
        with torch.no_grad():
            want = hf(torch.tensor([toks])).logits[0].float()      # [S, V]
        assert want.abs().max() > 1.0, "logits too small to be a meaningful comparison"
        torch.testing.assert_close(got[s], want, rtol=1e-4, atol=1e-4, msg=lambda m, s=s: f"{family}/{s}: {m}")


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_32_tokens_equal_hf_generate(family, hf_checkpoint):
    hf, folder = hf_checkpoint(family)
    model = load_model(folder)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 517, (n,), generator=g).tolist() for n in (5, 11, 3)]
    ours = greedy(model, prompts, max_new_tokens=32, block_size=4, prefill_chunk=4)
    for prompt, out in zip(prompts, ours):
        ids = torch.tensor([prompt])
        want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=0,
                           do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert len(want) == 32
        assert out == want, f"{family}: greedy tokens differ from HF generate"
    assert len({t for out in ours for t in out}) > 6, "degenerate generation would make the comparison weak"


def test_model_interface(hf_checkpoint):
    from toolkit.models.base import LayerAttention, check_model

    _, folder = hf_checkpoint("mistral")
    model = load_model(folder)
    spec = check_model(model)
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.vocab_size) == (2, 6, 2, 20, 517)
    assert spec.layers == (LayerAttention("sliding", 9),) * 2
    assert spec.max_model_len == 512 and spec.eos_token_ids == (2,) and spec.architecture == "MistralForCausalLM"
    # merged projections: one qkv and one gate_up matmul per layer
    names = {n for n, _ in model.named_parameters()}
    assert "model.layers.0.self_attn.qkv_proj.weight" in names and "model.layers.0.mlp.gate_up_proj.weight" in names
    assert not any(".q_proj." in n or ".gate_proj." in n for n in names)
    assert model.model.layers[0].self_attn.qkv_proj.weight.shape == ((6 + 2 * 2) * 20, 96)
    with pytest.raises(ValueError, match="lacks"):
        check_model(object())


def test_tied_embeddings_share_storage(hf_checkpoint):
    _, folder = hf_checkpoint("qwen2")
    model = load_model(folder)
    assert model.lm_head is None
    h = torch.randn(3, 96)
    torch.testing.assert_close(model.compute_logits(h), h @ model.model.embed_tokens.weight.T)


@pytest.mark.parametrize("family", ["llama", "llama3", "qwen2"])     # power-of-two head sizes
def test_triton_model_kernels_inside_the_model(family, hf_checkpoint):
    # The Triton kernels (interpreted on the CPU, fp32) on the model's real, strided inputs:
    # q/k are views of the merged qkv matmul; Qwen3 normalises them per head first.
    hf, folder = hf_checkpoint(family)
    model = load_model(folder, kernels="triton")       # the one switch: every op of the model
    tokens = torch.randint(0, 517, (11,), generator=torch.Generator().manual_seed(3)).tolist()
    runner = PagedRunner(model, block_size=4)
    table = runner.new_table()
    got = torch.cat([runner.step([table], [tokens[:8]], [0]), runner.step([table], [tokens[8:]], [8])])
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "llama3", "qwen2"])     # power-of-two head sizes
def test_triton_attention_with_tma_prefills_equals_the_reference(family, hf_checkpoint):
    """fp16 through the model with TritonPagedAttention (under TRITON_INTERPRET=1 on the CPU):
    whole prompts and chunks of 16+ tokens after a prefix ("c"'s 19) take the TMA prefill tiles
    (write_kv then run, as the model calls them; 16-token tiles here), shorter chunks and
    decodes the paged kernel; logits equal the reference backend's."""
    from dataclasses import replace
    from functools import partial

    from toolkit.attention.schedule import TileConfig
    from toolkit.attention.triton_paged import TritonPagedAttention
    from toolkit.attention.tuning import default_config

    _, folder = hf_checkpoint(family)
    model = load_model(folder, dtype=torch.float16, device="cpu")
    g = torch.Generator().manual_seed(3)
    tokens = {s: torch.randint(0, 517, (sum(c),), generator=g).tolist() for s, c in SCHEDULE.items()}
    want = _run_schedule(model, tokens)
    geo = model.spec
    cfg = replace(default_config(torch.float16, geo.head_dim, geo.num_heads // geo.num_kv_heads, torch.device("cpu")),
                  self_prefill=TileConfig(block_q=16, block_n=16, num_warps=4, num_stages=1))
    fast = PagedRunner(model, block_size=4, backend=partial(TritonPagedAttention, config=cfg))
    plans = []                                   # per step: did its TMA tiles carry a cached prefix
    plan = fast.attention.plan
    fast.attention.plan = lambda layout: (plan(layout), plans.append(fast.attention._self_prefix))[0]
    got = _run_schedule(model, tokens, fast)
    assert fast.attention.num_self_prefill_launches > 0 and any(plans), "no chunk after a prefix took the TMA path"
    for s in tokens:
        torch.testing.assert_close(got[s], want[s], rtol=2e-2, atol=2e-2, msg=lambda m, s=s: f"{family}/{s}: {m}")

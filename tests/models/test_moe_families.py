"""The mixture-of-experts families (Mixtral, Qwen3-MoE, OLMoE), each saved by transformers and
read by the toolkit's loader: ragged-batch logits through the paged cache equal Hugging Face's,
greedy decoding on the paged path and through LLM (a KV pool small enough to preempt) equals
transformers' generate, every checkpoint tensor finds its place, and random weights at the
checkpoint's shapes run."""

from __future__ import annotations

import pytest
import torch
from moe_configs import MOE_FAMILIES, moe_config
from paged import PagedRunner, greedy, run_schedule
from safetensors.torch import load_file

from toolkit import LLM, SamplingParams
from toolkit.models import load_model
from toolkit.models.layers.moe import FusedMoE, GroupedTopK, SparseMoeBlock

# sequence -> its chunks, one per step (a chunk of 1 after the prompt is a decode step)
ARCH = {"mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM",
        "dots1": "Dots1ForCausalLM"}
SPARSE = {"qwen3_moe": [0, 2], "dots1": [1, 2]}     # the layers with experts where not all
SCHEDULE = {"a": [11, 1, 1], "b": [1, 1, 1, 1], "c": [6, 5, 1], "d": [0, 4, 2]}


def _hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                       eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_ragged_paged_logits_equal_hf(family, hf_checkpoint):
    hf, folder = hf_checkpoint(family)
    model = load_model(folder)
    assert type(model).__name__ == hf.config.architectures[0]
    g = torch.Generator().manual_seed(1)
    tokens = {s: torch.randint(0, 211, (sum(c),), generator=g).tolist() for s, c in SCHEDULE.items()}
    got = run_schedule(PagedRunner(model, block_size=4), SCHEDULE, tokens)
    for s, toks in tokens.items():
        with torch.no_grad():
            want = hf(torch.tensor([toks])).logits[0].float()      # [S, V]
        assert want.std() > 0.1, "logits too flat to be a meaningful comparison"
        torch.testing.assert_close(got[s], want, rtol=1e-4, atol=1e-4,
                                   msg=lambda m, s=s: f"{family}/{s}: {m}")


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_greedy_on_the_paged_path_equals_hf_generate(family, hf_checkpoint):
    hf, folder = hf_checkpoint(family)
    model = load_model(folder)
    prompts = [[5, 17, 99, 3, 42, 8, 150], [7, 7, 200], [60, 1, 2, 3, 4, 5, 6, 9, 11, 13]]
    got = greedy(model, prompts, max_new_tokens=8, prefill_chunk=4)
    for p, g in zip(prompts, got):
        assert g == _hf_greedy(hf, p, 8), family


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_greedy_through_llm_equals_hf_generate_under_preemption(family, hf_checkpoint):
    hf, folder = hf_checkpoint(family)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 211, (n,), generator=g).tolist() for n in (14, 9, 17)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    # 3 x (<= 27 tokens) need 19+ blocks of 4 at once: 10 blocks force preemption
    with LLM(folder, dtype="float32", device="cpu", block_size=4, num_blocks=10, max_num_seqs=3,
             max_num_batched_tokens=16, enable_prefix_caching=False) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        assert llm.engine.num_preemptions > 0
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == _hf_greedy(hf, p, 10), family


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_every_checkpoint_tensor_fills_every_shard(family, hf_checkpoint):
    """load_weights reports each (parameter, shard) written; a checkpoint of the family fills all
    of them: every expert's w1 / w3 / w2, the gates, the dense layers."""
    _, folder = hf_checkpoint(family)
    model = load_model(folder)
    want = {(name, i) for name, n in model.expected_weights().items() for i in range(n)}
    got = model.load_weights(load_file(f"{folder}/model.safetensors").items())   # the checkpoint's names
    assert got == want
    experts = [m for m in model.modules() if isinstance(m, FusedMoE)]
    c = moe_config(family)
    sparse = [i for i, layer in enumerate(model.model.layers) if isinstance(getattr(layer, layer.mlp_name), SparseMoeBlock)]
    assert sparse == SPARSE.get(family, list(range(c.num_hidden_layers)))
    assert len(experts) == len(sparse)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_random_weights_through_init_random_run(family):
    config = moe_config(family)
    config.architectures = [ARCH[family]]
    model = load_model(config, dtype=torch.float32)          # a config: random weights (init_random)
    for m in model.modules():
        if isinstance(m, FusedMoE):
            w = m.w13_weight
            assert w.std() > 0.01 and torch.isfinite(w).all()
            assert not torch.equal(w[0], w[1]), "experts drew the same weights"
    runner = PagedRunner(model, block_size=4)
    logits = runner.step([runner.new_table()], [[3, 4, 5, 6, 7]], [0])
    assert logits.shape == (5, 211) and torch.isfinite(logits).all() and logits.std() > 0


def test_a_bad_expert_shard_names_what_is_valid():
    layer = FusedMoE(3, 8, 6, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match=r"expert in \[0, 3\)"):
        layer.weight_loader(layer.w13_weight, torch.zeros(6, 8), (3, "w1"))
    with pytest.raises(ValueError, match=r"shape mismatch for expert 1 w3.*\(6, 8\)"):
        layer.weight_loader(layer.w13_weight, torch.zeros(8, 6), (1, "w3"))
    with pytest.raises(ValueError, match="does not belong in w13_weight"):
        layer.weight_loader(layer.w13_weight, torch.zeros(8, 6), (1, "w2"))
    with pytest.raises(ValueError, match="intermediate size 6 does not divide over tensor_parallel_size 4"):
        FusedMoE(3, 8, 6, dtype=torch.float32, device="cpu", group=type("G", (), {"rank": 0, "size": 4})())
    with pytest.raises(ValueError, match=r"num_experts_per_tok must be in \[1, 3\]"):
        SparseMoeBlock(3, 4, 8, 6, True, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="n_group 4 must be >= 1 and divide the 6 experts"):
        SparseMoeBlock(6, 2, 8, 6, True, dtype=torch.float32, device="cpu", grouped=GroupedTopK(4, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_on_the_gpu_the_fused_kernel_serves_the_family(family, hf_checkpoint):
    """On CUDA (kernels="auto": the Triton fused MoE and model kernels), float32: the ragged
    logits stay close to Hugging Face's on the GPU and greedy decoding equals its generate."""
    hf, folder = hf_checkpoint(family)
    model = load_model(folder, device="cuda")
    experts = next(m for m in model.modules() if isinstance(m, FusedMoE))
    assert experts.impl.__module__ == "toolkit.kernels.fused_moe"
    hf = hf.to("cuda")
    try:
        toks = [5, 17, 99, 3, 42, 8, 150, 7, 7, 200, 60]
        runner = PagedRunner(model, block_size=4)
        got = runner.step([runner.new_table()], [toks], [0])
        with torch.no_grad():
            want = hf(torch.tensor([toks], device="cuda")).logits[0].float()
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
        prompt = toks[:7]
        ids = torch.tensor([prompt], device="cuda")
        want_ids = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert greedy(model, [prompt], max_new_tokens=8)[0] == want_ids
    finally:
        hf.to("cpu")


def test_dots1_routes_in_float32_in_a_bf16_model(hf_checkpoint):
    """dots.llm1's router (sigmoid scores + correction bias, grouped top-k) keeps its gate in
    float32 as transformers does: on bf16 hidden states our experts and weights are HF's."""
    hf, folder = hf_checkpoint("dots1")
    model = load_model(folder, dtype=torch.bfloat16)
    layer = SPARSE["dots1"][0]
    ours = model.model.layers[layer].mlp
    assert isinstance(ours, SparseMoeBlock) and ours.gate.weight.dtype == torch.float32
    theirs = hf.model.layers[layer].mlp.gate
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(64, hf.config.hidden_size, generator=g) * 4).to(torch.bfloat16)
    w, ids = ours.route(ours.gate(x.to(ours.gate_dtype)))
    _, tw, tids = theirs(x)
    order, torder = ids.sort(-1), tids.sort(-1)
    assert torch.equal(order.values, torder.values)
    torch.testing.assert_close(w.gather(1, order.indices), tw.gather(1, torder.indices), rtol=1e-5, atol=1e-6)

"""On a GPU in bf16 at real shapes: a Llama-3-8B-shaped model (2 layers, random weights),
saved by transformers and loaded by our loader, gives logits close to HF's on a ragged
batch through the paged cache, with the Triton model kernels and either attention backend."""

from __future__ import annotations

import pytest
import torch
from conftest import LLAMA3_ROPE
from paged import PagedRunner

from toolkit import registry
from toolkit.models import load_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def llama3_8b_shaped(tmp_path_factory):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                      num_hidden_layers=2, vocab_size=128256, max_position_embeddings=8192, rms_norm_eps=1e-5,
                      rope_parameters={**LLAMA3_ROPE, "original_max_position_embeddings": 8192},
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    with torch.no_grad():   # norms off 1 so a misplaced norm shows
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    folder = tmp_path_factory.mktemp("llama3_8b_shaped")
    hf.save_pretrained(folder)
    return hf, folder


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_bf16_logits_close_to_hf(llama3_8b_shaped, backend):
    hf, folder = llama3_8b_shaped
    model = load_model(folder, dtype=torch.bfloat16, device="cuda")
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.bfloat16
    runner = PagedRunner(model, block_size=16, num_blocks=512, backend=registry.lookup("attention", backend))
    g = torch.Generator().manual_seed(0)
    lens = [1000, 37, 1, 300]
    seqs = [torch.randint(0, 128256, (n,), generator=g).tolist() for n in lens]
    # step 1: prefill all but the last token of each sequence (the 1-token one whole); step 2: the rest
    first = [s[:-1] or s for s in seqs]
    runner_tables = [runner.new_table() for _ in seqs]
    a = runner.step(runner_tables, first, [0] * len(seqs))
    rest = [(i, s[-1:]) for i, s in enumerate(seqs) if len(s) > 1]
    b = runner.step([runner_tables[i] for i, _ in rest], [t for _, t in rest], [len(seqs[i]) - 1 for i, _ in rest])
    got = list(a.split([len(f) for f in first]))
    for j, (i, _) in enumerate(rest):
        got[i] = torch.cat([got[i], b[j:j + 1]])
    for s, mine in zip(seqs, got):
        with torch.no_grad():
            want = hf(torch.tensor([s], device="cuda")).logits[0].float()    # [S, V]
        assert torch.isfinite(mine).all()
        rel = (mine - want).norm() / want.norm()
        agree = (mine.argmax(-1) == want.argmax(-1)).float().mean()
        assert rel < 0.03, f"relative error {rel:.4f} over {len(s)} tokens"
        assert agree > 0.9, f"top-1 agreement {agree:.3f} over {len(s)} tokens"

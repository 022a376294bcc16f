"""On a GPU in bf16 at real shapes: a Llama-3-8B-shaped model (2 layers, random weights),
saved by transformers and loaded by our loader, gives logits close to HF's on a ragged
batch through the paged cache, with the Triton model kernels and either attention backend."""

from __future__ import annotations

import copy

import pytest
import torch
from model_configs import LLAMA3_ROPE
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


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def hf_logits(llama3_8b_shaped):
    """Per sequence: HF's bf16 logits and the fp32 truth (the same weights upcast)."""
    hf, _ = llama3_8b_shaped
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 128256, (n,), generator=g).tolist() for n in (1000, 37, 1, 300)]
    with torch.no_grad():
        bf16 = [hf(torch.tensor([s], device="cuda")).logits[0].float() for s in seqs]
        hf32 = copy.deepcopy(hf).float()
        fp32 = [hf32(torch.tensor([s], device="cuda")).logits[0] for s in seqs]
    del hf32
    torch.cuda.empty_cache()
    return seqs, bf16, fp32


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_bf16_logits_close_to_hf(llama3_8b_shaped, hf_logits, backend):
    _, folder = llama3_8b_shaped
    seqs, hf_bf16, truth = hf_logits
    model = load_model(folder, dtype=torch.bfloat16, device="cuda")
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.bfloat16
    attention = registry.lookup("attention", backend)
    runner = PagedRunner(model, block_size=16, num_blocks=512, backend=attention)
    # step 1: all but the last token of each sequence (the 1-token one whole); step 2: the rest
    tables = [runner.new_table() for _ in seqs]
    first = [s[:-1] or s for s in seqs]
    a = runner.step(tables, first, [0] * len(seqs))
    rest = [i for i, s in enumerate(seqs) if len(s) > 1]
    b = runner.step([tables[i] for i in rest], [seqs[i][-1:] for i in rest],
                    [len(seqs[i]) - 1 for i in rest])
    got = list(a.split([len(f) for f in first]))
    for j, i in enumerate(rest):
        got[i] = torch.cat([got[i], b[j:j + 1]])
    for s, mine, theirs, want in zip(seqs, got, hf_bf16, truth):
        assert mine.shape == want.shape and torch.isfinite(mine).all()
        # close to HF's bf16, and no further from the fp32 truth than HF's own bf16 run is
        assert _rel(mine, theirs) < 0.03, f"{len(s)} tokens: {_rel(mine, theirs):.4f} from HF bf16"
        ours_err, hf_err = _rel(mine, want), _rel(theirs, want)
        assert ours_err < 1.5 * hf_err + 2e-3, f"{len(s)} tokens: error {ours_err:.4f} vs HF's {hf_err:.4f}"
        ours_top1 = (mine.argmax(-1) == want.argmax(-1)).float().mean()
        hf_top1 = (theirs.argmax(-1) == want.argmax(-1)).float().mean()
        assert ours_top1 >= hf_top1 - 0.1, f"{len(s)} tokens: top-1 {ours_top1:.3f} vs HF's {hf_top1:.3f}"

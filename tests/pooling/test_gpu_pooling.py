"""On a GPU in bf16: a BERT-base-shaped encoder (random weights, 2 layers) through the Triton
backend `attention="auto"` picks (bidirectional) and the SDPA backend, and decoder embeddings (Triton
attention, CUDA graphs, beside generation) against transformers' hidden states."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from toolkit import LLM, SamplingParams
from toolkit.pooling import PoolingParams

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("attention,backend", [("auto", "TritonPagedAttention"), ("cpu", "CPUAttention")])
def test_bert_base_shaped_encoder_on_cuda(tmp_path, attention, backend):
    import transformers as tf

    torch.manual_seed(0)
    hf = tf.BertModel(tf.BertConfig(num_hidden_layers=2), add_pooling_layer=False).to("cuda", torch.bfloat16).eval()
    hf.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), device="cuda", dtype="bfloat16", max_num_batched_tokens=4096, attention=attention)
    assert type(llm.engine.runner.attention).__name__ == backend
    g = torch.Generator().manual_seed(1)
    prompts = [[101] + torch.randint(1000, 30000, (n,), generator=g).tolist() + [102] for n in (5, 77, 300, 1)]
    outs = llm.embed(prompts * 16)                                         # batch 64
    for o, p in zip(outs, prompts * 16):
        with torch.no_grad():
            want = hf(torch.tensor([p], device="cuda")).last_hidden_state[0, 0].float()
        cos = F.cosine_similarity(torch.tensor(o.outputs.embedding, device="cuda"), want, dim=0)
        assert cos > 0.99


def test_decoder_embeddings_beside_generation_on_cuda(tmp_path):
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                      intermediate_size=3072, num_hidden_layers=2, vocab_size=32000, tie_word_embeddings=True)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to("cuda").eval()
    hf.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), device="cuda", dtype="bfloat16", max_num_batched_tokens=256)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 32000, (n,), generator=g).tolist() for n in (7, 300, 64, 1000)]
    e = llm.engine
    for i, p in enumerate(prompts):
        e.add_request(p, SamplingParams(max_tokens=8, temperature=0), request_id=f"g{i}")
        e.add_request(p, PoolingParams(normalize=False), request_id=f"e{i}")
    done = {}
    while e.has_unfinished():
        done.update({o.request_id: o for o in e.step() if o.finished})
    for i, p in enumerate(prompts):
        with torch.no_grad():
            want = hf.model(torch.tensor([p], device="cuda")).last_hidden_state[0, -1].float()
        assert F.cosine_similarity(done[f"e{i}"].outputs.data.cuda(), want, dim=0) > 0.99
        assert len(done[f"g{i}"].token_ids) == 8

"""A BERT encoder through the engine on the Triton paged backend (bidirectional, under
TRITON_INTERPRET=1 on the CPU) against transformers' hidden states."""

from __future__ import annotations

import torch

from toolkit import LLM

CLS, SEP = 1, 2


def test_bert_on_triton_attention_matches_transformers(checkpoint):
    hf, folder = checkpoint("bert")
    llm = LLM(str(folder), attention="triton", block_size=4, num_blocks=64,
              pooler_config={"pooling_type": "MEAN", "normalize": False})
    assert type(llm.engine.runner.attention).__name__ == "TritonPagedAttention"
    texts = [[CLS, 5, 9, 33, 7, 100, 3, 4, 5, 6, SEP], [CLS, 3, SEP], [CLS] + [7] * 20 + [SEP]]
    for out, ids in zip(llm.embed(texts), texts):
        with torch.no_grad():
            want = hf(torch.tensor([ids])).last_hidden_state[0].mean(0)
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), want, rtol=1e-4, atol=1e-4)
    assert llm.engine.allocator.num_free_blocks() == llm.engine.allocator.num_blocks

"""BERT-family encoders (`BertModel`, `BertForSequenceClassification`): absolute position
and token-type embeddings, post-LayerNorm layers, GELU, bidirectional attention.

An encoder has no LM head: it serves pooling only (`spec.supports_generation = False`). Its
layers declare `LayerAttention(causal=False)`, so the engine builds bidirectional attention
backends and runs each prompt in one step (a token sees every token of its sequence). K/V
still go through the paged cache, like every model's: the same backends, one code path.

Token types: 0 for a single text; for a text pair ([CLS] a [SEP] b [SEP], the cross-encoder's
input) the tokens after the first [SEP] get type 1, as the tokenizer's token_type_ids.
Checkpoint names: Hugging Face's, with or without the `bert.` prefix (a sentence-transformers
folder has none); the MLM head (`cls.*`) and position_ids buffers are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.models.base import LayerAttention
from toolkit.models.causal_lm import CausalLM
from toolkit.models.layers import (
    LayerNorm,
    RowParallelLinear,
    VocabParallelEmbedding,
    column,
    qkv,
    replicated,
)
from toolkit.models.layers.parallel import head_slice
from toolkit.pooling.config import PoolerConfig

SKIPPED = ("embeddings.position_ids", "cls.")


def _gelu(name: str):
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return lambda x: F.gelu(x, approximate="tanh")
    raise ValueError(f"hidden_act {name!r} is not supported by the BERT encoder; supported: gelu, "
                     "gelu_new, gelu_pytorch_tanh")


class BertLayer(nn.Module):
    def __init__(self, m: BertModel, i: int) -> None:
        super().__init__()
        c, name = m.config, f"encoder.layer.{i}"
        h, d = c.num_attention_heads, c.hidden_size // c.num_attention_heads
        norm, g = dict(dtype=m.dtype, device=m.device), m.group
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        self.attention.self.qkv = qkv(c.hidden_size, d, h, h, True, **m.linear(f"{name}.attention.self.qkv"))
        # this rank's heads (all of them at TP=1)
        self.index, self.num_heads, self.head_dim = i, self.attention.self.qkv.parts["q"][1].size // d, d
        self.attention.output = nn.Module()
        self.attention.output.dense = RowParallelLinear(h * d, c.hidden_size, True,
                                                        **m.linear(f"{name}.attention.output.dense"),
                                                        cols=head_slice(h, d, g.rank, g.size))
        self.attention.output.LayerNorm = LayerNorm(c.hidden_size, c.layer_norm_eps, **norm)
        self.intermediate = nn.Module()
        self.intermediate.dense = column(c.hidden_size, c.intermediate_size, True,
                                         **m.linear(f"{name}.intermediate.dense"))
        self.output = nn.Module()
        self.output.dense = RowParallelLinear(c.intermediate_size, c.hidden_size, True,
                                              **m.linear(f"{name}.output.dense"))
        self.output.LayerNorm = LayerNorm(c.hidden_size, c.layer_norm_eps, **norm)
        self.act = _gelu(getattr(c, "hidden_act", "gelu"))

    def forward(self, x: torch.Tensor, backend: Any) -> torch.Tensor:
        t, h, d = x.shape[0], self.num_heads, self.head_dim
        proj = self.attention.self.qkv
        q, k, v = proj.split(proj(x))                                    # [T, H*D] x 3
        backend.write_kv(self.index, k.reshape(t, h, d), v.reshape(t, h, d))
        a = backend.run(self.index, q.reshape(t, h, d)).reshape(t, h * d)
        x = self.attention.output.LayerNorm(self.attention.output.dense(a), x)[0]   # post-LN
        y = self.output.dense(self.act(self.intermediate.dense(x)))
        return self.output.LayerNorm(y, x)[0]


class BertModel(CausalLM):
    """The encoder; its hidden states [T, hidden] go to the pooler (CLS by default, or what a
    sentence-transformers folder declares)."""

    stacked = {"query": ("qkv", "q"), "key": ("qkv", "k"), "value": ("qkv", "v")}
    default_pooler_config = PoolerConfig(pooling_type="CLS", normalize=True)

    def __init__(self, config: Any, **kw: Any) -> None:
        super().__init__(config, **kw)
        c = config
        if getattr(c, "position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"position_embedding_type {c.position_embedding_type!r} is not supported; "
                             "supported: 'absolute'")
        layout = self.layout()
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = VocabParallelEmbedding(c.vocab_size, c.hidden_size, **layout)
        self.embeddings.position_embeddings = VocabParallelEmbedding(c.max_position_embeddings, c.hidden_size,
                                                                     **layout)
        self.embeddings.token_type_embeddings = VocabParallelEmbedding(c.type_vocab_size, c.hidden_size, **layout)
        self.embeddings.LayerNorm = LayerNorm(c.hidden_size, c.layer_norm_eps, dtype=self.dtype, device=self.device)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(BertLayer(self, i) for i in range(c.num_hidden_layers))
        self.lm_head = None
        # the pair separator of token types; build_engine sets it from the tokenizer when the config lacks it
        self.sep_token_id = getattr(c, "sep_token_id", None)
        d, h = c.hidden_size // c.num_attention_heads, self.encoder.layer[0].num_heads   # this rank's heads
        self.finish(num_heads=h, num_kv_heads=h, head_dim=d,
                    hidden=c.hidden_size, vocab_size=c.vocab_size,
                    layers=[LayerAttention(causal=False)] * c.num_hidden_layers,
                    supports_generation=False)

    def token_types(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """int64 [T]: 1 after the first [SEP] of each sequence (a text pair's second text), else 0.
        Sequences start at position 0: a bidirectional prompt runs whole in one step."""
        if self.sep_token_id is None or self.config.type_vocab_size < 2:
            return torch.zeros_like(input_ids)
        sep = (input_ids == self.sep_token_id).long()                     # [T]
        seps = torch.cumsum(sep, 0) - sep                                 # SEPs strictly before, in the batch
        # [T] the row of each token's sequence start (no host sync: a CUDA graph captures it)
        start = torch.arange(input_ids.shape[0], device=input_ids.device) - positions
        return ((seps - seps[start]) > 0).long()

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Any) -> torch.Tensor:
        """input_ids, positions int64 [T] (whole prompts, back to back) -> hidden [T, hidden]."""
        e = self.embeddings
        x = (e.word_embeddings(input_ids) + e.position_embeddings(positions)
             + e.token_type_embeddings(self.token_types(input_ids, positions)))
        x = e.LayerNorm(x)[0]                                             # [T, hidden]
        for layer in self.encoder.layer:
            x = layer(x, attention)
        return x

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embeddings.word_embeddings(input_ids)

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
        raise ValueError(f"{self.spec.architecture} is an encoder without an LM head: it has no "
                         "token logits (use it for pooling)")

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[tuple[str, int]]:
        return super().load_weights(self._own(weights))

    def _own(self, weights: Iterable[tuple[str, Any]]) -> Iterable[tuple[str, Any]]:
        """Checkpoint names without the `bert.` prefix; the tensors this model does not hold skipped."""
        for name, t in weights:
            name = name.removeprefix("bert.")
            if name.startswith(SKIPPED) or (name.startswith("pooler.") and not self.keeps_pooler):
                continue
            yield name, t

    keeps_pooler = False


class BertForSequenceClassification(BertModel):
    """A cross-encoder / classifier: classify(CLS hidden) = classifier(tanh(pooler(CLS))),
    Hugging Face's head; the score of a one-label model is its sigmoid."""

    keeps_pooler = True

    def __init__(self, config: Any, **kw: Any) -> None:
        super().__init__(config, **kw)
        c, opts = config, dict(dtype=self.dtype, device=self.device)
        self.pooler = nn.Module()
        self.pooler.dense = replicated(c.hidden_size, c.hidden_size, True, **opts)
        self.classifier = replicated(c.hidden_size, c.num_labels, True, **opts)

    @torch.no_grad()
    def classify(self, hidden: torch.Tensor) -> torch.Tensor:
        """pooled (CLS) hidden [N, hidden] -> logits [N, num_labels]."""
        return self.classifier(torch.tanh(self.pooler.dense(hidden))).float()

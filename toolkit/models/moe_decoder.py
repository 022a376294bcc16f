"""What the mixture-of-experts families share: a decoder whose layers are (attention, MLP)
with an MLP that is a `SparseMoeBlock` or dense, and checkpoint names of one tensor per expert.

A family file subclasses `MoeCausalLM` and supplies its attention and its MLP per layer
(`attention(layer, kind, rotary)`, `mlp(layer)`); the residual stream, the norms, the head,
the spec and the expert names are here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from toolkit.models.base import LayerAttention, layer_kinds
from toolkit.models.causal_lm import CausalLM
from toolkit.models.layers import RMSNorm, RotaryEmbedding
from toolkit.models.layers.moe import GroupedTopK, SparseMoeBlock, expert_shard
from toolkit.models.llama import STACKED, DecoderLayer, head_dim_of


class MoeCausalLM(CausalLM):
    """A decoder of (attention, MoE-or-dense MLP) layers; subclasses give the two parts."""
    stacked = STACKED
    mlp_name = "mlp"

    def __init__(self, config: Any, **kw: Any) -> None:
        self.moe_kernels = kw.get("kernels", "auto")     # the experts' arithmetic follows the model's
        super().__init__(config, **kw)
        c, d, n = config, head_dim_of(config), config.num_hidden_layers
        rotary = RotaryEmbedding(c, d, self.max_model_len, self.device, self.ops)
        window = getattr(c, "sliding_window", None)
        kinds = [LayerAttention("sliding", window) if k == "sliding" else LayerAttention()
                 for k in layer_kinds(c, n)]
        self.model = nn.Module()
        self.make_head(c.vocab_size, c.hidden_size, bool(getattr(c, "tie_word_embeddings", False)))
        self.model.layers = nn.ModuleList(
            DecoderLayer(self, self.attention(i, kinds[i], rotary), self.mlp(i), self.mlp_name) for i in range(n))
        self.model.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, ops=self.ops, dtype=self.dtype, device=self.device)
        a = self.model.layers[0].self_attn.attn
        self.finish(num_heads=a.num_heads, num_kv_heads=a.num_kv_heads, head_dim=d, hidden=c.hidden_size,
                    vocab_size=c.vocab_size, layers=kinds)

    def attention(self, layer: int, kind: LayerAttention, rotary: RotaryEmbedding) -> nn.Module:
        raise NotImplementedError

    def mlp(self, layer: int) -> nn.Module:
        raise NotImplementedError

    def sparse_block(self, num_experts: int, top_k: int, intermediate: int, renormalize: bool,
                     grouped: GroupedTopK | None = None, shared_experts: nn.Module | None = None) -> SparseMoeBlock:
        act = getattr(self.config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"the experts' activation {act!r} is not supported; supported: 'silu'")
        return SparseMoeBlock(num_experts, top_k, self.config.hidden_size, intermediate, renormalize,
                              **self.layout(), kernels=self.moe_kernels, grouped=grouped,
                              shared_experts=shared_experts)

    def map_name(self, name: str) -> tuple[str, Any]:
        """One expert's projection -> (the layer's stacked parameter, (expert, "w1"|"w3"|"w2"));
        the rest as the dense families map them."""
        return expert_shard(name) or super().map_name(name)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Any) -> torch.Tensor:
        """input_ids, positions int64 [T] -> hidden [T, hidden] (a flattened ragged batch)."""
        x, residual = self.embed(input_ids), None                  # [T, hidden]
        for layer in self.model.layers:
            x, residual = layer(positions, x, residual, attention)
        return self.model.norm(x, residual)[0]

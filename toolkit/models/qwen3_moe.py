"""Qwen3-MoE: Qwen3's attention (per-head q/k RMSNorm), sparse MLP blocks of `num_experts`
experts of `moe_intermediate_size` on every `decoder_sparse_step`-th layer not in
`mlp_only_layers` (the others dense, of `intermediate_size`), top-k renormalised when
`norm_topk_prob`."""

from __future__ import annotations

from torch import nn

from toolkit.models.base import LayerAttention
from toolkit.models.layers import RotaryEmbedding
from toolkit.models.llama import GatedMLP, LlamaAttention
from toolkit.models.moe_decoder import MoeCausalLM


class Qwen3MoeForCausalLM(MoeCausalLM):
    def attention(self, layer: int, kind: LayerAttention, rotary: RotaryEmbedding) -> nn.Module:
        bias = bool(getattr(self.config, "attention_bias", False))
        return LlamaAttention(self, layer, kind, rotary, qkv_bias=bias, o_bias=bias, qk_norm=True)

    def mlp(self, layer: int) -> nn.Module:
        c = self.config
        sparse = (layer not in (c.mlp_only_layers or []) and c.num_experts > 0
                  and (layer + 1) % c.decoder_sparse_step == 0)
        if not sparse:
            return GatedMLP(self, c.hidden_size, c.intermediate_size, False, c.hidden_act,
                            f"model.layers.{layer}.mlp")
        return self.sparse_block(c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size,
                                 renormalize=bool(c.norm_topk_prob))

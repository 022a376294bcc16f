"""Mixtral: Mistral's attention, every layer's MLP a sparse block of `num_local_experts`
experts (checkpoint names `block_sparse_moe.experts.{e}.w1|w2|w3`), top-k weights renormalised."""

from __future__ import annotations

from torch import nn

from toolkit.models.base import LayerAttention
from toolkit.models.layers import RotaryEmbedding
from toolkit.models.llama import LlamaAttention
from toolkit.models.moe_decoder import MoeCausalLM


class MixtralForCausalLM(MoeCausalLM):
    mlp_name = "block_sparse_moe"

    def attention(self, layer: int, kind: LayerAttention, rotary: RotaryEmbedding) -> nn.Module:
        return LlamaAttention(self, layer, kind, rotary, qkv_bias=False, o_bias=False, qk_norm=False)

    def mlp(self, layer: int) -> nn.Module:
        c = self.config
        return self.sparse_block(c.num_local_experts, c.num_experts_per_tok, c.intermediate_size, renormalize=True)

"""dots.llm1 (rednote-hilab; Hugging Face's `Dots1ForCausalLM`): Qwen3's attention (per-head
q/k RMSNorm), the first `first_k_dense_replace` layers dense, the rest a sparse block of
`n_routed_experts` experts routed by grouped top-k (sigmoid scores, a selection-only
`e_score_correction_bias`, `n_group` / `topk_group`, `routed_scaling_factor`, renormalised when
`norm_topk_prob`) plus `n_shared_experts` shared experts every token runs (one dense MLP of
n_shared x `moe_intermediate_size`, checkpoint names `mlp.shared_experts.*`)."""

from __future__ import annotations

from torch import nn

from toolkit.models.base import LayerAttention
from toolkit.models.layers import RotaryEmbedding
from toolkit.models.layers.moe import GroupedTopK
from toolkit.models.llama import GatedMLP, LlamaAttention
from toolkit.models.moe_decoder import MoeCausalLM


class Dots1ForCausalLM(MoeCausalLM):
    def attention(self, layer: int, kind: LayerAttention, rotary: RotaryEmbedding) -> nn.Module:
        bias = bool(getattr(self.config, "attention_bias", False))
        return LlamaAttention(self, layer, kind, rotary, qkv_bias=bias, o_bias=bias, qk_norm=True)

    def mlp(self, layer: int) -> nn.Module:
        c = self.config
        if layer < (c.first_k_dense_replace or 0):
            return GatedMLP(self, c.hidden_size, c.intermediate_size, False, c.hidden_act, f"model.layers.{layer}.mlp")
        shared = None
        if c.n_shared_experts:
            shared = GatedMLP(self, c.hidden_size, c.moe_intermediate_size * c.n_shared_experts, False,
                              c.hidden_act, f"model.layers.{layer}.mlp.shared_experts", reduce_results=False)
        grouped = GroupedTopK(c.n_group, c.topk_group, "sigmoid", correction_bias=True,
                              routed_scaling_factor=float(c.routed_scaling_factor))
        return self.sparse_block(c.n_routed_experts, c.num_experts_per_tok, c.moe_intermediate_size,
                                 renormalize=bool(c.norm_topk_prob), grouped=grouped, shared_experts=shared)

"""OLMoE: every layer's MLP a sparse block (top-k renormalised when `norm_topk_prob`); its
attention normalises q and k over the whole projection width (one RMSNorm over all heads,
not per head as Qwen3), optionally clips q/k/v to +-`clip_qkv`, then applies rotary.

Under tensor parallelism a rank holds only its heads' columns of q and k, so the norm's mean
square is all-reduced over the group (the weight is sliced like the heads)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from toolkit.models.base import LayerAttention
from toolkit.models.layers import Attention, RotaryEmbedding, RowParallelLinear, qkv
from toolkit.models.layers.linear import mark, vector
from toolkit.models.layers.parallel import Slice, head_slice, shape_of, take
from toolkit.models.llama import head_dim_of, kv_heads_of
from toolkit.models.moe_decoder import MoeCausalLM


class WidthRMSNorm(nn.Module):
    """RMSNorm over a full projection width `full`, of which this rank holds the features `part`:
    x [T, part.size] -> x / rms(all features) * w[part]."""

    def __init__(self, full: int, part: Slice, eps: float, group: Any, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        self.full, self.part, self.eps, self.group = full, part, eps, group
        self.weight = mark(vector(part.size, dtype, device), self.weight_loader, [(None, (full,))], "ones")

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        if shape_of(loaded) != (self.full,):
            raise ValueError(f"shape mismatch for a q/k norm: checkpoint has {shape_of(loaded)}, the "
                             f"model expects {(self.full,)}")
        param.data.copy_(take(loaded, 0, self.part))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        ss = self.group.all_reduce(xf.pow(2).sum(-1, keepdim=True))             # [T, 1] over all ranks
        return (self.weight.float() * (xf * torch.rsqrt(ss / self.full + self.eps))).to(x.dtype)


class OlmoeAttention(nn.Module):
    def __init__(self, m: MoeCausalLM, layer: int, kind: LayerAttention, rotary: RotaryEmbedding) -> None:
        super().__init__()
        c, g, name = m.config, m.group, f"model.layers.{layer}.self_attn"
        h, h_kv, d = c.num_attention_heads, kv_heads_of(c), head_dim_of(c)
        bias = bool(getattr(c, "attention_bias", False))
        self.qkv_proj = qkv(c.hidden_size, d, h, h_kv, bias, **m.linear(f"{name}.qkv_proj"))
        self.o_proj = RowParallelLinear(h * d, c.hidden_size, bias, **m.linear(f"{name}.o_proj"),
                                        cols=head_slice(h, d, g.rank, g.size))
        if h_kv < g.size:
            raise ValueError(f"OLMoE's k norm spans all KV heads: {h_kv} KV heads cannot be split over "
                             f"tensor_parallel_size {g.size}; valid sizes divide {h_kv}")
        norm = {"eps": c.rms_norm_eps, "group": g, "dtype": m.dtype, "device": m.device}
        self.q_norm = WidthRMSNorm(h * d, self.qkv_proj.parts["q"][1], **norm)
        self.k_norm = WidthRMSNorm(h_kv * d, self.qkv_proj.parts["k"][1], **norm)
        self.clip = getattr(c, "clip_qkv", None)
        self.attn = Attention(layer, self.qkv_proj.parts["q"][1].size // d,
                              self.qkv_proj.parts["k"][1].size // d, d, kind, rotary)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, backend: Any) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))          # [T, H*D], [T, Hkv*D] x 2
        q, k = self.q_norm(q), self.k_norm(k)
        if self.clip is not None:
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        return self.o_proj(self.attn(positions, q, k, v, backend))


class OlmoeForCausalLM(MoeCausalLM):
    def attention(self, layer: int, kind: LayerAttention, rotary: RotaryEmbedding) -> nn.Module:
        return OlmoeAttention(self, layer, kind, rotary)

    def mlp(self, layer: int) -> nn.Module:
        c = self.config
        return self.sparse_block(c.num_experts, c.num_experts_per_tok, c.intermediate_size,
                                 renormalize=bool(c.norm_topk_prob))

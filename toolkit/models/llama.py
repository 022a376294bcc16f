"""The Llama-family decoder: Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3.

The families differ only in flags read from the Hugging Face config (`FAMILY_FLAGS`): QKV
bias (Qwen2), per-head q/k RMSNorm (Qwen3), attention/MLP bias (Llama's `attention_bias` /
`mlp_bias`), tied embeddings, GQA, sliding-window layers (Mistral, Qwen2's `layer_types`).
q/k/v and gate/up are merged into one matmul each (`stacked`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from toolkit.models.base import LayerAttention, layer_kinds
from toolkit.models.causal_lm import CausalLM
from toolkit.models.layers import Attention, RMSNorm, RotaryEmbedding, RowParallelLinear, merged_column, qkv
from toolkit.models.layers.activation import glu
from toolkit.models.layers.parallel import head_slice

# model_type -> flags that differ from Llama's reading of the config
FAMILY_FLAGS: dict[str, dict[str, bool]] = {
    "llama": {},
    "mistral": {},
    "qwen2": {"qkv_bias": True, "o_bias": False},
    "qwen3": {"qk_norm": True},
    "phi3": {},
}

STACKED = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
           "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def head_dim_of(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def kv_heads_of(config: Any) -> int:
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


class LlamaAttention(nn.Module):
    def __init__(self, m: CausalLM, layer: int, kind: LayerAttention, rotary: RotaryEmbedding,
                 qkv_bias: bool, o_bias: bool, qk_norm: bool | type = False) -> None:
        """qk_norm: an RMSNorm over each head of q and k before rotary (True: RMSNorm; or the
        norm class, e.g. GemmaRMSNorm)."""
        super().__init__()
        c, g, name = m.config, m.group, f"model.layers.{layer}.self_attn"
        h, h_kv, d = c.num_attention_heads, kv_heads_of(c), head_dim_of(c)
        self.qkv_proj = qkv(c.hidden_size, d, h, h_kv, qkv_bias, **m.linear(f"{name}.qkv_proj"))
        self.o_proj = RowParallelLinear(h * d, c.hidden_size, o_bias, **m.linear(f"{name}.o_proj"),
                                        cols=head_slice(h, d, g.rank, g.size))
        norm_cls = RMSNorm if qk_norm is True else qk_norm
        norm = dict(ops=m.ops, dtype=m.dtype, device=m.device)
        self.q_norm = norm_cls(d, c.rms_norm_eps, **norm) if norm_cls else None
        self.k_norm = norm_cls(d, c.rms_norm_eps, **norm) if norm_cls else None
        self.attn = Attention(layer, self.qkv_proj.parts["q"][1].size // d,
                              self.qkv_proj.parts["k"][1].size // d, d, kind, rotary)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, backend: Any) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))          # [T, H*D], [T, Hkv*D] x 2
        norm = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps) if self.q_norm is not None else None
        return self.o_proj(self.attn(positions, q, k, v, backend, norm))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), gate | up merged: [T, D] -> [T, 2I / N] -> [T, I / N] -> [T, D]
    (reduce_results=False: this rank's partial sum, not all-reduced)."""

    def __init__(self, m: CausalLM, hidden: int, intermediate: int, bias: bool, act: str,
                 prefix: str, reduce_results: bool = True) -> None:
        super().__init__()
        self.gate_up_proj = merged_column(hidden, [intermediate, intermediate], bias,
                                          **m.linear(f"{prefix}.gate_up_proj"))
        self.down_proj = RowParallelLinear(intermediate, hidden, bias, **m.linear(f"{prefix}.down_proj"),
                                           reduce_results=reduce_results)
        self.act = glu(act, m.ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: attention and an MLP, an RMSNorm before each, one residual
    stream (the norms fuse its add). mlp_name: Hugging Face's module name of the MLP (`mlp`,
    or Mixtral's `block_sparse_moe`)."""

    def __init__(self, m: CausalLM, attn: nn.Module, mlp: nn.Module, mlp_name: str = "mlp") -> None:
        super().__init__()
        c = m.config
        norm = dict(ops=m.ops, dtype=m.dtype, device=m.device)
        self.self_attn, self.mlp_name = attn, mlp_name
        setattr(self, mlp_name, mlp)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, **norm)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, **norm)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                backend: Any) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(positions, h, backend)
        h, residual = self.post_attention_layernorm(h, residual)
        return getattr(self, self.mlp_name)(h), residual


class LlamaForCausalLM(CausalLM):
    """A Llama-family causal LM attending through an AttentionBackend over a paged cache."""
    stacked = STACKED

    def __init__(self, config: Any, family: str | None = None, **kw: Any) -> None:
        super().__init__(config, **kw)
        model_type = family or getattr(config, "model_type", "llama")
        if model_type not in FAMILY_FLAGS:
            raise ValueError(f"model_type {model_type!r} is not a Llama-family model; supported: "
                             f"{sorted(FAMILY_FLAGS)}")
        bias = bool(getattr(config, "attention_bias", False))
        flags = {"qkv_bias": bias, "o_bias": bias, "qk_norm": False, **FAMILY_FLAGS[model_type]}
        c, d = config, head_dim_of(config)
        n = c.num_hidden_layers
        rotary = RotaryEmbedding(c, d, self.max_model_len, self.device, self.ops)
        window = getattr(c, "sliding_window", None)
        kinds = [LayerAttention("sliding", window) if k == "sliding" else LayerAttention()
                 for k in layer_kinds(c, n)]
        self.model = nn.Module()
        tied = bool(getattr(c, "tie_word_embeddings", False))
        self.make_head(c.vocab_size, c.hidden_size, tied)
        self.model.layers = nn.ModuleList(DecoderLayer(
            self, LlamaAttention(self, i, kinds[i], rotary, flags["qkv_bias"], flags["o_bias"], flags["qk_norm"]),
            GatedMLP(self, c.hidden_size, c.intermediate_size, bool(getattr(c, "mlp_bias", False)),
                     getattr(c, "hidden_act", "silu"), f"model.layers.{i}.mlp")) for i in range(n))
        self.model.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, ops=self.ops, dtype=self.dtype,
                                  device=self.device)
        a = self.model.layers[0].self_attn.attn
        self.finish(num_heads=a.num_heads, num_kv_heads=a.num_kv_heads, head_dim=d, hidden=c.hidden_size,
                    vocab_size=c.vocab_size, layers=kinds, supports_truncated_draft=True)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Any,
                layers: int | None = None) -> torch.Tensor:
        """input_ids, positions int64 [T] -> hidden [T, hidden]; the tokens are a flattened
        ragged batch `attention` was planned with. layers: run only the first N (a truncated
        draft model)."""
        x, residual = self.embed(input_ids), None                  # [T, hidden]
        for layer in self.model.layers[:layers]:
            x, residual = layer(positions, x, residual, attention)
        return self.model.norm(x, residual)[0]

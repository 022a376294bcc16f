"""Gemma 2 and Gemma 3 (text): interleaved sliding-window and global layers.

Both scale the embeddings by sqrt(hidden), normalise around each sublayer (input, post-
attention, pre- and post-feedforward RMSNorms, all Gemma's (1 + w)), use GeGLU (tanh) and
scale attention by query_pre_attn_scalar ** -0.5. Gemma 2 soft-caps the attention logits and
the final logits; Gemma 3 normalises q and k per head and rotates its local layers with
their own base frequency (rope_parameters per layer type).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from toolkit.models.base import LayerAttention, layer_kinds
from toolkit.models.causal_lm import CausalLM
from toolkit.models.layers import GemmaRMSNorm, RotaryEmbedding
from toolkit.models.llama import STACKED, GatedMLP, LlamaAttention, head_dim_of


class GemmaDecoderLayer(nn.Module):
    def __init__(self, m: CausalLM, layer: int, kind: LayerAttention, rotary: RotaryEmbedding,
                 qk_norm: bool) -> None:
        super().__init__()
        c = m.config
        norm = dict(ops=m.ops, dtype=m.dtype, device=m.device)
        bias = bool(getattr(c, "attention_bias", False))
        self.self_attn = LlamaAttention(m, layer, kind, rotary, bias, bias, GemmaRMSNorm if qk_norm else False)
        self.mlp = GatedMLP(m, c.hidden_size, c.intermediate_size, False,
                            getattr(c, "hidden_activation", None) or "gelu_pytorch_tanh",
                            f"model.layers.{layer}.mlp")
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, GemmaRMSNorm(c.hidden_size, c.rms_norm_eps, **norm))

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                backend: Any) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)              # residual: the stream so far
        h, _ = self.post_attention_layernorm(self.self_attn(positions, h, backend))
        h, residual = self.pre_feedforward_layernorm(h, residual)    # + attention's output
        h, _ = self.post_feedforward_layernorm(self.mlp(h))
        return h, residual


class _Gemma(CausalLM):
    stacked = STACKED
    qk_norm = False

    def __init__(self, config: Any, **kw: Any) -> None:
        super().__init__(config, **kw)
        c, d = config, head_dim_of(config)
        if getattr(c, "use_bidirectional_attention", False):
            raise ValueError("use_bidirectional_attention=True (an encoder) is not a causal LM")
        n = c.num_hidden_layers
        scale = float(getattr(c, "query_pre_attn_scalar", None) or d) ** -0.5
        cap = getattr(c, "attn_logit_softcapping", None)
        self.final_logit_softcap = getattr(c, "final_logit_softcapping", None)
        kinds = [LayerAttention("sliding", c.sliding_window, cap, scale) if k == "sliding"
                 else LayerAttention("full", None, cap, scale) for k in layer_kinds(c, n)]
        rotary = self.rotaries(c, d)
        self.model = nn.Module()
        self.make_head(c.vocab_size, c.hidden_size, bool(getattr(c, "tie_word_embeddings", True)))
        self.model.layers = nn.ModuleList(
            GemmaDecoderLayer(self, i, kinds[i], rotary[kinds[i].kind], self.qk_norm) for i in range(n))
        self.model.norm = GemmaRMSNorm(c.hidden_size, c.rms_norm_eps, ops=self.ops, dtype=self.dtype,
                                       device=self.device)
        a = self.model.layers[0].self_attn.attn
        self.finish(num_heads=a.num_heads, num_kv_heads=a.num_kv_heads, head_dim=d, hidden=c.hidden_size,
                    vocab_size=c.vocab_size, layers=kinds, supports_truncated_draft=True)

    def rotaries(self, c: Any, d: int) -> dict[str, RotaryEmbedding]:
        r = RotaryEmbedding(c, d, self.max_model_len, self.device, self.ops)
        return {"full": r, "sliding": r}

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Any,
                layers: int | None = None) -> torch.Tensor:
        x = self.embed(input_ids)                                      # [T, hidden]
        x = x * torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype)   # rounded as HF
        residual = None
        for layer in self.model.layers[:layers]:
            x, residual = layer(positions, x, residual, attention)
        return self.model.norm(x, residual)[0]


class Gemma2ForCausalLM(_Gemma):
    """Gemma 2: soft-capped attention (attn_logit_softcapping) and final logits."""


class Gemma3ForCausalLM(_Gemma):
    """Gemma 3 text: per-head q/k norms, local layers rotated at their own base frequency."""
    qk_norm = True

    def rotaries(self, c: Any, d: int) -> dict[str, RotaryEmbedding]:
        def rope(layer_type: str) -> RotaryEmbedding:
            return RotaryEmbedding(c, d, self.max_model_len, self.device, self.ops, layer_type=layer_type)
        return {"full": rope("full_attention"), "sliding": rope("sliding_attention")}

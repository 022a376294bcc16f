"""The Llama-family decoder: Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, on the toolkit's parts.

One implementation; the families differ only in flags read from the Hugging Face config
(`FAMILY_FLAGS`): QKV bias (Qwen2), per-head q/k RMSNorm (Qwen3), attention/MLP bias
(Llama's `attention_bias` / `mlp_bias`), tied embeddings, GQA, sliding window (Mistral).
q/k/v and gate/up are merged into one matmul each: the loader writes the checkpoint's
separate tensors into row ranges of the merged weight (`load_weights`).

K/V go through the attention backend into the paged cache: per layer, q, k, v are
computed, rotated, `attention.write_kv(layer, k, v)`, then `attention.run(layer, q)`. A
backend that declares `supports_fused_kv_write` hands out the layer's cache slots instead
(`kv_target`), and the rotary launch stores K/V there itself (one launch a layer fewer).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.attention.base import AttentionBackend
from toolkit.models.ops import ModelOps, model_ops
from toolkit.models.rope import cos_sin_cache, inv_frequencies

# model_type -> flags that differ from Llama's reading of the config
FAMILY_FLAGS: dict[str, dict[str, bool]] = {
    "llama": {},
    "mistral": {},
    "qwen2": {"qkv_bias": True, "o_bias": False},
    "qwen3": {"qk_norm": True},
}

# checkpoint (Hugging Face) submodule -> (merged submodule here, shard index)
STACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",  # buffers some old checkpoints saved
                    "self_attn.k_scale", "self_attn.v_scale", "self_attn.kv_scale")  # fp8 KV scales: engine/kv_scales.py


def _matrix(n_out: int, n_in: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    """An uninitialised weight [out, in]. On the CPU its storage is [in, out] (the parameter is
    the transposed view): F.linear's x @ W^T is then a plain gemm over a row-major [in, out]
    matrix, which MKL runs without re-packing W on every call (1.1-1.4x a decode step of the
    embedded model; the loader writes through the view, so checkpoints load unchanged)."""
    if device.type == "cpu":
        return nn.Parameter(torch.empty(n_in, n_out, dtype=dtype, device=device).t(), requires_grad=False)
    return nn.Parameter(torch.empty(n_out, n_in, dtype=dtype, device=device), requires_grad=False)


class Linear(nn.Module):
    """y = x W^T (+ b), weight [out, in]; storage allocated uninitialised on the target device."""

    def __init__(
        self, n_in: int, n_out: int, bias: bool, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        self.weight = _matrix(n_out, n_in, dtype, device)
        self.bias = (
            nn.Parameter(torch.empty(n_out, dtype=dtype, device=device), requires_grad=False)
            if bias
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        n_out, n_in = self.weight.shape
        return f"in={n_in}, out={n_out}, bias={self.bias is not None}"


def _norm_weight(n: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(n, dtype=dtype, device=device), requires_grad=False)


class Attention(nn.Module):
    def __init__(self, cfg: Geometry, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.g = cfg
        h, h_kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden, (h + 2 * h_kv) * d, cfg.qkv_bias, dtype, device)
        self.o_proj = Linear(h * d, cfg.hidden, cfg.o_bias, dtype, device)
        if cfg.qk_norm:
            self.q_norm = nn.Module()
            self.q_norm.weight = _norm_weight(d, dtype, device)
            self.k_norm = nn.Module()
            self.k_norm.weight = _norm_weight(d, dtype, device)

    def forward(
        self,
        layer: int,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: torch.Tensor,
        attention: AttentionBackend,
        ops: ModelOps,
    ) -> torch.Tensor:
        g, t = self.g, x.shape[0]
        h, h_kv, d = g.num_heads, g.num_kv_heads, g.head_dim
        # [T, H*D], [T, Hkv*D], [T, Hkv*D]: views of one merged matmul
        q, k, v = self.qkv_proj(x).split([h * d, h_kv * d, h_kv * d], dim=-1)
        q, k, v = q.view(t, h, d), k.view(t, h_kv, d), v.reshape(t, h_kv, d)
        # rotate out of place into contiguous q [T, H, D], k [T, Hkv, D]
        fresh = torch.contiguous_format
        out = (torch.empty_like(q, memory_format=fresh), torch.empty_like(k, memory_format=fresh))
        # the rotary launch also stores K/V where the backend hands out their slots (a declared
        # capability, docs/interfaces.md); otherwise the backend's write_kv does
        kv = attention.kv_target(layer, v) if getattr(attention, "supports_fused_kv_write", False) else None
        if g.qk_norm:  # Qwen3: RMSNorm over each head before rotary (one kernel on CUDA)
            q, k = ops.qk_norm_rotary(positions, q, k, cache, self.q_norm.weight, self.k_norm.weight,
                                      g.eps, out=out, kv=kv)
        else:
            q, k = ops.rotary(positions, q, k, cache, out=out, kv=kv)
        if kv is None:
            attention.write_kv(layer, k, v)
        else:
            attention.kv_written(layer, k, v)
        out = attention.run(layer, q)  # [T, H, D]
        return self.o_proj(out.reshape(t, h * d))


class MLP(nn.Module):
    def __init__(self, cfg: Geometry, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden, 2 * cfg.intermediate, cfg.mlp_bias, dtype, device)
        self.down_proj = Linear(cfg.intermediate, cfg.hidden, cfg.mlp_bias, dtype, device)

    def forward(self, x: torch.Tensor, ops: ModelOps) -> torch.Tensor:
        # [T, hidden] -> [T, 2I] -> [T, I] -> [T, hidden]
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Geometry, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, dtype, device)
        self.mlp = MLP(cfg, dtype, device)
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = _norm_weight(cfg.hidden, dtype, device)
        self.post_attention_layernorm = nn.Module()
        self.post_attention_layernorm.weight = _norm_weight(cfg.hidden, dtype, device)
        self.eps = cfg.eps


class Geometry:
    """The numbers and flags the layers need, read once from a Hugging Face config."""

    def __init__(self, config: Any) -> None:
        model_type = getattr(config, "model_type", "llama")
        if model_type not in FAMILY_FLAGS:
            raise ValueError(
                f"model_type {model_type!r} is not a Llama-family model; supported: "
                f"{sorted(FAMILY_FLAGS)}"
            )
        self.hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden // self.num_heads
        self.intermediate = config.intermediate_size
        self.num_layers = config.num_hidden_layers
        self.vocab_size = config.vocab_size
        self.eps = float(config.rms_norm_eps)
        attention_bias = bool(getattr(config, "attention_bias", False))
        flags = {
            "qkv_bias": attention_bias,
            "o_bias": attention_bias,
            "qk_norm": False,
            **FAMILY_FLAGS[model_type],
        }
        self.qkv_bias, self.o_bias, self.qk_norm = (
            flags["qkv_bias"],
            flags["o_bias"],
            flags["qk_norm"],
        )
        self.mlp_bias = bool(getattr(config, "mlp_bias", False))
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.sliding_window = _sliding_window(config)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act must be 'silu' for this decoder, got {act!r}")


def _sliding_window(config: Any) -> int | None:
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    kinds = set(getattr(config, "layer_types", None) or ["sliding_attention"])
    if kinds == {"full_attention"}:
        return None
    if kinds != {"sliding_attention"}:
        raise ValueError(
            f"layers mixing full and sliding-window attention are not supported "
            f"(layer_types {sorted(kinds)}); one window for all layers is"
        )
    return int(window)


class LlamaForCausalLM(nn.Module):
    """A Llama-family causal LM attending through an AttentionBackend over a paged cache."""

    def __init__(
        self,
        config: Any,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        eos_token_ids: list[int] | None = None,
    ) -> None:
        super().__init__()
        device = torch.device(device)
        self.config = config
        self.geometry = g = Geometry(config)
        self.dtype, self.device = dtype, device
        self.model = nn.Module()
        self.model.embed_tokens = nn.Module()
        self.model.embed_tokens.weight = _matrix(g.vocab_size, g.hidden, dtype, device)  # [V, hidden]
        self.model.layers = nn.ModuleList(
            DecoderLayer(g, dtype, device) for _ in range(g.num_layers)
        )
        self.model.norm = nn.Module()
        self.model.norm.weight = _norm_weight(g.hidden, dtype, device)
        if not g.tie_word_embeddings:
            self.lm_head = nn.Module()
            self.lm_head.weight = _matrix(g.vocab_size, g.hidden, dtype, device)
        self.max_model_len = int(getattr(config, "max_position_embeddings", 2048))
        # fp32 [max_model_len, D] cos | sin, not a parameter (never loaded, never saved)
        self.cos_sin_cache = cos_sin_cache(
            inv_frequencies(config, g.head_dim), self.max_model_len, device
        )
        self.eos_token_ids = list(eos_token_ids) if eos_token_ids is not None else _eos_ids(config)
        self._ops = model_ops(device)

    # ------------------------------------------------------------------ interface
    num_layers = property(lambda self: self.geometry.num_layers)
    num_heads = property(lambda self: self.geometry.num_heads)
    num_kv_heads = property(lambda self: self.geometry.num_kv_heads)
    head_dim = property(lambda self: self.geometry.head_dim)
    vocab_size = property(lambda self: self.geometry.vocab_size)
    hidden_size = property(lambda self: self.geometry.hidden)

    def extra_repr(self) -> str:
        g = self.geometry
        return (f"model_type={getattr(self.config, 'model_type', '?')}, layers={g.num_layers}, "
                f"hidden={g.hidden}, heads={g.num_heads}/{g.num_kv_heads} (q/kv) x {g.head_dim}, "
                f"vocab={g.vocab_size}, tied={g.tie_word_embeddings}, dtype={self.dtype}, "
                f"device={self.device}")

    def attention_kwargs(self) -> dict[str, Any]:
        g = self.geometry
        return dict(
            num_heads=g.num_heads,
            head_dim=g.head_dim,
            scale=g.head_dim**-0.5,
            sliding_window=g.sliding_window,
            soft_cap=None,
        )

    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend
    ) -> torch.Tensor:
        """input_ids, positions int64 [T] -> hidden [T, hidden].

        The tokens are a flattened ragged batch whose layout `attention` was planned with.
        """
        ops, g = self._ops, self.geometry
        x = self.embed(input_ids)  # [T, hidden]
        residual: torch.Tensor | None = None
        for i, layer in enumerate(self.model.layers):
            h, residual = ops.rms_norm(x, layer.input_layernorm.weight, g.eps, residual)
            h = layer.self_attn(i, h, positions, self.cos_sin_cache, attention, ops)
            h, residual = ops.rms_norm(h, layer.post_attention_layernorm.weight, g.eps, residual)
            x = layer.mlp(h, ops)
        out, _ = ops.rms_norm(x, self.model.norm.weight, g.eps, residual)
        return out

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids int64 [T] -> [T, hidden] (a tensor-parallel shard overrides it)."""
        return F.embedding(input_ids, self.model.embed_tokens.weight)

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [N, hidden] -> float32 logits [N, V] (written into `out` when given)."""
        head = self.model.embed_tokens if self.geometry.tie_word_embeddings else self.lm_head
        return self._ops.lm_head_logits(hidden, head.weight, out=out)

    # ------------------------------------------------------------------ loading
    def expected_weights(self) -> dict[str, int]:
        """Parameter name -> how many checkpoint tensors fill it (3 for qkv, 2 for gate_up)."""
        return {
            name: (3 if ".qkv_proj." in name else 2 if ".gate_up_proj." in name else 1)
            for name, _ in self.named_parameters()
        }

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[tuple[str, int]]:
        """Copy checkpoint tensors (Hugging Face names) into the parameters, converting the dtype.

        Returns the (parameter, shard) pairs written. Raises ValueError on an unknown tensor
        name or a shape mismatch (naming the tensor and both shapes).
        """
        params = dict(self.named_parameters())
        g = self.geometry
        q, kv = g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim
        offsets = {
            "qkv_proj": [(0, q), (q, kv), (q + kv, kv)],
            "gate_up_proj": [(0, g.intermediate), (g.intermediate, g.intermediate)],
        }
        loaded: set[tuple[str, int]] = set()
        for name, tensor in weights:
            if name.endswith(IGNORED_SUFFIXES) or (
                name == "lm_head.weight" and g.tie_word_embeddings
            ):
                continue
            target, shard = name, 0
            parts = name.split(".")
            if len(parts) >= 2 and parts[-2] in STACKED:
                merged, shard = STACKED[parts[-2]]
                target = ".".join(parts[:-2] + [merged, parts[-1]])
            if target not in params:
                raise ValueError(
                    f"checkpoint tensor {name!r} has no place in {type(self).__name__} "
                    f"(model_type {getattr(self.config, 'model_type', '?')!r}); is it the "
                    f"right architecture?"
                )
            dest = params[target].data
            if target != name:
                start, size = offsets[target.split(".")[-2]][shard]
                dest = dest.narrow(0, start, size)
            if tuple(tensor.shape) != tuple(dest.shape):
                raise ValueError(
                    f"shape mismatch for {name!r}: checkpoint has {tuple(tensor.shape)}, "
                    f"the model expects {tuple(dest.shape)}"
                )
            dest.copy_(tensor)  # host -> device and dtype conversion in one copy
            loaded.add((target, shard))
        return loaded


def _eos_ids(config: Any) -> list[int]:
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]

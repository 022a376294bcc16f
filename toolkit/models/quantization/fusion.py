"""Activation quantization fused with the norm or activation before a W8A8 layer, set up on a
built model with no model file changed.

Where a consumer layer's method asks for it (`W8A8LinearMethod.fused_input_dtype`: dynamic
per-token activations on the Triton path), its producer hands it a QuantizedActivation
(carrier.py) made by one fused kernel:

    DecoderLayer.input_layernorm           -> self_attn.qkv_proj     (LlamaAttention)
    DecoderLayer.post_attention_layernorm  -> mlp.gate_up_proj       (GatedMLP)
    GatedMLP.act (SiLU)                    -> down_proj

Only these exact classes (llama.py's, which Llama / Mistral / Qwen2 / Qwen3 / Phi-3 and dots1's
dense layers use) are wired: there the producer's output goes to that one layer and nowhere
else. The norm must run the Triton ops (CUDA, or kernels="triton"); the CPU keeps the twins and
the unfused path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from toolkit.models.quantization.carrier import QuantizedActivation


class RMSNormQuant:
    """RMSNorm's ops.rms_norm signature, returning (QuantizedActivation, the new residual)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
                 ) -> tuple[QuantizedActivation, torch.Tensor]:
        from toolkit.kernels.fused_quant import rms_norm_dynamic_per_token_quant

        q, s, new_residual = rms_norm_dynamic_per_token_quant(x, weight, eps, self.dtype, residual)
        return QuantizedActivation(q, s, x.dtype), new_residual

    def __repr__(self) -> str:
        return f"RMSNormQuant({self.dtype})"


class SiluAndMulQuant:
    """A GLU activation's signature: x [T, 2I] -> QuantizedActivation of silu(gate) * up [T, I]."""

    def __init__(self, dtype: torch.dtype, unfused: Callable[..., torch.Tensor]) -> None:
        self.dtype, self.unfused = dtype, unfused

    def __call__(self, x: torch.Tensor) -> QuantizedActivation:
        from toolkit.kernels.fused_quant import silu_and_mul_per_token_quant

        q, s = silu_and_mul_per_token_quant(x, self.dtype)
        return QuantizedActivation(q, s, x.dtype)

    def __repr__(self) -> str:
        return f"SiluAndMulQuant({self.dtype})"


def _asks(layer: nn.Module) -> torch.dtype | None:
    ask = getattr(getattr(layer, "method", None), "fused_input_dtype", None)
    return ask(layer) if ask is not None else None


def _triton_ops(ops: Any) -> bool:
    from toolkit.kernels import rms_norm, silu_and_mul

    return ops.rms_norm is rms_norm.rms_norm and ops.silu_and_mul is silu_and_mul.silu_and_mul


def fuse_activation_quant(model: nn.Module) -> int:
    """Wire every producer -> W8A8 consumer pair of `model` (see the module doc); returns how many
    were wired (0 on the CPU path or without such layers). Undo: unfuse_activation_quant."""
    from toolkit.models.layers.norm import RMSNorm
    from toolkit.models.llama import DecoderLayer, GatedMLP, LlamaAttention

    ops, wired = getattr(model, "ops", None), 0
    if ops is None or not _triton_ops(ops):
        model.fused_activation_quant = wired
        return wired
    for module in model.modules():
        if type(module) is DecoderLayer:
            pairs = [(module.input_layernorm, module.self_attn, LlamaAttention, "qkv_proj"),
                     (module.post_attention_layernorm, getattr(module, module.mlp_name), GatedMLP, "gate_up_proj")]
            for norm, consumer, cls, name in pairs:
                dtype = _asks(getattr(consumer, name)) if type(consumer) is cls else None
                if dtype is not None and type(norm) is RMSNorm:
                    norm.quant_out = RMSNormQuant(dtype)
                    wired += 1
        elif type(module) is GatedMLP and module.act is ops.silu_and_mul:
            dtype = _asks(module.down_proj)
            if dtype is not None:
                module.act = SiluAndMulQuant(dtype, module.act)
                wired += 1
    model.fused_activation_quant = wired
    return wired


def unfuse_activation_quant(model: nn.Module) -> None:
    """Back to dense producers (each W8A8 layer quantizes its own input)."""
    from toolkit.models.layers.norm import RMSNorm

    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.quant_out = None
        elif isinstance(getattr(module, "act", None), SiluAndMulQuant):
            module.act = module.act.unfused
    model.fused_activation_quant = 0


__all__ = ["RMSNormQuant", "SiluAndMulQuant", "fuse_activation_quant", "unfuse_activation_quant"]

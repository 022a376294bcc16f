"""8-bit weights: FP8 and INT8 W8A8 (per-channel or per-tensor weight scales; dynamic per-token or
static per-tensor activation scales), FP8 weight-only, block-wise FP8, and FP8 at load time.

Parameters keep the checkpoint's names (compressed-tensors / vLLM: `weight`, `weight_scale`,
`input_scale`; Hugging Face block FP8: `weight_scale_inv`), so a merged q|k|v or gate|up layer
loads each part's tensors through the part's name. Every weight scale is held per output row
(fp32 [N]): a per-tensor scale is broadcast over its part's rows, so q, k and v keep their own
scales in one merged matmul. A static input scale is held the same way and its maximum over the
parts is used (vLLM's choice for merged layers).

kernels: "auto" (the CUDA kernels on CUDA tensors, the twins elsewhere), "triton" (the Triton
kernels everywhere, under the interpreter on the CPU), "reference" (the twins).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from toolkit.kernels import reference_quant as ref
from toolkit.models.layers.parallel import shape_of, take
from toolkit.models.quantization.carrier import QuantizedActivation
from toolkit.models.quantization.params import (
    FP8_CODE_STD,
    INT8_CODE_STD,
    Layout,
    check_row_split,
    is_row_parallel,
    quant_param,
    random_codes,
    scale_for,
)

KERNELS = ("auto", "triton", "reference")


def use_fast(x: torch.Tensor, kernels: str) -> bool:
    return kernels == "triton" or (kernels == "auto" and x.is_cuda)


def per_token_quant(x: torch.Tensor, dtype: torch.dtype, kernels: str) -> tuple[torch.Tensor, torch.Tensor]:
    # fp8 on the CPU stays with the twin even for kernels="triton": the interpreter's fp8 cast
    # does not carry a rounding into the exponent (126.8 -> 64)
    if use_fast(x, kernels) and (x.is_cuda or dtype == torch.int8):
        from toolkit.kernels.quant_act import per_token_quant as fast

        return fast(x, dtype)
    return ref.per_token_quant(x, dtype)


def scaled_mm(a_q: torch.Tensor, a_s: torch.Tensor, w: torch.Tensor, w_s: torch.Tensor,
              bias: torch.Tensor | None, out_dtype: torch.dtype, kernels: str) -> torch.Tensor:
    if kernels != "reference" and a_q.is_cuda:
        from toolkit.kernels.quant_w8a8 import scaled_mm as fast

        return fast(a_q, a_s, w, w_s, bias, out_dtype)
    return ref.scaled_mm(a_q, a_s, w, w_s, bias, out_dtype)


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, group: int,
                 bias: torch.Tensor | None, kernels: str) -> torch.Tensor:
    if use_fast(x, kernels):
        from toolkit.kernels.quant_w4a16 import grouped_w8a16_gemm as fast

        return fast(x, w, scales, group, bias)
    return ref.grouped_w8a16_gemm(x, w, scales, group, bias)


def _rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """A per-row checkpoint scale ([N, 1] or [N]) -> fp32 [rows]."""
    return t.float().reshape(rows)


def _broadcast(t: torch.Tensor, rows: int) -> torch.Tensor:
    """A per-tensor checkpoint scale (() or (1,)) -> fp32 [rows]."""
    return t.float().reshape(1).expand(rows)


class W8A8LinearMethod:
    """y = (x / s_x) (W / s_w)^T s_x s_w with 8-bit codes of x and W.

    weight_dtype: torch.float8_e4m3fn or torch.int8; weight_strategy "channel" ([N, 1] scales)
    or "tensor" (one scale); activations "dynamic" (per token, computed each step), "static"
    (the checkpoint's per-tensor input_scale) or None (fp8 weight-only: x stays unquantized)."""

    def __init__(self, weight_dtype: torch.dtype, weight_strategy: str = "channel",
                 activations: str | None = "dynamic", kernels: str = "auto") -> None:
        if weight_dtype not in (ref.FP8, torch.int8):
            raise ValueError(f"weight_dtype must be torch.float8_e4m3fn or torch.int8, got {weight_dtype}")
        if weight_strategy not in ("channel", "tensor"):
            raise ValueError(f"weight_strategy must be 'channel' or 'tensor', got {weight_strategy!r}")
        if activations not in ("dynamic", "static", None):
            raise ValueError(f"activations must be 'dynamic', 'static' or None, got {activations!r}")
        if activations is None and weight_dtype == torch.int8:
            raise ValueError("int8 weights need quantized activations (W8A8); int8 weight-only is not supported")
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
        self.weight_dtype, self.weight_strategy = weight_dtype, weight_strategy
        self.activations, self.kernels = activations, kernels

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int,
                       dtype: torch.dtype, device: torch.device) -> None:
        quant_param(layer, "weight", (out_features, in_features), self.weight_dtype, Layout(0, 1),
                    lambda r, i: (r, i), init=random_codes(self.weight_dtype), device=device)
        code_std = FP8_CODE_STD if self.weight_dtype == ref.FP8 else INT8_CODE_STD
        if self.weight_strategy == "channel":
            scale = Layout(0, None, convert=_rows)
            shape = lambda r, i: (r, 1)                       # compressed-tensors' [N, 1]
        else:
            scale, shape = Layout(None, None, convert=_broadcast), (lambda r, i: (1,))
        quant_param(layer, "weight_scale", (out_features,), torch.float32, scale, shape, init=scale_for(code_std),
                    device=device)
        if self.activations == "static":
            quant_param(layer, "input_scale", (out_features,), torch.float32, Layout(None, None, convert=_broadcast),
                        lambda r, i: (1,), init="ones", device=device)

    def fused_input_dtype(self, layer: nn.Module) -> torch.dtype | None:
        """The codes' dtype when this layer takes its input already quantized per token (a fused
        norm or activation makes it: quantization/fusion.py); None: it quantizes x itself. Asked on
        the Triton path only (fp8 on the CPU stays unfused: per_token_quant's note)."""
        if self.activations != "dynamic" or self.kernels == "reference":
            return None
        fast = self.kernels == "triton" or layer.weight.is_cuda
        return self.weight_dtype if fast and (layer.weight.is_cuda or self.weight_dtype == torch.int8) else None

    def apply(self, layer: nn.Module, x: torch.Tensor | QuantizedActivation,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(x, QuantizedActivation):                                # codes [T, K], scales [T, 1]
            if x.q.dtype != self.weight_dtype or self.activations != "dynamic":
                raise ValueError(f"{self!r} cannot take a {x!r}")
            return scaled_mm(x.q, x.scale, layer.weight, layer.weight_scale, bias, x.dtype, self.kernels)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])                                         # [T, K]
        if self.activations is None:                                          # fp8 weight-only
            y = grouped_gemm(x2, layer.weight, layer.weight_scale.view(-1, 1), x2.shape[1], bias, self.kernels)
        else:
            if self.activations == "dynamic":
                q, s = per_token_quant(x2, self.weight_dtype, self.kernels)   # [T, K], [T, 1]
            else:
                s = layer.input_scale.amax().reshape(1, 1)
                q = ref.quantize_with_scale(x2, s, self.weight_dtype)
                s = s.expand(x2.shape[0], 1)
            y = scaled_mm(q, s, layer.weight, layer.weight_scale, bias, x.dtype, self.kernels)
        return y.reshape(*shape[:-1], y.shape[-1])

    def __repr__(self) -> str:
        name = "fp8" if self.weight_dtype == ref.FP8 else "int8"
        acts = {"dynamic": "a8 per-token dynamic", "static": "a8 per-tensor static", None: "a16"}[self.activations]
        return f"W8A8LinearMethod({name}, w8 per-{self.weight_strategy}, {acts}, kernels={self.kernels!r})"


class BlockFp8LinearMethod:
    """FP8 weights with one scale per block [block_n, block_k] (Hugging Face `quant_method: fp8`
    with `weight_block_size`, DeepSeek-V3 / Qwen3-FP8: `weight_scale_inv`; compressed-tensors'
    block strategy: `weight_scale`). The scales are held expanded over rows, [N, ceil(K / block_k)],
    and the GEMM dequantizes W in its inner loop. activations "dynamic" (vLLM's and DeepSeek's
    reading of these checkpoints): x is quantized per token and group of block_k columns (1 x
    block_k) and dequantized before that GEMM, which is the W8A8 block product's arithmetic;
    None: x stays unquantized (W8A16)."""

    def __init__(self, block: tuple[int, int] = (128, 128), scale_name: str = "weight_scale_inv",
                 kernels: str = "auto", activations: str | None = "dynamic") -> None:
        if len(block) != 2 or min(block) < 1:
            raise ValueError(f"weight_block_size must be two positive ints, got {block!r}")
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
        if activations not in ("dynamic", None):
            raise ValueError(f"activations must be 'dynamic' or None, got {activations!r}")
        self.block, self.scale_name, self.kernels = (int(block[0]), int(block[1])), scale_name, kernels
        self.activations = activations

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int,
                       dtype: torch.dtype, device: torch.device) -> None:
        bn, bk = self.block
        check_row_split(layer, bk, f"block-wise fp8 ({bn} x {bk})")
        quant_param(layer, "weight", (out_features, in_features), ref.FP8, Layout(0, 1), lambda r, i: (r, i),
                    init=random_codes(ref.FP8), device=device)
        expand = lambda t, rows: t.float().repeat_interleave(bn, dim=0)[:rows]
        quant_param(layer, self.scale_name, (out_features, -(-in_features // bk)), torch.float32,
                    Layout(0, 1, out_div=bn, in_div=bk, convert=expand),
                    lambda r, i: (-(-r // bn), -(-i // bk)), init=scale_for(FP8_CODE_STD), device=device)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        x2, bk = x.reshape(-1, shape[-1]), self.block[1]
        if self.activations == "dynamic":                # 1 x block_k groups, quantized and back
            q, s = ref.per_token_group_quant(x2, bk, ref.FP8)
            x2 = (q.float() * ref.group_expand(s, bk, x2.shape[1])).to(x.dtype)
        y = grouped_gemm(x2, layer.weight, getattr(layer, self.scale_name), bk, bias, self.kernels)
        return y.reshape(*shape[:-1], y.shape[-1])

    def __repr__(self) -> str:
        acts = "a8 per-token-group dynamic" if self.activations else "a16"
        return f"BlockFp8LinearMethod(block={list(self.block)}, {acts}, kernels={self.kernels!r})"


class OnlineFp8LinearMethod(W8A8LinearMethod):
    """`quantization="fp8"` on a bf16/fp32 checkpoint (vLLM's online FP8): each weight row is
    quantized to fp8 e4m3 as it loads, with its own scale (per-channel); activations per token,
    dynamically. A row-parallel rank reads the full rows it holds columns of, so its scales are
    the unsharded model's and every tensor-parallel size quantizes alike."""

    def __init__(self, kernels: str = "auto") -> None:
        super().__init__(ref.FP8, "channel", "dynamic", kernels)

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int,
                       dtype: torch.dtype, device: torch.device) -> None:
        super().create_weights(layer, in_features, out_features, dtype, device)
        layer.weight.weight_loader = lambda p, loaded, shard_id=None: self._load(layer, loaded, shard_id)
        layer.weight.init = "normal"                         # random weights: a bf16 / fp32 checkpoint's
        layer.weight_scale.shards, layer.weight_scale.init = [], None     # written with the weight
        layer.weight_scale.weight_loader = _refuse_scale

    @staticmethod
    def _load(layer: nn.Module, loaded: Any, shard_id: Any) -> None:
        if is_row_parallel(layer):
            full = take(loaded).to(layer.weight.device).float()                # [N, K_full]
            if tuple(full.shape) != (layer.out_features, layer.in_full):
                raise ValueError(f"shape mismatch: checkpoint has {tuple(full.shape)}, the model expects "
                                 f"{(layer.out_features, layer.in_full)}")
            q, s = ref.per_token_quant(full, ref.FP8)                          # each row's own scale
            layer.weight.data.copy_(layer.cols.of(q, 1))
            layer.weight_scale.data.copy_(s.reshape(-1))
            return
        parts = layer.parts
        if shard_id is None and None not in parts:                             # a fused tensor
            jobs, start = [], 0
            for sid, (rows, s) in parts.items():
                jobs.append((sid, s.shifted(start)))
                start += rows
        else:
            if shard_id not in parts:
                raise ValueError(f"shard {shard_id!r} is not one of {list(parts)}")
            rows, s = parts[shard_id]
            if shape_of(loaded) != (rows, layer.in_features):
                raise ValueError(f"shape mismatch for shard {shard_id!r}: checkpoint has {shape_of(loaded)}, "
                                 f"the model expects {(rows, layer.in_features)}")
            jobs = [(shard_id, s)]
        for sid, s in jobs:
            q, scale = ref.per_token_quant(take(loaded, 0, s).to(layer.weight.device).float(), ref.FP8)
            off = layer.offsets[sid]
            layer.weight.data.narrow(0, off, s.size).copy_(q)
            layer.weight_scale.data.narrow(0, off, s.size).copy_(scale.reshape(-1))

    def __repr__(self) -> str:
        return f"OnlineFp8LinearMethod(fp8 w8 per-channel at load, a8 per-token dynamic, kernels={self.kernels!r})"


def _refuse_scale(param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
    raise ValueError("weight_scale is computed when the weight loads (quantization='fp8' quantizes a "
                     "bf16/fp32 checkpoint); a checkpoint that already holds fp8 scales needs no "
                     "quantization= (its config.json's quantization_config is read)")


def dense_weight(layer: nn.Module) -> torch.Tensor:
    """The fp32 [N, K] weight an 8-bit layer computes with (tests, divergence measurements)."""
    m = layer.method
    if isinstance(m, BlockFp8LinearMethod):
        return ref.dequantize_grouped(layer.weight, getattr(layer, m.scale_name), m.block[1])
    return layer.weight.float() * layer.weight_scale.float().reshape(-1, 1)


__all__ = ["BlockFp8LinearMethod", "OnlineFp8LinearMethod", "W8A8LinearMethod", "dense_weight"]

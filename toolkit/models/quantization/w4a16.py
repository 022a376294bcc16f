"""4-bit weight-only linear layers (W4A16) from the three published layouts.

Every layout is converted at load time into one form (reference_quant's module doc): qweight
int32 [N, ceil(K / 8)] packed along K, fp32 scales [N, G] and uint8 zero points [N, G] (None:
symmetric, 8), G = ceil(K / group). The checkpoints (each tensor's name as written):

    compressed-tensors   weight_packed int32 [N, ceil(K / 8)] (value + 8 packed along K),
    pack-quantized       weight_scale [N, G], weight_shape int [2] = (N, K), and when
                         asymmetric weight_zero_point int32 [ceil(N / 8), G] (zp + 8 packed along N)
    GPTQ (AutoGPTQ /     qweight int32 [K / 8, N] packed along K, qzeros int32 [G, N / 8] packed
    GPTQModel, v1)       along N holding zero - 1 (checkpoint_format "gptq_v2": the zero itself),
                         scales [G, N], g_idx int32 [K] (k // group: act-order is refused)
    AWQ (AutoAWQ GEMM)   qweight int32 [K, N / 8] and qzeros int32 [G, N / 8] packed along N in the
                         order [0, 2, 4, 6, 1, 3, 5, 7], scales [G, N]; w = (q - zero) * scale
group_size -1 (or None): one group over all of K (per-channel scales).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from toolkit.kernels import reference_quant as ref
from toolkit.models.quantization.params import (
    INT4_CODE_STD,
    Layout,
    check_row_split,
    ignored,
    is_row_parallel,
    quant_param,
    random_words,
    scale_for,
)
from toolkit.models.quantization.w8a8 import KERNELS, use_fast

FORMATS = ("compressed-tensors", "gptq", "awq")
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)     # column j of 8 is nibble AWQ_REVERSE_ORDER[j]


def unpack_cols(t: torch.Tensor, awq: bool = False) -> torch.Tensor:
    """int32 [R, C] packed along dim 1 -> uint8 nibbles [R, 8C] (AWQ's interleaved order if awq)."""
    u = ref.unpack_int4(t.to(torch.int32), 8 * t.shape[1]).reshape(t.shape[0], -1, 8)
    if awq:
        u = u[..., list(AWQ_REVERSE_ORDER)]
    return u.reshape(t.shape[0], -1)


class W4A16LinearMethod:
    """y = x @ dequant(W)^T with 4-bit W, unquantized x. fmt: "compressed-tensors" | "gptq" | "awq";
    group_size: K columns per scale (-1 / None: all of K); symmetric: no zero points (compressed-
    tensors only: GPTQ and AWQ always store qzeros); gptq_v2: GPTQ zeros stored without the -1."""

    def __init__(self, fmt: str, group_size: int | None = 128, symmetric: bool = True, *,
                 gptq_v2: bool = False, kernels: str = "auto") -> None:
        if fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
        if group_size is not None and group_size != -1 and group_size < 1:
            raise ValueError(f"group_size must be -1, None or >= 1, got {group_size}")
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
        self.fmt, self.kernels, self.gptq_v2 = fmt, kernels, gptq_v2
        self.group_size = None if group_size in (None, -1) else int(group_size)
        self.symmetric = symmetric if fmt == "compressed-tensors" else False

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int,
                       dtype: torch.dtype, device: torch.device) -> None:
        g = self.group_size
        check_row_split(layer, math.lcm(8, g or 8), f"4-bit weights ({self.fmt}, group {g})")
        full_k = layer.in_full if is_row_parallel(layer) else in_features
        if g is None and is_row_parallel(layer) and layer.group.size > 1:
            gk = None                                   # one group over the full K: scales whole
        else:
            gk = g
        layer.group_k = g or in_features                # the local group the kernel sees
        groups = -(-in_features // layer.group_k)
        n_groups = lambda i: -(-i // g) if g else 1     # checkpoint groups of K = i
        split = gk is not None                          # the scales' K dimension follows the rank's columns
        if self.fmt == "compressed-tensors":
            quant_param(layer, "weight_packed", (out_features, -(-in_features // 8)), torch.int32,
                        Layout(0, 1, in_div=8), lambda r, i: (r, -(-i // 8)), init=random_words, device=device)
            quant_param(layer, "weight_scale", (out_features, groups), torch.float32,
                        Layout(0, 1 if split else None, in_div=g or 1, convert=lambda t, rows: t.float()),
                        lambda r, i: (r, n_groups(i)), init=scale_for(INT4_CODE_STD), device=device)
            if not self.symmetric:
                quant_param(layer, "weight_zero_point", (out_features, groups), torch.uint8,
                            Layout(0, 1 if split else None, out_div=8, in_div=g or 1, convert=lambda t, rows: unpack_cols(t.t()).t()),
                            lambda r, i: (-(-r // 8), n_groups(i)), init=random_words, device=device)
            ignored(layer, "weight_shape", lambda r, i: (2,), self._check_shape(layer, full_k))
        elif self.fmt == "gptq":
            quant_param(layer, "qweight", (out_features, -(-in_features // 8)), torch.int32,
                        Layout(1, 0, in_div=8, convert=lambda t, rows: t.t()),
                        lambda r, i: (i // 8, r), init=random_words, device=device)
            off = 0 if self.gptq_v2 else 1
            quant_param(layer, "qzeros", (out_features, groups), torch.uint8,
                        Layout(1, 0 if split else None, out_div=8, in_div=g or 1,
                               convert=lambda t, rows: ((unpack_cols(t).to(torch.int32) + off) & 15).t()),
                        lambda r, i: (n_groups(i), r // 8), init=random_words, device=device)
            quant_param(layer, "scales", (out_features, groups), torch.float32,
                        Layout(1, 0 if split else None, in_div=g or 1, convert=lambda t, rows: t.float().t()),
                        lambda r, i: (n_groups(i), r), init=scale_for(INT4_CODE_STD), device=device)
            ignored(layer, "g_idx", lambda r, i: (i,), self._check_g_idx(full_k))
        else:
            quant_param(layer, "qweight", (out_features, -(-in_features // 8)), torch.int32,
                        Layout(1, 0, out_div=8, convert=lambda t, rows: ref.pack_int4(unpack_cols(t, awq=True).t())),
                        lambda r, i: (i, r // 8), init=random_words, device=device)
            quant_param(layer, "qzeros", (out_features, groups), torch.uint8,
                        Layout(1, 0 if split else None, out_div=8, in_div=g or 1, convert=lambda t, rows: unpack_cols(t, awq=True).t()),
                        lambda r, i: (n_groups(i), r // 8), init=random_words, device=device)
            quant_param(layer, "scales", (out_features, groups), torch.float32,
                        Layout(1, 0 if split else None, in_div=g or 1, convert=lambda t, rows: t.float().t()),
                        lambda r, i: (n_groups(i), r), init=scale_for(INT4_CODE_STD), device=device)

    def _check_shape(self, layer: nn.Module, full_k: int) -> Any:
        def check(t: torch.Tensor, shard_id: Any) -> None:
            rows = layer.out_features if is_row_parallel(layer) else None
            if rows is None:
                rows = layer.parts[shard_id][0] if shard_id in layer.parts else sum(r for r, _ in layer.parts.values())
            if tuple(int(v) for v in t.reshape(-1).tolist()) != (rows, full_k):
                raise ValueError(f"weight_shape {t.tolist()} is not the layer's {[rows, full_k]}")
        return check

    def _check_g_idx(self, full_k: int) -> Any:
        g = self.group_size or full_k

        def check(t: torch.Tensor, shard_id: Any) -> None:
            want = torch.arange(full_k, dtype=torch.int64) // g
            if t.shape != want.shape or not torch.equal(t.to(torch.int64), want):
                raise ValueError("GPTQ g_idx is not k // group_size: act-order (desc_act=True) checkpoints are "
                                 "not supported; use one quantized with desc_act=False")
        return check

    def tensors(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(qweight [N, ceil(K / 8)], scales [N, G], zeros [N, G] or None) in the kernel's layout."""
        if self.fmt == "compressed-tensors":
            return layer.weight_packed, layer.weight_scale, None if self.symmetric else layer.weight_zero_point
        return layer.qweight, layer.scales, layer.qzeros

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        qw, s, z = self.tensors(layer)
        if use_fast(x2, self.kernels):
            from toolkit.kernels.quant_w4a16 import w4a16_gemm

            y = w4a16_gemm(x2, qw, s, z, layer.group_k, bias)
        else:
            y = ref.w4a16_gemm(x2, qw, s, z, layer.group_k, bias)
        return y.reshape(*shape[:-1], y.shape[-1])

    def __repr__(self) -> str:
        zero = "symmetric" if self.symmetric else "zero points"
        return (f"W4A16LinearMethod({self.fmt}, group={self.group_size or 'channel'}, {zero}, "
                f"kernels={self.kernels!r})")


def dense_weight(layer: nn.Module) -> torch.Tensor:
    """The fp32 [N, K] weight a 4-bit layer computes with (tests, divergence measurements)."""
    qw, s, z = layer.method.tensors(layer)
    k = layer.cols.size if is_row_parallel(layer) else layer.in_features
    return ref.dequantize_int4(qw, s, z, layer.group_k, k)

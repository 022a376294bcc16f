"""Quantized parameters that place their own rank's part of a checkpoint tensor.

A quantized linear layer holds several tensors per checkpoint weight (codes, scales, zero
points), each laid out its own way: packed 8 to an int32 along K (GPTQ) or along N (AWQ's
qweight, packed zero points), one scale per group of K, per 128 x 128 block, per row, or one
for the whole tensor. A `Layout` says, for one checkpoint tensor, which of its dimensions runs
over the layer's output features and which over its input features, and how many features one
element covers. The generic loader then cuts this rank's part exactly as the layer cuts its
dense weight (linear.py: output rows for the column forms, merged parts each on its own, input
columns for the row form) and `convert` turns that part into the parameter's own layout, which
always holds one row per output feature: [rows, ...].

Column forms: the checkpoint elements covering the rank's rows [start, start + size) are read
(from floor(start / div) to ceil(end / div)), converted to whole rows and narrowed, so a block
or packed word that straddles two ranks is read by both. Row form: the input columns are cut
in whole elements, so a rank's columns must start on a group / block / pack boundary
(`check_row_split`, raised when the layer is built).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from toolkit.models.layers.parallel import Slice, shape_of, take


@dataclass(frozen=True)
class Layout:
    """How one checkpoint tensor maps onto a parameter [output rows, ...].

    out_dim / in_dim: the checkpoint dimension over output / input features (None: the tensor
    has none and every rank reads all of it: a per-tensor scale, a per-row scale's K).
    out_div / in_div: features one element of that dimension covers (8 packed, 128 a block).
    convert(part, rows): the checkpoint part -> the parameter's layout with `rows` rows."""
    out_dim: int | None
    in_dim: int | None
    out_div: int = 1
    in_div: int = 1
    convert: Callable[[torch.Tensor, int], torch.Tensor] | None = None


def is_row_parallel(layer: nn.Module) -> bool:
    return hasattr(layer, "cols")


def full_shapes(layer: nn.Module, shape_fn: Callable[[int, int], tuple[int, ...]]) -> list[tuple[Any, tuple[int, ...]]]:
    """[(shard id, full checkpoint shape)] of a tensor whose full shape is shape_fn(rows, in)."""
    if is_row_parallel(layer):
        return [(None, shape_fn(layer.out_features, layer.in_full))]
    return [(sid, shape_fn(rows, layer.in_features)) for sid, (rows, _) in layer.parts.items()]


def check_row_split(layer: nn.Module, align: int, what: str) -> None:
    """A row-parallel rank's input columns must start (and, unless last, end) on `align`."""
    if not is_row_parallel(layer) or layer.group.size == 1:
        return
    c = layer.cols
    end = c.start + c.size
    if c.start % align or (end % align and end != layer.in_full):
        raise ValueError(f"{what}: a rank's input columns [{c.start}, {end}) of {layer.in_full} do not start "
                         f"on a multiple of {align}; use a tensor_parallel_size that splits "
                         f"{layer.in_full} into multiples of {align}")


# Random weights in a quantized layout (load_format="dummy": benchmarks at real shapes): an
# initialiser (full checkpoint shape, generator, std) -> the checkpoint tensor, drawn whole so
# every tensor-parallel size loads the same model; codes times scales have about `std`.
Init = Callable[[tuple[int, ...], torch.Generator, float], torch.Tensor]
FP8_CODE_STD = 64.0                    # random fp8 codes: N(0, 64), well inside +-448
INT8_CODE_STD = 73.3                   # uniform int8 codes in [-127, 127]
INT4_CODE_STD = 6.5                    # (u - z) with u and z uniform nibbles


def random_words(shape: tuple[int, ...], gen: torch.Generator, std: float) -> torch.Tensor:
    """int32 words of 8 packed nibbles, each uniform in 0..15 (codes or zero points)."""
    return torch.randint(-2**31, 2**31, shape, generator=gen, device=gen.device, dtype=torch.int64).to(torch.int32)


def random_codes(dtype: torch.dtype) -> Init:
    def init(shape: tuple[int, ...], gen: torch.Generator, std: float) -> torch.Tensor:
        if dtype == torch.int8:
            return torch.randint(-127, 128, shape, generator=gen, device=gen.device, dtype=torch.int8)
        z = torch.randn(shape, generator=gen, device=gen.device) * FP8_CODE_STD
        return z.clamp(-448.0, 448.0).to(dtype)
    return init


def scale_for(code_std: float) -> Init:
    """Scales that give dequantized weights of std `std` from codes of std `code_std`."""
    return lambda shape, gen, std: torch.full(shape, std / code_std, device=gen.device)


def quant_param(layer: nn.Module, name: str, shape: tuple[int, ...], dtype: torch.dtype,
                layout: Layout, shape_fn: Callable[[int, int], tuple[int, ...]], init: str | Init = "zeros",
                device: torch.device | None = None) -> nn.Parameter:
    """A parameter `name` of the layer, loaded from checkpoint tensors of full shape
    shape_fn(rows, in_features) through `layout`; init: what random weights draw ("zeros" /
    "ones" / "normal" in the model's dtype, or an Init giving the checkpoint's tensor)."""
    p = nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
    p.weight_loader = lambda param, loaded, shard_id=None: load_part(layer, layout, param, loaded, shard_id)
    p.shards, p.init = full_shapes(layer, shape_fn), init
    setattr(layer, name, p)
    return p


def _want_shape(param: nn.Parameter, shard_id: Any) -> tuple[int, ...] | None:
    for sid, shape in param.shards:
        if sid == shard_id:
            return tuple(shape)
    return None


def _check(got: tuple[int, ...], want: tuple[int, ...] | None, layout: Layout, what: str) -> None:
    if want is None:
        return
    if layout.out_dim is None and layout.in_dim is None:          # a scalar: () or (1,) alike
        ok = math.prod(got) == math.prod(want)
    else:
        ok = tuple(got) == tuple(want)
    if not ok:
        raise ValueError(f"shape mismatch for {what}: checkpoint has {tuple(got)}, the model expects {tuple(want)}")


def load_part(layer: nn.Module, layout: Layout, param: nn.Parameter, loaded: Any, shard_id: Any) -> None:
    """Copy this rank's part of checkpoint tensor `shard_id` (module doc) into param."""
    convert = layout.convert or (lambda t, rows: t)
    if is_row_parallel(layer):
        _check(shape_of(loaded), _want_shape(param, None), layout, "a row-parallel tensor")
        part = loaded
        if layout.in_dim is not None and layer.group.size > 1:
            c, d = layer.cols, layout.in_div
            part = take(loaded, layout.in_dim, Slice(c.start // d, -(-(c.start + c.size) // d) - c.start // d))
        else:
            part = take(loaded)
        rows = layer.out_features
        _copy(param.data, convert(part, rows), "a row-parallel tensor")
        return
    parts = layer.parts
    if shard_id is None and None not in parts:                   # a fused checkpoint tensor (Phi-3)
        jobs, start = [], 0
        for sid, (rows, s) in parts.items():
            jobs.append((sid, s.shifted(start)))
            start += rows
    else:
        if shard_id not in parts:
            raise ValueError(f"shard {shard_id!r} is not one of {list(parts)}")
        _check(shape_of(loaded), _want_shape(param, shard_id), layout, f"shard {shard_id!r}")
        jobs = [(shard_id, parts[shard_id][1])]
    for sid, s in jobs:
        if layout.out_dim is None:
            rows_part = convert(take(loaded), s.size)
        else:
            d = layout.out_div
            lo, hi = s.start // d, -(-(s.start + s.size) // d)
            rows_part = convert(take(loaded, layout.out_dim, Slice(lo, hi - lo)), (hi - lo) * d)
            rows_part = rows_part.narrow(0, s.start - lo * d, s.size)
        dest = param.data.narrow(0, layer.offsets[sid], parts[sid][1].size)
        _copy(dest, rows_part, f"shard {sid!r}")


def _copy(dest: torch.Tensor, part: torch.Tensor, what: str) -> None:
    if tuple(part.shape) != tuple(dest.shape):
        raise ValueError(f"shape mismatch for {what}: the checkpoint part converts to {tuple(part.shape)}, "
                         f"the parameter holds {tuple(dest.shape)}")
    dest.copy_(part)


def ignored(layer: nn.Module, name: str, shape_fn: Callable[[int, int], tuple[int, ...]],
            check: Callable[[torch.Tensor, Any], None] | None = None) -> nn.Parameter:
    """An empty parameter for a checkpoint tensor that is read and checked but not kept
    (compressed-tensors' weight_shape, GPTQ's g_idx): it must be present, as vLLM requires."""
    p = nn.Parameter(torch.empty(0), requires_grad=False)

    def check_value(loaded: Any, shard_id: Any = None) -> None:      # also update_weights' check phase
        if check is not None:
            check(take(loaded), shard_id)

    p.weight_loader = lambda param, loaded, shard_id=None: check_value(loaded, shard_id)
    p.check_value, p.shards, p.init = check_value, full_shapes(layer, shape_fn), None   # random weights skip it
    setattr(layer, name, p)
    return p

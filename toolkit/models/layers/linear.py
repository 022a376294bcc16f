"""Linear layers whose arithmetic is a swappable `LinearMethod`, in Megatron's parallel forms.

    ReplicatedLinear       the whole W on every rank
    ColumnParallelLinear   W's output rows split over ranks; the output stays split. Merged
                           forms hold several checkpoint tensors in one matmul, each split on
                           its own: MergedColumnParallelLinear (gate | up), QKVParallelLinear
                           (q | k | v by heads; KV heads replicated when fewer than ranks)
    RowParallelLinear      W's input columns split; the partial products are all-reduced
                           (the bias added once, by rank 0)

At TP=1 the group is `SingleProcess` and these are plain linear layers: one code path.

A layer owns the layout (which rows or columns of which checkpoint tensor its rank holds);
its `LinearMethod` owns the arithmetic and the parameters that hold the weight (dense today;
quantized forms and LoRA wrap or replace it without a model-file change). Every parameter
carries three attributes the loaders read (the layer's, unless the method set its own on a
parameter, e.g. a quantization scale):
    weight_loader(param, loaded, shard_id)   copies this rank's part of a checkpoint tensor
    shards        [(shard_id, full checkpoint shape)]: what a checkpoint must provide
    init          "normal" | "zeros" | "ones": the random-weights rule
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.models.layers.parallel import Slice, even_slice, head_slice, shape_of, single_process, take


@runtime_checkable
class LinearMethod(Protocol):
    """The arithmetic of a linear layer of this rank's in_features -> out_features."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int,
                       dtype: torch.dtype, device: torch.device) -> None: ...

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor: ...


def matrix(n_out: int, n_in: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    """An uninitialised weight [out, in]. On the CPU its storage is [in, out] (the parameter is
    the transposed view): F.linear's x @ W^T is then a plain gemm over a row-major [in, out]
    matrix, which MKL runs without re-packing W on every call (the loader writes through the
    view, so checkpoints load unchanged)."""
    if device.type == "cpu":
        return nn.Parameter(torch.empty(n_in, n_out, dtype=dtype, device=device).t(), requires_grad=False)
    return nn.Parameter(torch.empty(n_out, n_in, dtype=dtype, device=device), requires_grad=False)


def vector(n: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(n, dtype=dtype, device=device), requires_grad=False)


def mark(param: nn.Parameter, loader: Any, shards: list[tuple[Any, tuple[int, ...]]],
         init: str) -> nn.Parameter:
    """Attach the loader attributes (module doc) to a parameter."""
    param.weight_loader, param.shards, param.init = loader, shards, init
    return param


class UnquantizedLinearMethod:
    """Dense weights in the model's dtype: y = x W^T (+ b)."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int,
                       dtype: torch.dtype, device: torch.device) -> None:
        layer.weight = matrix(out_features, in_features, dtype, device)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)

    def __repr__(self) -> str:
        return "UnquantizedLinearMethod()"


def _check_shape(name: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(f"shape mismatch for {name}: checkpoint has {tuple(got)}, the model "
                         f"expects {tuple(want)}")


class ColumnParallelLinear(nn.Module):
    """Output rows of one or more checkpoint tensors ("parts"), this rank's slice of each,
    concatenated in one weight [sum of slices, in]. parts: {shard_id: (full rows, the rank's
    Slice of them)} in order; shard_id None = the single tensor of an unmerged layer."""

    def __init__(self, in_features: int, parts: dict[Any, tuple[int, Slice]], bias: bool, *,
                 dtype: torch.dtype, device: torch.device | str, group: Any = None,
                 method: LinearMethod | None = None) -> None:
        super().__init__()
        device = torch.device(device)
        self.group = group if group is not None else single_process()
        self.method = method if method is not None else UnquantizedLinearMethod()
        self.in_features, self.parts = in_features, parts
        self.out_features = sum(s.size for _, s in parts.values())          # this rank's rows
        self.offsets, off = {}, 0                                           # shard -> local row
        for sid, (_, s) in parts.items():
            self.offsets[sid], off = off, off + s.size
        self.method.create_weights(self, in_features, self.out_features, dtype, device)
        shards = [(sid, (rows, in_features)) for sid, (rows, _) in parts.items()]
        for _, p in self.named_parameters(recurse=False):       # the method's weights, unless
            if not hasattr(p, "weight_loader"):                  # it placed them itself (scales)
                mark(p, self.weight_loader, shards, "normal")
        self.bias = None
        if bias:
            self.bias = mark(vector(self.out_features, dtype, device), self.weight_loader,
                             [(sid, (rows,)) for sid, (rows, _) in parts.items()], "zeros")

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        """Copy this rank's rows of checkpoint tensor `shard_id` (or, for shard_id None on a
        merged layer, of the checkpoint's already-merged tensor: Phi-3's qkv_proj)."""
        if shard_id is None and None not in self.parts:        # a fused checkpoint tensor
            full = sum(rows for rows, _ in self.parts.values())
            _check_shape("a fused projection", shape_of(loaded)[:1], (full,))
            start = 0
            for sid, (rows, s) in self.parts.items():
                self._copy(param, take(loaded, 0, s.shifted(start)), sid)
                start += rows
            return
        if shard_id not in self.parts:
            raise ValueError(f"shard {shard_id!r} is not one of {list(self.parts)}")
        rows, s = self.parts[shard_id]
        _check_shape(f"shard {shard_id!r}", shape_of(loaded)[:1], (rows,))
        self._copy(param, take(loaded, 0, s), shard_id)

    def _copy(self, param: nn.Parameter, part: torch.Tensor, shard_id: Any) -> None:
        dest = param.data.narrow(0, self.offsets[shard_id], self.parts[shard_id][1].size)
        _check_shape(f"shard {shard_id!r} of {tuple(param.shape)}", tuple(part.shape), tuple(dest.shape))
        dest.copy_(part)       # host -> device and dtype conversion in one copy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x, self.bias)           # [T, out / N]

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The output [T, out] as one view per part (q, k, v or gate, up) of this rank."""
        return y.split([s.size for _, s in self.parts.values()], dim=-1)

    def extra_repr(self) -> str:
        parts = ", ".join(f"{sid}: {s.size}" for sid, (_, s) in self.parts.items())
        return (f"in={self.in_features}, out={self.out_features} ({parts}), bias={self.bias is not None}, "
                f"rank {self.group.rank}/{self.group.size}, {self.method!r}")


def column(in_features: int, out_features: int, bias: bool, **kw: Any) -> ColumnParallelLinear:
    """An unmerged column-parallel layer (rows split evenly)."""
    g = kw.get("group") or single_process()
    return ColumnParallelLinear(in_features, {None: (out_features, even_slice(out_features, g.rank, g.size))},
                                bias, **kw)


def merged_column(in_features: int, output_sizes: list[int], bias: bool, *,
                  shard_ids: list[Any] | None = None, **kw: Any) -> ColumnParallelLinear:
    """MergedColumnParallelLinear: several checkpoint tensors (gate | up) in one matmul."""
    g = kw.get("group") or single_process()
    ids = shard_ids if shard_ids is not None else list(range(len(output_sizes)))
    return ColumnParallelLinear(in_features, {sid: (n, even_slice(n, g.rank, g.size))
                                              for sid, n in zip(ids, output_sizes)}, bias, **kw)


def qkv(hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool,
        **kw: Any) -> ColumnParallelLinear:
    """QKVParallelLinear: q, k, v by heads (shard ids "q", "k", "v"); KV heads replicated on
    several ranks when there are fewer of them than ranks."""
    g = kw.get("group") or single_process()
    return ColumnParallelLinear(hidden, {
        "q": (num_heads * head_dim, head_slice(num_heads, head_dim, g.rank, g.size)),
        "k": (num_kv_heads * head_dim, head_slice(num_kv_heads, head_dim, g.rank, g.size)),
        "v": (num_kv_heads * head_dim, head_slice(num_kv_heads, head_dim, g.rank, g.size)),
    }, bias, **kw)


class RowParallelLinear(nn.Module):
    """This rank's input columns [in / N] of W [out, in]; the output is the all-reduced sum
    over ranks. The bias is held whole on every rank and added by rank 0 only. cols: the
    rank's Slice of the input (even by default; o_proj's follows the query heads).
    reduce_results=False returns this rank's term unreduced (vLLM's flag), for a caller that
    sums it with other partial sums before one all-reduce."""

    def __init__(self, in_features: int, out_features: int, bias: bool, *, dtype: torch.dtype,
                 device: torch.device | str, group: Any = None, method: LinearMethod | None = None,
                 cols: Slice | None = None, reduce_results: bool = True) -> None:
        super().__init__()
        device = torch.device(device)
        self.group = group if group is not None else single_process()
        self.method = method if method is not None else UnquantizedLinearMethod()
        self.in_full, self.out_features = in_features, out_features
        self.reduce_results = reduce_results
        self.cols = cols if cols is not None else even_slice(in_features, self.group.rank, self.group.size)
        self.method.create_weights(self, self.cols.size, out_features, dtype, device)
        for _, p in self.named_parameters(recurse=False):       # as ColumnParallelLinear's
            if not hasattr(p, "weight_loader"):
                mark(p, self.weight_loader, [(None, (out_features, in_features))], "normal")
        self.bias = None
        if bias:
            self.bias = mark(vector(out_features, dtype, device), self.weight_loader,
                             [(None, (out_features,))], "zeros")

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        shape = shape_of(loaded)
        if len(shape) == 1:                          # the bias, whole
            _check_shape("a row-parallel bias", shape, tuple(param.shape))
            param.data.copy_(take(loaded))
            return
        _check_shape("a row-parallel weight", shape, (self.out_features, self.in_full))
        param.data.copy_(take(loaded, 1, self.cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in / N] -> [T, out]: this rank's term of the sum, then the all-reduce (unless
        reduce_results is off)."""
        bias = self.bias if self.group.rank == 0 else None
        y = self.method.apply(self, x, bias)
        return self.group.all_reduce(y) if self.reduce_results else y

    def extra_repr(self) -> str:
        return (f"in={self.cols.size} (columns {self.cols.start}.. of {self.in_full}), "
                f"out={self.out_features}, bias={self.bias is not None}, {self.method!r}")


def replicated(in_features: int, out_features: int, bias: bool, *, dtype: torch.dtype,
               device: torch.device | str, method: LinearMethod | None = None) -> ColumnParallelLinear:
    """ReplicatedLinear: all of W on every rank (a router's gate, small projections)."""
    return ColumnParallelLinear(in_features, {None: (out_features, Slice(0, out_features))}, bias,
                                dtype=dtype, device=device, method=method)

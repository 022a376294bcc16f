"""LoRALinearMethod: a linear layer's base arithmetic (dense, quantized: whatever method the
layer would have) plus the batched LoRA of the step's adapters.

    y = base.apply(layer, x, bias)                          [T, out]
    h = shrink(x, A[slot[t]])                               [T, slices x R]  fp32
    y[:, slice] += expand(h[:, slice's R], B[slot[t]])      per slice (q | k | v, gate | up)

The layer holds the stacked weights of every device slot, zero-padded to max_lora_rank R:
    lora_a [slots, slices x R, in]   (this rank's input columns for a row-parallel layer)
    lora_b [slots, out, R]           (this rank's output rows for a column-parallel layer)
A token's slot comes from `state.indices` (a persistent device buffer the runner fills each
step, -1 = the base model), so CUDA graphs replay with adapters. Tensor parallel: a
row-parallel layer adds its partial x_r A_r^T B^T before the layer's all-reduce, whose sum
over ranks is x A^T B^T; a column-parallel layer's B rows are its output rows. No
collective is added.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from toolkit.models.layers.linear import LinearMethod


class LoRALinearMethod:
    def __init__(self, base: LinearMethod, state: Any) -> None:
        self.base, self.state = base, state
        self.slices: list[tuple[int, int]] = []          # (output offset, size) per checkpoint part
        self.shard_ids: list[Any] = []

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int,
                       dtype: torch.dtype, device: torch.device) -> None:
        self.base.create_weights(layer, in_features, out_features, dtype, device)
        parts = getattr(layer, "parts", None)            # column-parallel: its checkpoint parts
        if parts is not None:
            self.shard_ids = list(parts)
            self.slices = [(layer.offsets[sid], s.size) for sid, (_, s) in parts.items()]
        else:                                            # row-parallel: one part, whole output
            self.shard_ids, self.slices = [None], [(0, out_features)]
        s, r = self.state.max_loras, self.state.max_lora_rank
        layer.register_buffer("lora_a", torch.zeros(s, len(self.slices) * r, in_features, dtype=dtype,
                                                    device=device), persistent=False)
        layer.register_buffer("lora_b", torch.zeros(s, out_features, r, dtype=dtype, device=device),
                              persistent=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = self.base.apply(layer, x, bias)                              # [T, out]
        from toolkit.kernels.dispatch import lora_expand, lora_shrink

        t, r = x.shape[0], self.state.max_lora_rank
        idx = self.state.indices[:t]                                     # [T] slots, -1 = base
        x2 = x if x.stride(-1) == 1 else x.contiguous()
        y2 = y if y.is_contiguous() else y.contiguous()
        h = torch.empty(t, layer.lora_a.shape[1], dtype=torch.float32, device=x.device)
        lora_shrink(x2, layer.lora_a, idx, h, backend=self.state.backend)
        lora_expand(y2, h, layer.lora_b, idx, [(o, n, i * r) for i, (o, n) in enumerate(self.slices)],
                    backend=self.state.backend)
        return y2

    def load_slot(self, layer: nn.Module, slot: int,
                  parts: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Copy one adapter's (A [r, in full], B [out full, r]) per part (None: not targeted)
        into `slot`, this rank's share of each, zero-padded."""
        r_max = self.state.max_lora_rank
        a, b = layer.lora_a[slot], layer.lora_b[slot]
        a.zero_()
        b.zero_()
        cols = getattr(layer, "cols", None)              # a row-parallel rank's input columns
        for i, ((off, size), sid, ab) in enumerate(zip(self.slices, self.shard_ids, parts)):
            if ab is None:
                continue
            la, lb = ab
            r = la.shape[0]
            if cols is not None:
                la = la.narrow(1, cols.start, cols.size)
            else:
                lb = lb.narrow(0, layer.parts[sid][1].start, size)
            a[i * r_max:i * r_max + r].copy_(la)
            b[off:off + size, :r].copy_(lb)

    def full_shapes(self, layer: nn.Module) -> list[tuple[int, int]]:
        """(in, out) of each part's full checkpoint tensor, what an adapter must match."""
        cols = getattr(layer, "cols", None)
        if cols is not None:
            return [(layer.in_full, layer.out_features)]
        return [(layer.in_features, layer.parts[sid][0]) for sid in self.shard_ids]

    def __repr__(self) -> str:
        return f"LoRA({self.base!r}, slots={self.state.max_loras}, rank<={self.state.max_lora_rank})"

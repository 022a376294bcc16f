"""HostKVCache: the host (CPU) memory of the host tier, and the block copies to and from it.

One tensor `[num_slots, num_layers, 2, block_size, num_kv_heads, head_dim]`: slot-major,
so one slot (a block of every layer) is one contiguous run of bytes and a run of
consecutive slots is one DMA. Pinned on CUDA (a non_blocking copy from or to pageable
memory would be synchronous), plain memory on the CPU. The device cache is the runner's
KVCache: per layer `[2, num_blocks, block_size, num_kv_heads, head_dim]`.

`swap_out(layers, pairs)` copies device block -> host slot, `swap_in(layers, pairs)` host
slot -> device block. On CUDA every copy is enqueued on the current stream and nothing
waits: a chunk of blocks is gathered on the device into a staging buffer (one index per
layer), then each run of consecutive slots is one non_blocking copy to pinned memory;
swap-in is the mirror image. The staging buffer is freed back to the caching allocator,
which reuses it only in stream order. On the CPU the same indexing runs synchronously.
The twins `swap_out_reference` / `swap_in_reference` copy one block of one layer at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from toolkit.transfer import to_device   # pinned staging: a pageable H2D copy would stall the host

CHUNK = 64   # blocks per staging buffer on CUDA (64 blocks of Llama-3.1-8B bf16: 128 MiB)


class HostKVCache:
    def __init__(self, num_slots: int, num_layers: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, pin: bool = False) -> None:
        for name, v in dict(num_slots=num_slots, num_layers=num_layers, block_size=block_size,
                            num_kv_heads=num_kv_heads, head_dim=head_dim).items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"HostKVCache {name} must be a positive integer, got {v!r}")
        self.num_slots, self.num_layers = num_slots, num_layers
        shape = (num_slots, num_layers, 2, block_size, num_kv_heads, head_dim)
        # one-byte floats (an fp8 KV cache) travel as bytes: index ops are defined for those
        self.dtype = torch.uint8 if dtype.itemsize == 1 else dtype
        self.slots = torch.empty(shape, dtype=self.dtype, pin_memory=pin)   # [S, L, 2, bs, H, D]

    @classmethod
    def like(cls, kv_cache, num_slots: int) -> "HostKVCache":
        """A host pool for blocks of `kv_cache` (a KVCache); pinned when it is on CUDA."""
        return cls(num_slots, kv_cache.num_layers, kv_cache.block_size, kv_cache.num_kv_heads,
                   kv_cache.head_dim, kv_cache.layers[0].dtype, pin=kv_cache.device.type == "cuda")

    @staticmethod
    def bytes_per_slot(kv_cache) -> int:
        layer = kv_cache.layers[0]
        return kv_cache.num_layers * layer[:, 0].numel() * layer.element_size()

    @property
    def nbytes(self) -> int:
        return self.slots.numel() * self.slots.element_size()

    def swap_out(self, layers: Sequence[torch.Tensor], pairs: Sequence[tuple[int, int]]) -> None:
        """host slot <- device block for each (device block, host slot); slots distinct."""
        if not pairs:
            return
        layers = self._raw(layers)
        self._check(layers, pairs, 1, 0)
        dev = layers[0].device
        for c in range(0, len(pairs), CHUNK):
            chunk = pairs[c:c + CHUNK]
            blocks = to_device(torch.tensor([b for b, _ in chunk], dtype=torch.int64), dev)
            slots = [s for _, s in chunk]
            if dev.type == "cpu":
                idx = torch.tensor(slots, dtype=torch.int64)
                for i, layer in enumerate(layers):          # [2, n, bs, H, D] -> [n, 2, bs, H, D]
                    self.slots[:, i].index_copy_(0, idx, layer.index_select(1, blocks).transpose(0, 1))
                continue
            staging = torch.empty((len(chunk),) + self.slots.shape[1:], dtype=self.slots.dtype, device=dev)
            for i, layer in enumerate(layers):              # staging[:, i]: [n, 2, bs, H, D]
                staging[:, i] = layer.index_select(1, blocks).transpose(0, 1)
            for j, s, k in _runs(slots):                    # D2H, one copy per run of slots
                self.slots[s:s + k].copy_(staging[j:j + k], non_blocking=True)

    def swap_in(self, layers: Sequence[torch.Tensor], pairs: Sequence[tuple[int, int]]) -> None:
        """device block <- host slot for each (host slot, device block); blocks distinct."""
        if not pairs:
            return
        layers = self._raw(layers)
        self._check(layers, pairs, 0, 1)
        dev = layers[0].device
        for c in range(0, len(pairs), CHUNK):
            chunk = pairs[c:c + CHUNK]
            slots = [s for s, _ in chunk]
            blocks = to_device(torch.tensor([b for _, b in chunk], dtype=torch.int64), dev)
            if dev.type == "cpu":
                src = self.slots.index_select(0, torch.tensor(slots, dtype=torch.int64))  # [n, L, 2, ...]
                for i, layer in enumerate(layers):
                    layer.index_copy_(1, blocks, src[:, i].transpose(0, 1))
                continue
            staging = torch.empty((len(chunk),) + self.slots.shape[1:], dtype=self.slots.dtype, device=dev)
            for j, s, k in _runs(slots):                    # H2D, one copy per run of slots
                staging[j:j + k].copy_(self.slots[s:s + k], non_blocking=True)
            for i, layer in enumerate(layers):
                layer.index_copy_(1, blocks, staging[:, i].transpose(0, 1))

    def _raw(self, layers: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [t.view(self.dtype) if t.dtype != self.dtype and t.dtype.itemsize == 1 else t for t in layers]

    def _check(self, layers: Sequence[torch.Tensor], pairs, slot_at: int, block_at: int) -> None:
        if len(layers) != self.num_layers:
            raise ValueError(f"the host pool holds {self.num_layers} layers, got {len(layers)}")
        want = self.slots.shape[2:]
        for layer in layers:
            if layer.dim() != 5 or layer.shape[0] != 2 or layer.shape[2:] != want[1:] or layer.dtype != self.slots.dtype:
                raise ValueError(f"a device layer cache must be [2, num_blocks, {', '.join(map(str, want[1:]))}] "
                                 f"{self.slots.dtype}, got {list(layer.shape)} {layer.dtype}")
        nb = layers[0].shape[1]
        for p in pairs:
            s, b = p[slot_at], p[block_at]
            if not (0 <= s < self.num_slots and 0 <= b < nb):
                raise ValueError(f"swap pair {tuple(p)}: host slot must be in [0, {self.num_slots}) "
                                 f"and device block in [0, {nb})")

    def __repr__(self) -> str:
        _, L, _, bs, H, D = self.slots.shape
        return (f"HostKVCache(slots={self.num_slots}, layers={L}, block={bs}x{H}x{D}, {self.slots.dtype}, "
                f"{self.nbytes / 2**30:.2f} GiB, pinned={self.slots.is_pinned()})")


def _runs(slots: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first index, first slot, length) of each run of consecutive slots."""
    out: list[tuple[int, int, int]] = []
    for j, s in enumerate(slots):
        if out and out[-1][1] + out[-1][2] == s:
            j0, s0, k = out[-1]
            out[-1] = (j0, s0, k + 1)
        else:
            out.append((j, s, 1))
    return out


# -- reference twins: one block of one layer at a time --
def swap_out_reference(host: HostKVCache, layers: Sequence[torch.Tensor],
                       pairs: Sequence[tuple[int, int]]) -> None:
    layers = host._raw(layers)
    for b, s in pairs:
        for i, layer in enumerate(layers):
            host.slots[s, i].copy_(layer[:, b].cpu())


def swap_in_reference(host: HostKVCache, layers: Sequence[torch.Tensor],
                      pairs: Sequence[tuple[int, int]]) -> None:
    layers = host._raw(layers)
    for s, b in pairs:
        for i, layer in enumerate(layers):
            layer[:, b].copy_(host.slots[s, i].to(layer.device))

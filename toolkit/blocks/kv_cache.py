"""KVCache: one tensor [2, num_blocks, block_size, num_kv_heads, head_dim] per layer."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


class KVCache:
    """Paged K/V storage of every layer, sized from a block count or a memory budget."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        for name, v in dict(num_layers=num_layers, num_blocks=num_blocks, block_size=block_size,
                            num_kv_heads=num_kv_heads, head_dim=head_dim).items():
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"KVCache {name} must be a positive integer, got {v!r}")
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.num_kv_heads, self.head_dim, self.dtype = num_kv_heads, head_dim, dtype
        self.device = torch.device(device)
        shape = (2, num_blocks, block_size, num_kv_heads, head_dim)
        self.layers: list[torch.Tensor] = [torch.empty(shape, dtype=dtype, device=self.device)
                                           for _ in range(num_layers)]

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * elem

    @classmethod
    def from_budget(cls, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                    budget_bytes: int | None = None, gpu_memory_utilization: float = 0.9,
                    ) -> "KVCache":
        """As many blocks as fit in `budget_bytes`, or in that fraction of free GPU memory."""
        per_block = cls.bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype)
        dev = torch.device(device)
        if budget_bytes is None:
            if dev.type != "cuda":
                raise ValueError("on the CPU a KV-cache budget in bytes is required (budget_bytes)")
            free, _ = torch.cuda.mem_get_info(dev)
            budget_bytes = int(free * gpu_memory_utilization)
        num_blocks = budget_bytes // per_block
        if num_blocks < 2:
            raise ValueError(f"a KV-cache budget of {budget_bytes} bytes holds {num_blocks} blocks of "
                             f"{per_block} bytes; at least 2 are needed")
        log.info("KV cache: %d blocks x %d tokens = %d tokens (%.2f GiB)", num_blocks, block_size,
                 num_blocks * block_size, num_blocks * per_block / 2**30)
        return cls(num_layers, int(num_blocks), block_size, num_kv_heads, head_dim, dtype, dev)

    def __getitem__(self, layer: int) -> torch.Tensor:
        return self.layers[layer]

    def __len__(self) -> int:
        return self.num_layers

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.layers)

    def close(self) -> None:
        """Drop the storage (and return it to the CUDA allocator's pool's owner)."""
        self.layers = []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def __repr__(self) -> str:
        return (f"KVCache(layers={self.num_layers}, blocks={self.num_blocks}x{self.block_size}, "
                f"kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, dtype={self.dtype}, "
                f"{self.nbytes / 2**20:.1f} MiB on {self.device})")

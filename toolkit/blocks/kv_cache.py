"""KVCache: one tensor [2, num_blocks, block_size, num_kv_heads, head_dim] per layer.

An fp8 cache (dtype torch.float8_e4m3fn) holds K / k_scale and V / v_scale with one static
scale per layer for K and one for V (`k_scales`, `v_scales`, float32 values as Python floats):
written by every backend's write_kv, dequantised by its attention. Other dtypes keep 1.0.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

FP8 = torch.float8_e4m3fn

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
        self.k_scales: list[float] = [1.0] * num_layers    # dequantisation scales (fp8 only)
        self.v_scales: list[float] = [1.0] * num_layers
        self.scales_source: str | None = None              # "given", "checkpoint", "calibrated ..."

    @property
    def is_fp8(self) -> bool:
        return self.dtype == FP8

    def scales(self, layer: int) -> tuple[float, float]:
        """(k_scale, v_scale) of a layer: stored value x scale = the model's K / V."""
        return self.k_scales[layer], self.v_scales[layer]

    def set_scales(self, k_scales: Sequence[float], v_scales: Sequence[float],
                   source: str = "given") -> None:
        """Per-layer K and V scales of an fp8 cache (rounded to float32, as the kernels use them)."""
        if not self.is_fp8:
            raise ValueError(f"KV scales apply to a float8_e4m3fn cache; this cache is {self.dtype}")
        k, v = [float(x) for x in k_scales], [float(x) for x in v_scales]
        if len(k) != self.num_layers or len(v) != self.num_layers:
            raise ValueError(f"need one K and one V scale per layer ({self.num_layers}), got "
                             f"{len(k)} and {len(v)}")
        bad = [x for x in k + v if not (math.isfinite(x) and x > 0)]
        if bad:
            raise ValueError(f"KV scales must be finite and > 0, got {bad[0]!r}")
        as32 = lambda xs: torch.tensor(xs, dtype=torch.float32).tolist()
        self.k_scales, self.v_scales = as32(k), as32(v)
        self.scales_source = source

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * elem

    @classmethod
    def from_budget(cls, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                    budget_bytes: int | None = None, gpu_memory_utilization: float = 0.9,
                    activation_peak: int = 0) -> "KVCache":
        """As many blocks as fit in `budget_bytes`, or in that fraction of free GPU memory
        (less where a step's activations, `activation_peak` bytes, would not fit beside it:
        worker/memory_profile.py)."""
        per_block = cls.bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype)
        dev = torch.device(device)
        if budget_bytes is None:
            if dev.type != "cuda":
                raise ValueError("on the CPU a KV-cache budget in bytes is required (budget_bytes)")
            from toolkit.worker.memory_profile import kv_budget_bytes

            free, _ = torch.cuda.mem_get_info(dev)
            budget_bytes = kv_budget_bytes(free, gpu_memory_utilization, activation_peak)
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
        scales = ""
        if self.is_fp8:
            scales = (f", k_scale {min(self.k_scales):.3g}..{max(self.k_scales):.3g}, v_scale "
                      f"{min(self.v_scales):.3g}..{max(self.v_scales):.3g}")
        return (f"KVCache(layers={self.num_layers}, blocks={self.num_blocks}x{self.block_size}, "
                f"kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, dtype={self.dtype}{scales}, "
                f"{self.nbytes / 2**20:.1f} MiB on {self.device})")

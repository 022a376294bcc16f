"""Launch configurations of the paged-attention kernel, by dtype, head size and GQA group.

Chosen from measurements on an H200 (`python -m benchmarks attention`); under Triton's CPU
interpreter small tiles keep tests fast and make every masked/unmasked loop path run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolkit.attention.schedule import TileConfig


@dataclass(frozen=True)
class KernelConfig:
    decode: TileConfig
    prefill: TileConfig
    target_programs: int      # split decode KV until this many programs run (0: never split)
    min_split_tokens: int     # fewest keys per split
    prefill_long: TileConfig | None = None   # prefill tiles when some prefill row sees many keys
    long_prefill_keys: int = 2048             # ... at least this many
    max_splits: int = 0                       # most parts of one decode sequence (0: no cap)
    busy_min_split_tokens: int = 0            # fewest keys per split once the unsplit programs
                                              # reach half of target_programs (0: min_split_tokens)
    decode_many: TileConfig | None = None     # decode tiles when a launch has many programs ...
    many_programs: int = 0                    # ... at least this many (work rows x KV heads)
    # prefills with no cached prefix: causal attention over the step's own K/V with TMA loads
    # (kernels/self_attention.py; block_q = query tokens per tile, one head a program); None: off
    self_prefill: TileConfig | None = None
    # split decode launches merge their partials in the same launch (the last split of a
    # sequence merges; kernels/paged_attention.py) instead of a second merge launch
    fused_merge: bool = True

    def decode_tile(self, programs: int) -> TileConfig:
        """A decode launch's tiles for a grid of `programs` (work rows, splits included, x KV
        heads): with many programs, small 1-warp tiles keep several in flight per SM; with
        few, the wide default tile is faster (H200: `python -m benchmarks attention`)."""
        if self.decode_many is not None and programs >= self.many_programs:
            return self.decode_many
        return self.decode

    def prefill_tile(self, max_prefill_kv_len: int) -> TileConfig:
        """Long key loops amortize a deeper, wider pipeline (H200: `python -m benchmarks attention`)."""
        if self.prefill_long is not None and max_prefill_kv_len >= self.long_prefill_keys:
            return self.prefill_long
        return self.prefill

    def __post_init__(self) -> None:
        tiles = [("decode", self.decode), ("prefill", self.prefill)]
        if self.prefill_long is not None:
            tiles.append(("prefill_long", self.prefill_long))
        if self.self_prefill is not None and self.self_prefill.block_q % self.self_prefill.block_n:
            raise ValueError(f"self_prefill's block_q must be a multiple of its block_n, got "
                             f"{self.self_prefill}")
        if self.decode_many is not None:
            tiles.append(("decode_many", self.decode_many))
            if self.decode_many.block_q != self.decode.block_q:
                raise ValueError(f"decode_many must keep decode's block_q ({self.decode.block_q}): the "
                                 f"schedule's decode class is built with it; got {self.decode_many}")
        for name, t in tiles:
            if t.block_q < 1 or t.block_n < 16 or t.block_n & (t.block_n - 1):
                raise ValueError(f"{name} tile needs block_q >= 1 and block_n a power of two "
                                 f">= 16, got {t}")
        if self.min_split_tokens < 1:
            raise ValueError(f"min_split_tokens must be >= 1, got {self.min_split_tokens}")
        if self.max_splits < 0 or self.busy_min_split_tokens < 0:
            raise ValueError(f"max_splits and busy_min_split_tokens must be >= 0 (0: off), got "
                             f"{self.max_splits} and {self.busy_min_split_tokens}")


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def default_config(dtype: torch.dtype, head_dim: int, group: int, device: torch.device) -> KernelConfig:
    """Rows per program: decode max(16, G_pad) (one token of every head of the group);
    prefill about 128 rows (64 for fp32 or head_dim 256, for registers and shared memory)."""
    g_pad = _pow2(group)
    if device.type != "cuda":   # interpreter: small tiles, several steps and splits even at tiny shapes
        dec = TileConfig(block_q=max(1, 16 // g_pad), block_n=16, num_warps=4, num_stages=1)
        pre = TileConfig(block_q=max(1, 32 // g_pad), block_n=16, num_warps=4, num_stages=1)
        long = TileConfig(block_q=max(1, 16 // g_pad), block_n=32, num_warps=4, num_stages=1)
        many = TileConfig(block_q=dec.block_q, block_n=16, num_warps=1, num_stages=1)
        own = TileConfig(block_q=32, block_n=16, num_warps=4, num_stages=1)
        return KernelConfig(dec, pre, target_programs=8, min_split_tokens=16, prefill_long=long,
                            long_prefill_keys=96, decode_many=many, many_programs=12,
                            self_prefill=own)
    return gpu_config(dtype, head_dim, group, torch.cuda.get_device_properties(device).multi_processor_count)


def gpu_config(dtype: torch.dtype, head_dim: int, group: int, sms: int) -> KernelConfig:
    """default_config on a GPU of `sms` streaming multiprocessors."""
    g_pad, d_pad = _pow2(group), _pow2(head_dim)
    wide = dtype == torch.float32 or d_pad > 128
    if wide:    # 4-byte elements or head_dim 256: smaller tiles for shared memory and registers
        dec = TileConfig(block_q=max(1, 16 // g_pad), block_n=32, num_warps=4, num_stages=2)
        pre = TileConfig(block_q=max(1, 64 // g_pad), block_n=32, num_warps=8 if d_pad > 128 else 4,
                         num_stages=2)
        return KernelConfig(dec, pre, target_programs=4 * sms, min_split_tokens=256)
    # H200, bf16, d128 (tiles chosen with `python -m benchmarks attention`): decode steps of
    # 128 keys, 3 stages, 4 warps (64-key steps left copy bandwidth unused at large batches);
    # prefill 128 rows x 64 keys, 4 warps, and 128 keys with 8 warps when rows see >= 2048 keys
    # (the long loop amortizes the deeper pipeline). Splits: at most 32 per sequence, and >= 512
    # keys once the batch alone makes half the target's programs (schedule.split_size says
    # why). Decode launches of >= 3 programs per SM take 1-warp tiles of 32 keys x 4 stages:
    # several programs in flight per SM hide memory latency better than one wide one, split
    # launches included (whose variant TritonPagedAttention.warm_up compiles); with few
    # programs the wide tile is faster.
    dec = TileConfig(block_q=max(1, 16 // g_pad), block_n=128, num_warps=4, num_stages=3)
    many = TileConfig(block_q=dec.block_q, block_n=32, num_warps=1, num_stages=4)
    pre = TileConfig(block_q=max(1, 128 // g_pad), block_n=64, num_warps=4, num_stages=3)
    long = TileConfig(block_q=max(1, 128 // g_pad), block_n=128, num_warps=8, num_stages=3)
    # A prefill with no cached prefix: TMA tiles of 64 query tokens x 64 keys, 4 warps, 3 stages
    # (1x4096 causal, 8B heads: 458 TFLOP/s, 0.87x cuDNN, vs 291 for the paged gathers)
    own = TileConfig(block_q=64, block_n=64, num_warps=4, num_stages=3)
    return KernelConfig(dec, pre, target_programs=4 * sms, min_split_tokens=256, prefill_long=long,
                        max_splits=32, busy_min_split_tokens=512, decode_many=many,
                        many_programs=3 * sms, self_prefill=own)

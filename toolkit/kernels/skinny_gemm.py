"""x @ W^T for few rows (Triton): a decode step's projections, split along K.

A decode step's GEMMs have few rows (its batch) and read their weights once, so they are
bandwidth work, but cuBLAS runs the small ones far from that: on the H200, Qwen3-0.6B's four
projections at 16-256 rows take 5-8 us each against a floor of 1-4 us (0.67 ms of a 1.7 ms
batch-16 step; `benchmarks/gemm_blas.py`, RESULTS engine core (p)). With N = 1024 output
columns (o_proj, down_proj) cuBLAS has a few dozen output tiles for 132 SMs, each looping over
all of K.

Here a program owns one output tile and one of `split` slices of K, so the grid reaches a
couple of programs per SM whatever N is. Two tile orientations:
- SWAP (for few rows): the program computes W_tile [BN, BK] @ x_tile^T [BK, BM] -> [BN, BM],
  so the weights are the MMA's 64-row operand (one Hopper warpgroup's wgmma) and the step's
  few tokens its narrow side (16-64), where x @ W^T would give the MMA a 16-row tile;
- plain: x_tile [BM, BK] @ W_tile^T -> [BM, BN], for 64+ rows.
With split > 1 each program stores its fp32 partial tile, counts itself done on the tile's
counter, and the tile's last program to finish adds the partials in split order (so the result
does not depend on which program finishes last: deterministic), writes the output and resets
the counter to zero for the next launch (the fused merge of kernels/paged_attention.py, the
same semaphore). The counters live in the `SkinnyLinear` object that launches the kernel, kept
zero between launches, so a CUDA graph can capture it.

The reference twin is `torch.nn.functional.linear` (fp32 accumulation, one rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _skinny_gemm_kernel(x_ptr, w_ptr, out_ptr, part_ptr, count_ptr, M, N, K, k_split, split,
                        stride_xm, stride_wn, stride_om,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        SPLIT: tl.constexpr, SWAP: tl.constexpr, EVEN_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm                 # [BM, 1]
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn                 # [BN, 1]
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    for k in range(k_lo, k_hi, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        if EVEN_K:                                  # K % BLOCK_K == 0: only rows are masked
            x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None], other=0.0)          # [BM, BK]
            w = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None], other=0.0)          # [BN, BK]
        else:
            k_ok = offs_k < K
            x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if SWAP:
            acc = tl.dot(w, tl.trans(x), acc)       # [BN, BM]
        else:
            acc = tl.dot(x, tl.trans(w), acc)       # [BM, BN]
    if SWAP:                                        # element (n, m) of the tile
        o_mask = n_ok[:, None] & m_ok[None, :]
        o_off = offs_m[None, :].to(tl.int64) * stride_om + offs_n[:, None]
        mn = offs_m[None, :].to(tl.int64) * N + offs_n[:, None]               # [BN, BM] in [M, N]
    else:
        o_mask = m_ok[:, None] & n_ok[None, :]
        o_off = offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        mn = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]               # [BM, BN] in [M, N]
    if not SPLIT:
        tl.store(out_ptr + o_off, acc.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        tile = pid_m * tl.num_programs(0) + pid_n
        tl.store(part_ptr + pid_k.to(tl.int64) * M * N + mn, acc, mask=o_mask)
        # every thread's partial is stored before one thread's release; acquire for the loads
        tl.debug_barrier()
        done = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if done == split - 1:                       # the tile's last split: add them in order
            total = tl.load(part_ptr + mn, mask=o_mask, other=0.0)
            for s in range(1, split):
                total += tl.load(part_ptr + (s * M).to(tl.int64) * N + mn, mask=o_mask, other=0.0)
            tl.store(out_ptr + o_off, total.to(out_ptr.dtype.element_ty), mask=o_mask)
            tl.store(count_ptr + tile, 0)           # ready for the next launch


@dataclass(frozen=True)
class SkinnyConfig:
    """One launch's tiles. block_m: tokens a tile; block_n: output columns a tile; block_k: K a
    step; split: slices of K (each k_split long, a multiple of block_k); swap: weights as the
    MMA's wide operand (see the module doc)."""

    block_m: int
    block_n: int
    block_k: int
    split: int
    k_split: int
    num_warps: int
    num_stages: int
    swap: bool = False

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        return (triton.cdiv(n, self.block_n), self.split, triton.cdiv(m, self.block_m))


def split_for(tiles: int, k: int, block_k: int, programs: int, min_steps: int = 2) -> tuple[int, int]:
    """(split, k_split): K cut so that tiles x split reaches about `programs`, each slice at
    least `min_steps` K steps long, and no slice empty."""
    steps = triton.cdiv(k, block_k)
    split = max(1, min(triton.cdiv(programs, tiles), steps // min_steps))
    k_split = triton.cdiv(steps, split) * block_k
    return triton.cdiv(k, k_split), k_split


def make_config(m: int, n: int, k: int, *, block_n: int, block_k: int, programs: int, num_warps: int,
                num_stages: int, swap: bool, block_m: int | None = None) -> SkinnyConfig:
    """A config whose split reaches about `programs` programs; block_m defaults to the rows
    rounded up to a power of two (16 at least, 64 at most)."""
    if block_m is None:
        block_m = min(64, max(16, triton.next_power_of_2(m)))
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    split, k_split = split_for(tiles, k, block_k, programs)
    return SkinnyConfig(block_m, block_n, block_k, split, k_split, num_warps, num_stages, swap)


def skinny_config(m: int, n: int, k: int, sms: int) -> SkinnyConfig:
    """Default tiles: swapped 64-column weight tiles for up to 64 rows, plain 64 x 64 tiles
    above; 128 of K a step; K split to about two programs per SM."""
    if m <= 64:
        return make_config(m, n, k, block_n=64, block_k=128, programs=2 * sms, num_warps=4,
                           num_stages=4, swap=True)
    return make_config(m, n, k, block_n=64, block_k=64, programs=2 * sms, num_warps=4, num_stages=4,
                       swap=False)


class SkinnyLinear:
    """F.linear's signature; x [M, K] with M <= max_rows, 16-bit, no bias, on CUDA (or under
    TRITON_INTERPRET=1) takes the split-K kernel, anything else F.linear. Holds the split
    tiles' counters (zero between launches) for its device."""

    MAX_TILES = 16384           # counters: an 8B gate_up at 64 rows has 3584 tiles

    def __init__(self, max_rows: int = 64, sms: int | None = None) -> None:
        self.max_rows, self._sms = max_rows, sms
        self._counters: torch.Tensor | None = None

    def eligible(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        return (bias is None and x.dim() == 2 and 0 < x.shape[0] <= self.max_rows
                and x.dtype in (torch.float16, torch.bfloat16) and weight.dtype == x.dtype
                and x.stride(-1) == 1 and weight.stride(-1) == 1 and x.device == weight.device)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if not self.eligible(x, weight, bias):
            return F.linear(x, weight, bias)
        return self.gemm(x, weight)

    def gemm(self, x: torch.Tensor, weight: torch.Tensor, cfg: SkinnyConfig | None = None, *,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] @ weight[N, K]^T -> [M, N] in x's dtype, written into `out` when given
        (contiguous rows); cfg: the tiles (default skinny_config)."""
        (m, k), n = x.shape, weight.shape[0]
        if weight.shape[1] != k:
            raise ValueError(f"x is [{m}, {k}] but weight is {tuple(weight.shape)}; weight must be [N, {k}]")
        if out is not None and (out.shape != (m, n) or out.dtype != x.dtype or out.stride(-1) != 1):
            raise ValueError(f"out must be [{m}, {n}] {x.dtype} with a contiguous last dim, got "
                             f"{tuple(out.shape)} {out.dtype}")
        if cfg is None:
            cfg = skinny_config(m, n, k, self._sm_count(x.device))
        if cfg.split * cfg.k_split < k or (cfg.split - 1) * cfg.k_split >= k or cfg.k_split % cfg.block_k:
            raise ValueError(f"split {cfg.split} x k_split {cfg.k_split} must cover K = {k} with no empty "
                             f"slice, k_split a multiple of block_k {cfg.block_k}")
        counters = self._counters_for(x.device)
        if cfg.split > 1 and triton.cdiv(n, cfg.block_n) * triton.cdiv(m, cfg.block_m) > counters.numel():
            cfg = SkinnyConfig(cfg.block_m, cfg.block_n, cfg.block_k, 1, triton.cdiv(k, cfg.block_k) * cfg.block_k,
                               cfg.num_warps, cfg.num_stages, cfg.swap)     # more tiles than counters: no split
        if out is None:
            out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        part = out                                  # a placeholder when nothing is split
        if cfg.split > 1:
            part = torch.empty(cfg.split, m, n, dtype=torch.float32, device=x.device)
        _skinny_gemm_kernel[cfg.grid(m, n)](
            x, weight, out, part, counters, m, n, k, cfg.k_split, cfg.split,
            x.stride(0), weight.stride(0), out.stride(0),
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT=cfg.split > 1,
            SWAP=cfg.swap, EVEN_K=k % cfg.block_k == 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return out

    def _sm_count(self, device: torch.device) -> int:
        if self._sms is None:
            self._sms = (torch.cuda.get_device_properties(device).multi_processor_count
                         if device.type == "cuda" else 8)
        return self._sms

    def _counters_for(self, device: torch.device) -> torch.Tensor:
        """The tiles' counters, zero between launches: made once (a CUDA graph bakes in their
        address, so they are never reallocated); a launch with more tiles does not split."""
        if self._counters is None or self._counters.device != device:
            self._counters = torch.zeros(self.MAX_TILES, dtype=torch.int32, device=device)
        return self._counters

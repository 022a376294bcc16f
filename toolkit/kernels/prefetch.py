"""Software prefetch for loops that stream a row block by block (Triton).

A program that loads a block and then works on it has one block's read outstanding at a time,
and with a few programs an SM that is too little to cover the memory latency (measured: the
split kernels ran at about 1.3 TB/s of the H200's 4). Loading the next block(s) before the
current block's work keeps PREFETCH more reads in flight, in registers:

    xa, xb = _load_ahead(row_ptr, start0, end0, BLOCK, PREFETCH)
    for start in range(start0, end0, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x, xa, xb = _next_block(row_ptr, cols, end0, xa, xb, BLOCK, PREFETCH)

Values are float32 (bf16 / fp16 rows converted on load); lanes at or past end0 read -inf.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _load_ahead(row_ptr, start, end0, BLOCK: tl.constexpr, PREFETCH: tl.constexpr):
    """The blocks at start and start + BLOCK, loaded before the loop that reads them
    (PREFETCH of them; the others are placeholders, never read)."""
    cols = start + tl.arange(0, BLOCK)
    xa = tl.zeros([BLOCK], dtype=tl.float32)
    xb = tl.zeros([BLOCK], dtype=tl.float32)
    if PREFETCH >= 1:
        xa = tl.load(row_ptr + cols, mask=cols < end0, other=float("-inf")).to(tl.float32)
    if PREFETCH >= 2:
        xb = tl.load(row_ptr + cols + BLOCK, mask=cols + BLOCK < end0,
                     other=float("-inf")).to(tl.float32)
    return xa, xb


@triton.jit
def _next_block(row_ptr, cols, end0, xa, xb, BLOCK: tl.constexpr, PREFETCH: tl.constexpr):
    """The block at cols, and the PREFETCH blocks after it in flight (their loads issued
    before this block's work, so each program keeps more of the row's reads outstanding)."""
    if PREFETCH == 0:
        x = tl.load(row_ptr + cols, mask=cols < end0, other=float("-inf")).to(tl.float32)
    elif PREFETCH == 1:
        x = xa
        ahead = cols + BLOCK
        xa = tl.load(row_ptr + ahead, mask=ahead < end0, other=float("-inf")).to(tl.float32)
    else:
        x = xa
        xa = xb
        ahead = cols + 2 * BLOCK
        xb = tl.load(row_ptr + ahead, mask=ahead < end0, other=float("-inf")).to(tl.float32)
    return x, xa, xb

"""The k-th largest logit of selected rows (Triton): the top-k cut, without a sort.

Two ways, both exact (bit-equal to torch.topk(k).values[-1]; twin `reference_sampling.kth_largest`):

Group filter (`kth_largest`, when k is small next to V, the usual top-k): cut each row into
groups of G tokens and take each group's max. The k-th largest group max T is a lower bound of
the answer (the top k group maxima are k distinct tokens >= T), and fewer than k groups hold a
token above T, so fewer than k * G tokens lie strictly above it. One pass writes the group
maxima; a second reads only the groups whose max is above T and gathers their tokens > T into a
short buffer (a slot each, by atomics); the k-th largest of that buffer is the answer, or T
itself when fewer than k lie above it (ties at T). The two short selections (T, then the
answer) are the radix select below run by one program a row over memory (`_kth_in_memory`).

Radix select (`kth_largest_radix`, any k): a float32's bits map to an unsigned key of the
same order, and the k-th largest key is found one byte at a time, most significant first.
Pass p (of 4) counts, in a 256-bin histogram, byte p of every key whose bytes before p match
the ones found so far; the bin where the count from the top reaches k is byte p of the answer.
Each row is cut into chunks of `chunk` tokens, one program each, adding its histogram into the
row's with atomics (counts are integers: the order of the additions does not matter). A pass
first replays the passes before it from their histograms, the same way in every program. Ties
need nothing special: the k-th largest key is the one where the count reaches k, duplicates
included, as in torch.topk(k).values[-1].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _key(x):
    """float32 -> uint32 of the same order (negative floats: all bits flipped)."""
    bits = x.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) == 0, bits | 0x80000000, ~bits)


@triton.jit
def _unkey(key):
    """The inverse of `_key`: uint32 -> float32."""
    bits = tl.where((key >> 31) == 1, key ^ 0x80000000, ~key)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _pick(h, k, prefix):
    """One radix pass decided: h int32 [256] the pass's histogram with bins high to low
    (bin i = byte 255 - i). -> (prefix with the answer's byte appended, k within it)."""
    bins = tl.arange(0, 256)
    i = tl.sum((tl.cumsum(h, axis=0) < k).to(tl.int32), axis=0)           # first bin reaching k
    k = k - tl.sum(tl.where(bins < i, h, 0), axis=0)                      # minus those above
    return (prefix << 8) | (255 - i).to(tl.uint32), k


@triton.jit
def _replay(hist_ptr, r, n_sel, k, PASSES: tl.constexpr):
    """(prefix of the answer's key, its first PASSES bytes; k within that prefix)."""
    prefix = tl.full([], 0, tl.uint32)
    bins = tl.arange(0, 256)
    for p in tl.static_range(PASSES):
        h = tl.load(hist_ptr + (p * n_sel + r) * 256 + 255 - bins)       # bins high to low
        prefix, k = _pick(h, k, prefix)
    return prefix, k


@triton.jit
def _pass_kernel(x_ptr, stride, n_cols, rows_ptr, top_k_ptr, hist_ptr, n_sel, chunk,
                 PASS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    split = tl.program_id(1)
    row = tl.load(rows_ptr + r).to(tl.int64)
    k = tl.load(top_k_ptr + row).to(tl.int32)
    prefix, _ = _replay(hist_ptr, r, n_sel, k, PASS)
    start0 = split * chunk
    end0 = tl.minimum(start0 + chunk, n_cols)
    counts = tl.zeros([256], dtype=tl.int32)
    for start in range(start0, end0, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        key = _key(tl.load(x_ptr + row * stride + cols, mask=cols < end0, other=0.0))
        match = cols < end0
        if PASS > 0:
            match = match & ((key >> (32 - 8 * PASS)) == prefix)
        digit = tl.where(match, (key >> (24 - 8 * PASS)) & 0xFF, 0).to(tl.int32)
        counts += tl.histogram(digit, 256)
        # the lanes that do not match were counted in bin 0: take them out
        counts -= tl.where(tl.arange(0, 256) == 0, tl.sum((~match).to(tl.int32), axis=0), 0)
    tl.atomic_add(hist_ptr + (PASS * n_sel + r) * 256 + tl.arange(0, 256), counts)


@triton.jit
def _answer_kernel(rows_ptr, top_k_ptr, hist_ptr, n_sel, out_ptr):
    r = tl.program_id(0)
    row = tl.load(rows_ptr + r).to(tl.int64)
    key, _ = _replay(hist_ptr, r, n_sel, tl.load(top_k_ptr + row).to(tl.int32), 4)
    tl.store(out_ptr + row, _unkey(key))


def _prepare(x: torch.Tensor, top_k: torch.Tensor, rows: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the output float32 [N] of -inf, rows int64 contiguous, top_k contiguous)."""
    return (torch.full((x.shape[0],), float("-inf"), device=x.device),
            rows.to(torch.int64).contiguous(), top_k.contiguous())


def kth_largest_radix(x: torch.Tensor, top_k: torch.Tensor, rows: torch.Tensor, max_k: int,
                      *, chunk: int = 8192, block: int = 1024) -> torch.Tensor:
    """`kth_largest` by radix select, for any k: five launches, four reading the listed rows.
    max_k is unused here (the twin's torch.topk width; kept for one signature)."""
    assert x.dim() == 2 and x.dtype == torch.float32 and x.stride(1) == 1
    if block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    n, v = x.shape
    out, rows, top_k = _prepare(x, top_k, rows)
    sel = rows.numel()
    if sel == 0:
        return out
    block = min(block, triton.next_power_of_2(v))
    chunk = triton.cdiv(max(chunk, block), block) * block
    hist = torch.zeros(4, sel, 256, dtype=torch.int32, device=x.device)
    for p in range(4):
        _pass_kernel[(sel, triton.cdiv(v, chunk))](x, x.stride(0), v, rows, top_k, hist, sel,
                                                   chunk, PASS=p, BLOCK=block)
    _answer_kernel[(sel,)](rows, top_k, hist, sel, out)
    return out


@triton.jit
def _kth_in_memory(ptr, n, k, BLOCK: tl.constexpr):
    """The k-th largest of ptr[0:n] (1 <= k <= n): the radix select above, one program,
    four passes of BLOCK-wide histograms over the n values."""
    prefix = tl.full([], 0, tl.uint32)
    bins = tl.arange(0, 256)
    for p in tl.static_range(4):
        h = tl.zeros([256], dtype=tl.int32)
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            key = _key(tl.load(ptr + offs, mask=offs < n, other=0.0))
            match = offs < n
            if p > 0:
                match = match & ((key >> (32 - 8 * p)) == prefix)
            # bins high to low: bin 255 - digit; lanes that do not match were counted in bin 0
            rev = tl.where(match, 255 - ((key >> (24 - 8 * p)) & 0xFF), 0).to(tl.int32)
            h += tl.histogram(rev, 256) - tl.where(bins == 0, tl.sum((~match).to(tl.int32), axis=0), 0)
        prefix, k = _pick(h, k, prefix)
    return _unkey(prefix)


@triton.jit
def _group_max_kernel(x_ptr, stride, n_cols, rows_ptr, gmax_ptr, n_groups, count_ptr,
                      G: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    blk = tl.program_id(1)
    row = tl.load(rows_ptr + r).to(tl.int64)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=float("-inf"))
    gmax = tl.max(tl.reshape(x, (BLOCK // G, G)), axis=1)                 # [BLOCK / G]
    groups = blk * (BLOCK // G) + tl.arange(0, BLOCK // G)
    tl.store(gmax_ptr + r * n_groups + groups, gmax, mask=groups < n_groups)
    if blk == 0:
        tl.store(count_ptr + r, 0)                            # the gather's counter, zeroed


@triton.jit
def _floor_kernel(gmax_ptr, n_groups, rows_ptr, top_k_ptr, floor_ptr, BLOCK: tl.constexpr):
    """T = the k-th largest group max (-inf when k exceeds the number of groups)."""
    r = tl.program_id(0)
    k = tl.load(top_k_ptr + tl.load(rows_ptr + r)).to(tl.int32)
    t = _kth_in_memory(gmax_ptr + r * n_groups, n_groups, tl.minimum(k, n_groups), BLOCK)
    tl.store(floor_ptr + r, tl.where(k > n_groups, float("-inf"), t))


@triton.jit
def _gather_above_kernel(x_ptr, stride, n_cols, rows_ptr, gmax_ptr, n_groups, floor_ptr,
                         count_ptr, cand_ptr, cap, G: tl.constexpr, BLOCK: tl.constexpr):
    """The tokens > T of this block's groups into the row's buffer; only groups whose max
    is above T are read (fewer than k of the row's groups)."""
    r = tl.program_id(0)
    blk = tl.program_id(1)
    t = tl.load(floor_ptr + r)
    groups = blk * (BLOCK // G) + tl.arange(0, BLOCK // G)
    hot = tl.load(gmax_ptr + r * n_groups + groups, mask=groups < n_groups,
                  other=float("-inf")) > t                                 # [BLOCK / G]
    if tl.max(hot.to(tl.int32), axis=0) > 0:
        row = tl.load(rows_ptr + r).to(tl.int64)
        cols = tl.reshape(groups[:, None] * G + tl.arange(0, G)[None, :], (BLOCK,))
        read = tl.reshape(tl.broadcast_to(hot[:, None], (BLOCK // G, G)), (BLOCK,)) & (cols < n_cols)
        x = tl.load(x_ptr + row * stride + cols, mask=read, other=float("-inf"))
        above = x > t
        # a slot per token above T (fewer than k * G of them: no scan, no contention to speak of)
        slot = tl.atomic_add(count_ptr + r + tl.zeros([BLOCK], tl.int32), 1, mask=above)
        tl.store(cand_ptr + r * cap + slot, x, mask=above)


@triton.jit
def _answer_small_kernel(rows_ptr, top_k_ptr, floor_ptr, count_ptr, cand_ptr, cap, out_ptr,
                         BLOCK: tl.constexpr):
    r = tl.program_id(0)
    row = tl.load(rows_ptr + r).to(tl.int64)
    k = tl.load(top_k_ptr + row).to(tl.int32)
    n = tl.load(count_ptr + r)
    kth = tl.load(floor_ptr + r)                              # fewer than k above T: T
    if n >= k:
        kth = _kth_in_memory(cand_ptr + r * cap, n, k, BLOCK)
    tl.store(out_ptr + row, kth)


def _group_size(max_k: int, limit: int) -> int | None:
    """The largest G in 256 .. 16 with max_k * G <= limit (None: none): G tokens a group."""
    for g in (256, 128, 64, 32, 16):
        if max_k * g <= limit:
            return g
    return None


def kth_largest(x: torch.Tensor, top_k: torch.Tensor, rows: torch.Tensor, max_k: int,
                *, block: int = 4096, limit: int = 32768, select_block: int = 1024) -> torch.Tensor:
    """float32 [N]: the top_k[r]-th largest value of x[r] for r in rows (-inf elsewhere).

    x float32 [N, V] (rows contiguous); top_k int [N], 1 <= top_k[r] <= V for r in rows;
    rows int64 [R]; max_k >= the largest top_k among them. The group filter (one read of the
    listed rows, then of the groups above T; four launches) when max_k * G <= `limit` (the
    most tokens one program may have to select from) for a group size G in 256 .. 16;
    otherwise `kth_largest_radix`. select_block: the lanes of those one-program selections.
    """
    assert x.dim() == 2 and x.dtype == torch.float32 and x.stride(1) == 1
    n, v = x.shape
    g = _group_size(max_k, limit)
    if g is None:
        return kth_largest_radix(x, top_k, rows, max_k)
    if block & (block - 1) or block < g:
        raise ValueError(f"block must be a power of two >= {g}, got {block}")
    out, rows, top_k = _prepare(x, top_k, rows)
    sel = rows.numel()
    if sel == 0:
        return out
    block = min(block, max(g, triton.next_power_of_2(v)))
    n_groups = triton.cdiv(v, g)
    cap = min(max_k * g, v)                            # > the tokens above T: (k - 1) * G
    f32 = torch.empty(sel * (n_groups + cap + 1), device=x.device)
    gmax, cand, floor = f32[:sel * n_groups], f32[sel * n_groups:-sel], f32[-sel:]
    count = torch.empty(sel, dtype=torch.int32, device=x.device)
    grid = (sel, triton.cdiv(v, block))
    _group_max_kernel[grid](x, x.stride(0), v, rows, gmax, n_groups, count, G=g, BLOCK=block)
    _floor_kernel[(sel,)](gmax, n_groups, rows, top_k, floor, BLOCK=select_block)
    _gather_above_kernel[grid](x, x.stride(0), v, rows, gmax, n_groups, floor, count, cand, cap,
                               G=g, BLOCK=block)
    _answer_small_kernel[(sel,)](rows, top_k, floor, count, cand, cap, out, BLOCK=select_block)
    return out

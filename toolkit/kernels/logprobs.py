"""Logprobs of the sampled tokens, their ranks and the top-k alternatives, rows split (Triton).

The raw log_softmax without writing it: each row is cut into chunks, one program each, that
reduce the chunk to its max, its sum of exp(x - max), the count of tokens >= the sampled
token's logit (the rank) and its own top k (lowest id on ties). The program keeps per-lane
state through the chunk and reduces across lanes once, at the end: an online max and sum, a
count, and the lane's two best tokens as packed int64 keys (the logit's bits made orderable,
then the id reversed, so one max picks the best value and the lowest id among equals) plus the
best key that is not among them. The chunk's top k is the best k of the lanes' records, exact
unless a left-out key reaches the k-th (a lane holding three of them: rare), and then k exact
passes over the chunk replace it. A second kernel, one program per batch row, merges the
chunks: lse = M + log(sum_c s_c exp(m_c - M)), rank = the counts' sum, the top k = the best k
of the chunks' candidates. Twin: `reference_sampling.gather_logprobs`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.kernels.prefetch import _load_ahead, _next_block

_NO_TOKEN = tl.constexpr(2147483647)
_NONE = tl.constexpr(-9223372036854775808)            # the packed key below every real one


@triton.jit
def _pack(x, cols):
    """int64 keys in the order of (x, then the lower id): x's bits made signed-orderable in the
    high word (-0.0 as +0.0: they compare equal), 2**31 - 1 - id in the low word."""
    bits = tl.where(x == 0.0, 0, x.to(tl.int32, bitcast=True))
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)       # int32 order = float order
    return (ordered.to(tl.int64) << 32) | (2147483647 - cols).to(tl.int64)


@triton.jit
def _unpack(key):
    ordered = (key >> 32).to(tl.int32)
    bits = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), (2147483647 - (key & 0x7FFFFFFF)).to(tl.int32)


@triton.jit
def _row_of(rows_ptr, r, HAS_ROWS: tl.constexpr):
    if HAS_ROWS:
        return tl.load(rows_ptr + r).to(tl.int64)
    return r.to(tl.int64)


@triton.jit
def _source(x_ptr, stride, row, saved_ptr, saved_stride, saved_rows_ptr, n_saved,
            SP: tl.constexpr):
    """The raw logits of `row`: its saved copy when saved_rows lists it (SP >= n_saved; SP = 0:
    none saved), else the logits' row."""
    src = x_ptr + row * stride
    if SP > 0:
        sel = tl.arange(0, SP)
        hit = tl.load(saved_rows_ptr + sel, mask=sel < n_saved, other=-1) == row
        if tl.max(hit.to(tl.int32), axis=0) > 0:
            src = saved_ptr + tl.sum(tl.where(hit, sel, 0), axis=0).to(tl.int64) * saved_stride
    return src


@triton.jit
def _chunk_kernel(x_ptr, stride, n_cols, rows_ptr, tok_ptr, bmax_ptr, bsum_ptr, brank_ptr,
                  bval_ptr, bid_ptr, n_chunks, chunk, saved_ptr, saved_stride, saved_rows_ptr,
                  n_saved, K: tl.constexpr, KP: tl.constexpr, HAS_ROWS: tl.constexpr,
                  SP: tl.constexpr, BLOCK: tl.constexpr, PREFETCH: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1)
    row = _row_of(rows_ptr, r, HAS_ROWS)
    src = _source(x_ptr, stride, row, saved_ptr, saved_stride, saved_rows_ptr, n_saved, SP)
    xt = tl.load(src + tl.load(tok_ptr + row)).to(tl.float32)
    start0 = c * chunk
    end0 = tl.minimum(start0 + chunk, n_cols)
    # per lane through the chunk: max m and sum of exp(x - m) (online), the rank count, the two
    # best packed keys k1 > k2 and the best key k3 either pushed out or never in
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    rank = tl.zeros([BLOCK], dtype=tl.int32)
    k1 = tl.full([BLOCK], _NONE, tl.int64)
    k2 = tl.full([BLOCK], _NONE, tl.int64)
    k3 = tl.full([BLOCK], _NONE, tl.int64)
    xa, xb = _load_ahead(src, start0, end0, BLOCK, PREFETCH)
    for start in range(start0, end0, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        valid = cols < end0
        x, xa, xb = _next_block(src, cols, end0, xa, xb, BLOCK, PREFETCH)
        m_new = tl.maximum(m, x)
        none = m_new == float("-inf")                                    # exp finite
        s = tl.where(none, 0.0, s * tl.exp(m - m_new) + tl.exp(x - m_new))
        m = m_new
        rank += (valid & (x >= xt)).to(tl.int32)
        if K > 0:
            key = tl.where(valid, _pack(x, cols), _NONE)
            gt1 = key > k1
            gt2 = key > k2                                               # k1 > k2: gt1 -> gt2
            k3 = tl.maximum(k3, tl.where(gt2, k2, key))
            k2 = tl.where(gt1, k1, tl.where(gt2, key, k2))
            k1 = tl.where(gt1, key, k1)
    mx = tl.max(m, axis=0)
    out = r * n_chunks + c
    tl.store(bmax_ptr + out, mx)
    tl.store(bsum_ptr + out, tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - mx)), axis=0))
    tl.store(brank_ptr + out, tl.sum(rank, axis=0))
    if K > 0:
        # the chunk's top k: the best of the lanes' two records, k rounds of an int64 max
        top = tl.full([], _NONE, tl.int64)
        for j in tl.static_range(K):
            top = tl.maximum(tl.max(k1, axis=0), tl.max(k2, axis=0))
            _store_top(bval_ptr, bid_ptr, out * KP + j, top)
            k1 = tl.where(k1 == top, _NONE, k1)
            k2 = tl.where(k2 == top, _NONE, k2)
        k3_max = tl.max(k3, axis=0)
        if (k3_max != _NONE) & (k3_max >= top):
            # a lane held three of the chunk's top k (rare): k exact passes, each the best
            # key below the last one (keys are distinct: the id is in them)
            prev = tl.full([], 9223372036854775807, tl.int64)
            for j in tl.static_range(K):
                best = tl.full([BLOCK], _NONE, tl.int64)
                for start in range(start0, end0, BLOCK):
                    cols = start + tl.arange(0, BLOCK)
                    x = tl.load(src + cols, mask=cols < end0, other=float("-inf")).to(tl.float32)
                    key = tl.where(cols < end0, _pack(x, cols), _NONE)
                    best = tl.maximum(best, tl.where(key < prev, key, _NONE))
                prev = tl.max(best, axis=0)
                _store_top(bval_ptr, bid_ptr, out * KP + j, prev)


@triton.jit
def _store_top(bval_ptr, bid_ptr, at, key):
    val, i = _unpack(key)
    tl.store(bval_ptr + at, tl.where(key == _NONE, float("-inf"), val))
    tl.store(bid_ptr + at, tl.where(key == _NONE, _NO_TOKEN, i))


@triton.jit
def _merge_kernel(x_ptr, stride, rows_ptr, n_rows_sel, tok_ptr, bmax_ptr, bsum_ptr, brank_ptr,
                  bval_ptr, bid_ptr, n_blocks, val_out_ptr, id_out_ptr, rank_out_ptr,
                  saved_ptr, saved_stride, saved_rows_ptr, n_saved,
                  K: tl.constexpr, KP: tl.constexpr, KO: tl.constexpr, RP: tl.constexpr,
                  BP: tl.constexpr, HAS_ROWS: tl.constexpr, SP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    if HAS_ROWS:                                       # which listed row is this one, if any
        sel = tl.arange(0, RP)
        listed = tl.load(rows_ptr + sel, mask=sel < n_rows_sel, other=-1) == row
        found = tl.max(listed.to(tl.int32), axis=0) > 0
        r = tl.sum(tl.where(listed, sel, 0), axis=0).to(tl.int64)
    else:
        found = row >= 0
        r = row
    cols = tl.arange(0, KO)                            # the output tile, K + 1 used
    out = cols < K + 1
    if found:
        offs = tl.arange(0, BP)
        live = offs < n_blocks
        bm = tl.load(bmax_ptr + r * n_blocks + offs, mask=live, other=float("-inf"))
        bs = tl.load(bsum_ptr + r * n_blocks + offs, mask=live, other=0.0)
        m = tl.max(bm, axis=0)
        ms = tl.where(m == float("-inf"), 0.0, m)
        bms = tl.where(bm == float("-inf"), 0.0, bm)
        log_z = tl.log(tl.sum(bs * tl.exp(bms - ms), axis=0))           # lse - ms
        tok = tl.load(tok_ptr + row)
        src = _source(x_ptr, stride, row, saved_ptr, saved_stride, saved_rows_ptr, n_saved, SP)
        xt = tl.load(src + tok).to(tl.float32)
        tl.store(rank_out_ptr + row,
                 tl.sum(tl.load(brank_ptr + r * n_blocks + offs, mask=live, other=0), axis=0).to(tl.int64))
        vals = tl.where(cols == 0, (xt - ms) - log_z, 0.0)
        ids = tl.where(cols == 0, tok, 0)
        c = tl.arange(0, BP * KP)
        cand_live = (c // KP < n_blocks) & (c % KP < K)
        cv = tl.load(bval_ptr + r * n_blocks * KP + c, mask=cand_live, other=float("-inf"))
        ci = tl.load(bid_ptr + r * n_blocks * KP + c, mask=cand_live, other=_NO_TOKEN)
        avail = cand_live & (ci != _NO_TOKEN)
        for j in tl.static_range(K):
            cva = tl.where(avail, cv, float("-inf"))
            top = tl.max(cva, axis=0)
            i = tl.min(tl.where(avail & (cva == top), ci, _NO_TOKEN), axis=0)
            vals = tl.where(cols == j + 1, (top - ms) - log_z, vals)
            ids = tl.where(cols == j + 1, i, ids)
            avail = avail & (ci != i)
        tl.store(val_out_ptr + row * (K + 1) + cols, vals, mask=out)
        tl.store(id_out_ptr + row * (K + 1) + cols, ids.to(tl.int64), mask=out)
    else:                                              # a row that did not ask
        tl.store(val_out_ptr + row * (K + 1) + cols, tl.full([KO], float("nan"), tl.float32), mask=out)
        tl.store(id_out_ptr + row * (K + 1) + cols, tl.full([KO], -1, tl.int64), mask=out)
        tl.store(rank_out_ptr + row, 0)


def gather_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, k: int,
                    rows: torch.Tensor | None = None, *, saved: torch.Tensor | None = None,
                    saved_rows: torch.Tensor | None = None, chunk: int = 16384,
                    programs: int = 256, block: int = 512, num_warps: int = 4,
                    prefetch: int = 1, max_k: int = 32
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits float [N, V] (raw), token_ids int64 [N], k >= 0 -> (logprobs float32 [N, k+1],
    ids int64 [N, k+1], ranks int64 [N]).

    Column 0 is the given token, columns 1..k the k most likely tokens (k capped at V; ties
    to the lowest id); rank = #{tokens whose logit >= the given token's}. rows int64 [R]
    (unique): compute only these rows; the others get logprob NaN, id -1, rank 0. saved
    float [S, V] with saved_rows int64 [S] (unique): the raw logits of those rows, read
    instead of logits' rows (which a stage changed in place). Above max_k alternatives
    (k rounds of argmax get slow) the twin's torch path runs instead. Two launches.

    Tuning: rows are cut into chunks of at most `chunk` tokens, shorter when that gives fewer
    than `programs` in all, read `block` tokens at a time (num_warps warps, `prefetch` blocks
    loaded ahead: `kernels.prefetch`).
    """
    n, v = token_ids.shape[0], logits.shape[1]
    k = min(k, v)
    if (saved is None) != (saved_rows is None):
        raise ValueError(f"saved and saved_rows go together (the raw rows, and which rows they "
                         f"are): pass both or neither; got saved={saved is not None}, "
                         f"saved_rows={saved_rows is not None}")
    if prefetch not in (0, 1, 2) or block & (block - 1):
        raise ValueError(f"prefetch must be 0, 1 or 2 and block a power of two; got "
                         f"prefetch={prefetch}, block={block}")
    if k > max_k:
        from toolkit.kernels.reference_sampling import gather_logprobs as twin
        return twin(logits, token_ids, k, rows, saved=saved, saved_rows=saved_rows)
    dev = logits.device
    vals = torch.empty(n, k + 1, dtype=torch.float32, device=dev)
    ids = torch.empty(n, k + 1, dtype=torch.int64, device=dev)
    ranks = torch.empty(n, dtype=torch.int64, device=dev)
    if n == 0:
        return vals, ids, ranks
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    has_rows = rows is not None
    sel = rows.numel() if has_rows else n
    rows_t = rows.to(torch.int64).contiguous() if has_rows else token_ids     # unread if none
    tok = token_ids.contiguous()
    n_saved = saved_rows.numel() if saved_rows is not None else 0
    if n_saved:
        saved = saved if saved.stride(-1) == 1 else saved.contiguous()
        saved_rows = saved_rows.to(torch.int64).contiguous()
    else:
        saved, saved_rows = logits, tok                                       # unread
    sv = (saved, saved.stride(0), saved_rows, n_saved)
    sp = triton.next_power_of_2(n_saved) if n_saved else 0
    block = min(block, triton.next_power_of_2(v))
    # chunks of whole blocks, as long as `chunk` but short enough for `programs` in all
    per_row = triton.cdiv(programs, max(sel, 1))
    chunk = max(block, min(chunk, triton.cdiv(triton.cdiv(v, per_row), block) * block))
    n_chunks = triton.cdiv(v, chunk)
    kp = triton.next_power_of_2(max(k, 1))
    # per (listed row, chunk): max, sum exp, rank count, top-k values / ids
    bmax = torch.empty(max(sel, 1), n_chunks, dtype=torch.float32, device=dev)
    bsum = torch.empty_like(bmax)
    brank = torch.empty(max(sel, 1), n_chunks, dtype=torch.int32, device=dev)
    bval = torch.empty(max(sel, 1), n_chunks, kp, dtype=torch.float32, device=dev)
    bid = torch.empty(max(sel, 1), n_chunks, kp, dtype=torch.int32, device=dev)
    if sel:
        _chunk_kernel[(sel, n_chunks)](logits, logits.stride(0), v, rows_t, tok, bmax, bsum, brank,
                                       bval, bid, n_chunks, chunk, *sv, K=k, KP=kp,
                                       HAS_ROWS=has_rows, SP=sp, BLOCK=block, PREFETCH=prefetch,
                                       num_warps=num_warps)
    _merge_kernel[(n,)](logits, logits.stride(0), rows_t, sel, tok, bmax, bsum, brank, bval, bid,
                        n_chunks, vals, ids, ranks, *sv, K=k, KP=kp,
                        KO=triton.next_power_of_2(k + 1), RP=triton.next_power_of_2(max(sel, 1)),
                        BP=triton.next_power_of_2(n_chunks), HAS_ROWS=has_rows, SP=sp, num_warps=4)
    return vals, ids, ranks

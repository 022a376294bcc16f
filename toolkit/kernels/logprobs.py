"""Logprobs of the sampled tokens, their ranks and the top-k alternatives, rows split (Triton).

The raw log_softmax without writing it: each row is cut into blocks, one program each, that
reduce the block to its max, its sum of exp(x - max), the count of tokens >= the sampled
token's logit (the rank) and its own top k (k rounds of argmax, lowest id on ties). A second
kernel, one program per batch row, merges the blocks: lse = M + log(sum_b s_b exp(m_b - M)),
rank = the counts' sum, the top k = the best k of the blocks' candidates (a block's top k
holds every token of the row's top k that lies in it). Twin: `reference_sampling.gather_logprobs`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_NO_TOKEN = tl.constexpr(2147483647)


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
def _block_kernel(x_ptr, stride, n_cols, rows_ptr, tok_ptr, bmax_ptr, bsum_ptr, brank_ptr,
                  bval_ptr, bid_ptr, n_blocks, saved_ptr, saved_stride, saved_rows_ptr, n_saved,
                  K: tl.constexpr, KP: tl.constexpr, HAS_ROWS: tl.constexpr, SP: tl.constexpr,
                  BLOCK: tl.constexpr):
    r = tl.program_id(0)
    b = tl.program_id(1)
    row = _row_of(rows_ptr, r, HAS_ROWS)
    src = _source(x_ptr, stride, row, saved_ptr, saved_stride, saved_rows_ptr, n_saved, SP)
    xt = tl.load(src + tl.load(tok_ptr + row)).to(tl.float32)
    cols = b * BLOCK + tl.arange(0, BLOCK)
    valid = cols < n_cols
    x = tl.load(src + cols, mask=valid, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    ms = tl.where(m == float("-inf"), 0.0, m)                            # exp finite
    out = r * n_blocks + b
    tl.store(bmax_ptr + out, m)
    tl.store(bsum_ptr + out, tl.sum(tl.exp(x - ms), axis=0))
    tl.store(brank_ptr + out, tl.sum((valid & (x >= xt)).to(tl.int32), axis=0))
    avail = valid
    for j in tl.static_range(K):                                         # the block's top k
        xa = tl.where(avail, x, float("-inf"))
        top = tl.max(xa, axis=0)
        i = tl.min(tl.where(avail & (xa == top), cols, _NO_TOKEN), axis=0)  # none left: _NO_TOKEN
        tl.store(bval_ptr + out * KP + j, top)
        tl.store(bid_ptr + out * KP + j, i)
        avail = avail & (cols != i)


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
                    saved_rows: torch.Tensor | None = None, block: int = 2048,
                    max_k: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits float [N, V] (raw), token_ids int64 [N], k >= 0 -> (logprobs float32 [N, k+1],
    ids int64 [N, k+1], ranks int64 [N]).

    Column 0 is the given token, columns 1..k the k most likely tokens (k capped at V; ties
    to the lowest id); rank = #{tokens whose logit >= the given token's}. rows int64 [R]
    (unique): compute only these rows; the others get logprob NaN, id -1, rank 0. saved
    float [S, V] with saved_rows int64 [S] (unique): the raw logits of those rows, read
    instead of logits' rows (which a stage changed in place). Above max_k alternatives
    (k rounds of argmax get slow) the twin's torch path runs instead. Two launches.
    """
    n, v = token_ids.shape[0], logits.shape[1]
    k = min(k, v)
    if (saved is None) != (saved_rows is None):
        raise ValueError("saved and saved_rows go together: the raw rows and which rows they are")
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
    n_blocks = triton.cdiv(v, block)
    kp = triton.next_power_of_2(max(k, 1))
    # per (listed row, block): max, sum exp, rank count, top-k values / ids
    bmax = torch.empty(max(sel, 1), n_blocks, dtype=torch.float32, device=dev)
    bsum = torch.empty_like(bmax)
    brank = torch.empty(max(sel, 1), n_blocks, dtype=torch.int32, device=dev)
    bval = torch.empty(max(sel, 1), n_blocks, kp, dtype=torch.float32, device=dev)
    bid = torch.empty(max(sel, 1), n_blocks, kp, dtype=torch.int32, device=dev)
    if sel:
        _block_kernel[(sel, n_blocks)](logits, logits.stride(0), v, rows_t, tok, bmax, bsum, brank,
                                       bval, bid, n_blocks, *sv, K=k, KP=kp, HAS_ROWS=has_rows,
                                       SP=sp, BLOCK=block, num_warps=4)
    _merge_kernel[(n,)](logits, logits.stride(0), rows_t, sel, tok, bmax, bsum, brank, bval, bid,
                        n_blocks, vals, ids, ranks, *sv, K=k, KP=kp,
                        KO=triton.next_power_of_2(k + 1), RP=triton.next_power_of_2(max(sel, 1)),
                        BP=triton.next_power_of_2(n_blocks), HAS_ROWS=has_rows, SP=sp, num_warps=4)
    return vals, ids, ranks

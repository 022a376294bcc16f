"""Paged attention over the KV cache (Triton): one kernel for decode rows and prefill chunks.

A program owns one *work item* (a tile of up to BLOCK_Q query tokens of one sequence, and
optionally one split of its keys) for one KV head, and processes all NUM_Q_PER_KV query
heads of that KV head together: its BLOCK_M = BLOCK_Q * G_PAD rows are (token, head) pairs,
so every K/V tile is loaded once per GQA group (what makes decode bandwidth-efficient).

The work table (int32 [W, WORK_COLS], built on the host by toolkit.attention.schedule) holds,
per item: first query row, number of query tokens, position of the first query token, first
entry of the sequence's page list, and the key range split into three parts
[start, full_lo) masked, [full_lo, full_hi) unmasked (every row sees every key), [full_hi, hi)
masked; plus the partial-result row and split index when SPLIT (flash-decoding): then the
program writes its normalized partial output and log-sum-exp, merged later by
toolkit.kernels.merge_attention_states, or, with FUSE_MERGE, in the same launch: each
program counts itself done on its (partial row, KV head) counter, and the sequence's last
split to finish merges the partials and resets the counter to zero for the next launch (one
kernel instead of two; the last split loads up to 16 partials as one tile, so the merge is one
L2 round trip rather than a serial chain of them, which is what made an earlier fused merge
slower than two launches: docs/decisions/0010-split-merge-in-the-decode-launch.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.kernels.reference import check_scales, fuses_merge

WORK_COLS = 10   # columns of the work table, in the order read below

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _attend(
    acc, l_i, m_i, q, q_pos, k_ptr, v_ptr, kv_indices_ptr, page_base, n_lo, n_hi, hi,
    stride_cb, stride_cs, head_off, scale, soft_cap, window,
    MASKED: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    PRECISION: tl.constexpr, KV_FP8: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Online softmax over keys [n_lo, n_hi) in steps of BLOCK_N; acc [M, D_PAD], l_i/m_i [M]
    (m_i in log2 units). MASKED tiles apply the causal (when CAUSAL), window and `< hi` masks."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    for n in range(n_lo, n_hi, BLOCK_N):
        pos = n + offs_n                                                   # [N] key positions
        if MASKED:
            kin = pos < hi
            page = tl.load(kv_indices_ptr + page_base + pos // PAGE, mask=kin, other=0)
        else:
            page = tl.load(kv_indices_ptr + page_base + pos // PAGE)
        slot = page.to(tl.int64) * stride_cb + (pos % PAGE) * stride_cs + head_off   # [N]
        kt_ptrs = k_ptr + slot[None, :] + offs_d[:, None]                  # [D_PAD, N]
        v_ptrs = v_ptr + slot[:, None] + offs_d[None, :]                   # [N, D_PAD]
        if MASKED:
            if D == D_PAD:
                kt = tl.load(kt_ptrs, mask=kin[None, :], other=0.0)
                v = tl.load(v_ptrs, mask=kin[:, None], other=0.0)
            else:
                kt = tl.load(kt_ptrs, mask=kin[None, :] & (offs_d[:, None] < D), other=0.0)
                v = tl.load(v_ptrs, mask=kin[:, None] & (offs_d[None, :] < D), other=0.0)
        else:
            if D == D_PAD:
                kt = tl.load(kt_ptrs)
                v = tl.load(v_ptrs)
            else:
                kt = tl.load(kt_ptrs, mask=offs_d[:, None] < D, other=0.0)
                v = tl.load(v_ptrs, mask=offs_d[None, :] < D, other=0.0)
        if KV_FP8:   # e4m3 -> q's dtype is exact (fp16/bf16/fp32 hold every e4m3 value)
            kt = kt.to(q.dtype)
            v = v.to(q.dtype)
        s = tl.dot(q, kt, input_precision=PRECISION)                       # [M, N] fp32
        if HAS_SOFTCAP:
            # soft_cap * tanh(x / soft_cap), tanh(y) = 1 - 2 / (exp(2y) + 1) (no tanh intrinsic needed)
            y = s * (scale / soft_cap)
            s = soft_cap * (1.0 - 2.0 / (tl.exp2(y * (2.0 * LOG2E)) + 1.0)) * LOG2E
        else:
            s = s * (scale * LOG2E)
        if MASKED:
            if CAUSAL:
                ok = (pos[None, :] <= q_pos[:, None]) & kin[None, :]
            else:                                # bidirectional: every key of the sequence
                ok = (q_pos[:, None] >= 0) & kin[None, :]
            if HAS_WINDOW:
                ok = ok & (pos[None, :] > q_pos[:, None] - window)
            s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))                              # [M]
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)              # rows with no key yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])                                   # [M, N]
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _merge_splits(
    part_out_ptr, part_lse_ptr, out_ptr, part_row, q_start, n_q, n_splits, kvh,
    stride_pr, stride_ph, stride_ps, stride_lr, stride_lh, stride_ot, stride_oh,
    NUM_Q_PER_KV: tl.constexpr, G_PAD: tl.constexpr, S_CHUNK: tl.constexpr, D: tl.constexpr,
    D_PAD: tl.constexpr,
):
    """out[q_start + t, heads of kvh] = the LSE-weighted mean of the n_splits partials of rows
    part_row + t, t < n_q; splits in chunks of S_CHUNK, loaded at once ([G, S, D]: the loads
    of one chunk are in flight together, not one latency per split). Partials come from other
    programs of this launch: loaded .cg (from L2; an SM's L1 is not coherent with them)."""
    offs_g = tl.arange(0, G_PAD)
    offs_s = tl.arange(0, S_CHUNK)
    offs_d = tl.arange(0, D_PAD)
    g_ok = offs_g < NUM_Q_PER_KV
    d_ok = offs_d < D
    head = kvh * NUM_Q_PER_KV + offs_g                                     # [G] query heads
    for t in range(n_q):
        prow = (part_row + t).to(tl.int64)
        m = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
        den = tl.zeros([G_PAD], dtype=tl.float32)
        num = tl.zeros([G_PAD, D_PAD], dtype=tl.float32)
        for s0 in range(0, n_splits, S_CHUNK):
            sp = s0 + offs_s                                               # [S] split index
            ok = g_ok[:, None] & (sp[None, :] < n_splits)                  # [G, S]
            lse = tl.load(part_lse_ptr + prow * stride_lr + head[:, None] * stride_lh + sp[None, :],
                          mask=ok, other=float("-inf"), cache_modifier=".cg")        # [G, S]
            o = tl.load(part_out_ptr + prow * stride_pr + head[:, None, None] * stride_ph
                        + sp[None, :, None] * stride_ps + offs_d[None, None, :],
                        mask=ok[:, :, None] & d_ok[None, None, :], other=0.0,
                        cache_modifier=".cg")                              # [G, S, D]
            m_new = tl.maximum(m, tl.max(lse, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)         # no finite split yet
            alpha = tl.exp(m - m_safe)
            wgt = tl.exp(lse - m_safe[:, None])                            # [G, S]; -inf -> 0
            den = den * alpha + tl.sum(wgt, 1)
            num = num * alpha[:, None] + tl.sum(o * wgt[:, :, None], 1)
            m = m_new
        res = num / tl.where(den > 0.0, den, 1.0)[:, None]
        tl.store(out_ptr + (q_start + t).to(tl.int64) * stride_ot + head[:, None] * stride_oh
                 + offs_d[None, :], res.to(out_ptr.dtype.element_ty),
                 mask=g_ok[:, None] & d_ok[None, :])


# the partial-LSE strides follow the step's split count (S, H * S): not specialized on, so no
# S compiles a new variant mid-run (they address one scalar store per row and head)
@triton.jit(do_not_specialize=["stride_lr", "stride_lh"])
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, kv_indices_ptr, work_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    merge_rows_ptr, counter_ptr, stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch,
    stride_pr, stride_ph, stride_ps, stride_lr, stride_lh,
    scale, soft_cap, window, v_scale,
    NUM_Q_PER_KV: tl.constexpr, G_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr,
    WORK_COLS: tl.constexpr, KV_FP8: tl.constexpr, F16_MATH: tl.constexpr,
    FUSE_MERGE: tl.constexpr, S_CHUNK: tl.constexpr, CAUSAL: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * G_PAD
    # KV heads on the grid's fast axis: a work row's programs start together and rows start in
    # table order (the schedule puts the most keys first)
    kvh = tl.program_id(0)
    w = tl.program_id(1)
    item = work_ptr + w * WORK_COLS
    q_start = tl.load(item + 0)
    n_q = tl.load(item + 1)
    first_pos = tl.load(item + 2)
    page_base = tl.load(item + 3)
    start = tl.load(item + 4)
    full_lo = tl.load(item + 5)
    full_hi = tl.load(item + 6)
    hi = tl.load(item + 7)

    offs_m = tl.arange(0, BLOCK_M)
    tok = offs_m // G_PAD                                                  # [M] token in tile
    head = kvh * NUM_Q_PER_KV + offs_m % G_PAD                             # [M] query head
    row_ok = (tok < n_q) & (offs_m % G_PAD < NUM_Q_PER_KV)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)          # [M, D_PAD]
    if F16_MATH:   # fp8 KV under bf16 q: attend in fp16 (e4m3 -> fp16 converts natively on Hopper)
        q = q.to(tl.float16)
    q_pos = first_pos + tok                                                # [M]

    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    head_off = kvh * stride_ch
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, q_pos, k_ptr, v_ptr, kv_indices_ptr, page_base,
                            start, full_lo, hi, stride_cb, stride_cs, head_off, scale, soft_cap,
                            window, True, HAS_WINDOW, HAS_SOFTCAP, PAGE, BLOCK_N, D, D_PAD, PRECISION,
                            KV_FP8, CAUSAL)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, q_pos, k_ptr, v_ptr, kv_indices_ptr, page_base,
                            full_lo, full_hi, hi, stride_cb, stride_cs, head_off, scale, soft_cap,
                            window, False, HAS_WINDOW, HAS_SOFTCAP, PAGE, BLOCK_N, D, D_PAD,
                            PRECISION, KV_FP8, CAUSAL)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, q_pos, k_ptr, v_ptr, kv_indices_ptr, page_base,
                            full_hi, hi, hi, stride_cb, stride_cs, head_off, scale, soft_cap,
                            window, True, HAS_WINDOW, HAS_SOFTCAP, PAGE, BLOCK_N, D, D_PAD, PRECISION,
                            KV_FP8, CAUSAL)

    has = l_i > 0.0                                                        # a row of an empty split has none
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    if KV_FP8:
        o = o * v_scale            # V's scale, taken out of the sum over keys (split partials too)
    st_mask = row_ok[:, None] & d_ok[None, :]
    if SPLIT:
        part_row = tl.load(item + 8)
        split = tl.load(item + 9)
        lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) / LOG2E, float("-inf"))
        prow = (part_row + tok).to(tl.int64)
        tl.store(part_out_ptr + prow[:, None] * stride_pr + head[:, None] * stride_ph
                 + split * stride_ps + offs_d[None, :], o, mask=st_mask)
        tl.store(part_lse_ptr + prow * stride_lr + head * stride_lh + split, lse, mask=row_ok)
        if FUSE_MERGE:
            if n_q > 0:                                   # zero rows: a fixed table's padding
                count = counter_ptr + part_row * tl.num_programs(0) + kvh
                # every thread's partials are stored before one thread's release (CUTLASS's
                # semaphore: bar.sync, then a gpu-scope release); acquire for the merge's loads
                tl.debug_barrier()
                done = tl.atomic_add(count, 1, sem="acq_rel", scope="gpu")
                n_splits = tl.load(merge_rows_ptr + 2 * part_row + 1)
                if done == n_splits - 1:                  # the last of the sequence's splits
                    _merge_splits(part_out_ptr, part_lse_ptr, out_ptr, part_row, q_start, n_q,
                                  n_splits, kvh, stride_pr, stride_ph, stride_ps, stride_lr,
                                  stride_lh, stride_ot, stride_oh, NUM_Q_PER_KV, G_PAD, S_CHUNK,
                                  D, D_PAD)
                    tl.store(count, 0)                    # ready for the next launch
    else:
        tl.store(out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=st_mask)


def paged_attention(
    q: torch.Tensor, kv_cache: torch.Tensor, kv_indices: torch.Tensor, work: torch.Tensor,
    out: torch.Tensor, part_out: torch.Tensor | None, part_lse: torch.Tensor | None, *,
    scale: float, soft_cap: float | None, sliding_window: int | None, num_q_per_kv: int,
    block_q: int, block_n: int, num_warps: int = 4, num_stages: int = 2,
    k_scale: float = 1.0, v_scale: float = 1.0,
    merge_rows: torch.Tensor | None = None, counters: torch.Tensor | None = None,
    causal: bool = True,
) -> None:
    """Attention of the work items' query tiles over the paged cache.

    q [T, H, D]; kv_cache [2, NB, BS, H_kv, D]; kv_indices int32 [nnz]; work int32 [W, WORK_COLS];
    out [T, H, D] (written unless part_out is given); part_out float32 [R, H, S, D] and
    part_lse float32 [R, H, S] (natural-log LSE) receive split partials when given.
    With merge_rows int32 [R, 2] (output token, splits) and counters int32 [>= R * H_kv], all
    zero, the launch also merges the partials into `out` (as merge_attention_states would)
    and leaves the counters zero.
    An fp8 (e4m3fn) cache holds K / k_scale and V / v_scale: tiles are converted to q's dtype
    (exact), k_scale is folded into the softmax scale and v_scale into the output. Under a
    bf16 q the tiles and q are converted to fp16 instead: e4m3 -> fp16 is exact and has a
    native conversion on Hopper (cvt.rn.f16x2.e4m3x2), while converting to bf16 made fp8 decode
    no faster than a bf16 cache's (docs/decisions/0011-fp8-kv-cache-scales-and-fp16-math.md;
    `benchmarks/fp8_kv.py` times it). q -> fp16 keeps more mantissa than bf16 and is exact for
    |q| < 65504; the products still accumulate in fp32.
    causal=False (bidirectional encoders): rows see every key of [start, hi), whatever their
    position; the schedule (build_schedule(causal=False)) gives each tile all of its keys.
    """
    check_scales(kv_cache, k_scale, v_scale)
    n_work = work.shape[0]
    if n_work == 0:
        return
    _, _, page, h_kv, d = kv_cache.shape
    split = part_out is not None
    fuse = fuses_merge(part_out, merge_rows, counters, h_kv)
    g_pad = triton.next_power_of_2(num_q_per_kv)
    k_cache, v_cache = kv_cache[0], kv_cache[1]                            # [NB, BS, H_kv, D]
    po = part_out if split else out                                        # placeholders when unused
    pl = part_lse if split else out
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if n_work > 65535:
        raise ValueError(f"{n_work} work rows exceed the grid's 65535 (larger prefill tiles would fit)")
    _paged_attention_kernel[(h_kv, n_work)](
        q, k_cache, v_cache, kv_indices, work, out, po, pl,
        merge_rows if fuse else work, counters if fuse else work,      # placeholders when unused
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        po.stride(0), po.stride(1), po.stride(2) if split else 0,
        pl.stride(0), pl.stride(1),
        float(scale) * float(k_scale), float(soft_cap or 1.0), int(sliding_window or 0), float(v_scale),
        NUM_Q_PER_KV=num_q_per_kv, G_PAD=g_pad, BLOCK_Q=block_q, BLOCK_N=block_n, PAGE=page,
        D=d, D_PAD=triton.next_power_of_2(d), HAS_WINDOW=sliding_window is not None,
        HAS_SOFTCAP=soft_cap is not None, SPLIT=split, PRECISION=precision,
        WORK_COLS=WORK_COLS, KV_FP8=kv_cache.dtype == torch.float8_e4m3fn,
        F16_MATH=kv_cache.dtype == torch.float8_e4m3fn and q.dtype == torch.bfloat16,
        FUSE_MERGE=fuse, S_CHUNK=merge_chunk(g_pad, triton.next_power_of_2(d), num_warps),
        CAUSAL=causal,
        num_warps=num_warps, num_stages=num_stages,
    )


def merge_chunk(g_pad: int, d_pad: int, num_warps: int) -> int:
    """Splits a fused merge loads at once: a [G_PAD, S, D_PAD] fp32 tile of at most 64
    registers a thread (head_dim 128: 16 for 4 warps and a group of 4, 4 for 1 warp), at
    most 16 (one L2 round trip merges up to 16 splits)."""
    return max(1, min(16, 64 * 32 * num_warps // (g_pad * d_pad)))

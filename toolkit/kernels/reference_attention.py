"""Pure-torch twins of toolkit/kernels/paged_attention.py and merge_attention_states.py:
same names, same signatures, same work-table semantics, computed in float32.

They are the test oracle of the kernels' bookkeeping, and the CPU path of
TritonPagedAttention when Triton's interpreter is off.
"""

from __future__ import annotations

import torch

from toolkit.kernels.reference import check_scales, dequantize, fuses_merge

WORK_COLS = 10
SELF_TILE_COLS = 5   # the tile table of self_attention (prefill chunks over their own K/V)


def paged_attention(
    q: torch.Tensor, kv_cache: torch.Tensor, kv_indices: torch.Tensor, work: torch.Tensor,
    out: torch.Tensor, part_out: torch.Tensor | None, part_lse: torch.Tensor | None, *,
    scale: float, soft_cap: float | None, sliding_window: int | None, num_q_per_kv: int,
    block_q: int, block_n: int, num_warps: int = 4, num_stages: int = 2,
    k_scale: float = 1.0, v_scale: float = 1.0,
    merge_rows: torch.Tensor | None = None, counters: torch.Tensor | None = None,
    causal: bool = True,
) -> None:
    """Twin of the Triton launcher (block_q, block_n, num_warps, num_stages are ignored):
    each work item's keys [start, hi) masked causally (unless causal=False), by the window
    and by `< hi`; an fp8
    cache's K and V are dequantised (value x scale) in float32. With merge_rows (and the
    kernel's counters, untouched here) the split partials are merged into `out` afterwards."""
    del block_q, block_n, num_warps, num_stages
    check_scales(kv_cache, k_scale, v_scale)
    _, _, page, h_kv, d = kv_cache.shape
    fuse = fuses_merge(part_out, merge_rows, counters, h_kv)
    pages = kv_indices.long()
    for q_start, n_q, first_pos, page_base, start, _, _, hi, part_row, split in work.tolist():
        if n_q == 0:
            continue                       # a padding row of a fixed-size table: no query
        pos = torch.arange(start, hi, device=q.device)                     # [S] key positions
        blocks = pages[page_base + pos // page]
        k = dequantize(kv_cache[0, blocks, pos % page], k_scale)           # [S, H_kv, D] fp32
        v = dequantize(kv_cache[1, blocks, pos % page], v_scale)
        qt = q[q_start:q_start + n_q].float().view(n_q, h_kv, num_q_per_kv, d)   # [Q, H_kv, G, D]
        s = torch.einsum("qhgd,shd->hgqs", qt, k) * scale                  # [H_kv, G, Q, S]
        if soft_cap is not None:
            s = soft_cap * torch.tanh(s / soft_cap)
        q_pos = first_pos + torch.arange(n_q, device=q.device)[:, None]    # [Q, 1]
        ok = pos[None, :] <= q_pos if causal else torch.ones_like(pos[None, :] <= q_pos)
        if sliding_window is not None:
            ok &= pos[None, :] > q_pos - sliding_window
        s = s.masked_fill(~ok, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)                                   # [H_kv, G, Q]; -inf: no key
        p = torch.exp(s - lse.clamp_min(torch.finfo(torch.float32).min)[..., None])
        o = torch.einsum("hgqs,shd->qhgd", p, v).reshape(n_q, h_kv * num_q_per_kv, d)
        if part_out is None:
            out[q_start:q_start + n_q] = o.to(out.dtype)
        else:
            assert part_lse is not None
            part_out[part_row:part_row + n_q, :, split] = o
            part_lse[part_row:part_row + n_q, :, split] = lse.permute(2, 0, 1).reshape(n_q, -1)
    if fuse:
        merge_attention_states(part_out, part_lse, merge_rows, out)


def merge_attention_states(part_out: torch.Tensor, part_lse: torch.Tensor, rows: torch.Tensor,
                           out: torch.Tensor) -> None:
    """part_out float32 [R, H, S, D], part_lse float32 [R, H, S], rows int32 [R, 2] =
    (output token, number of valid splits) -> out[token, h]; rows with 0 splits (padding)
    write nothing."""
    for r, (token, n_splits) in enumerate(rows.tolist()):
        if n_splits == 0:
            continue
        lse = part_lse[r, :, :n_splits]                                    # [H, n]
        wgt = torch.softmax(lse, dim=-1)                                   # exp(lse - logsumexp(lse))
        out[token] = torch.einsum("hs,hsd->hd", wgt, part_out[r, :, :n_splits]).to(out.dtype)


def self_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tiles: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor | None = None, *, scale: float,
                   kv_cache: torch.Tensor | None = None, kv_indices: torch.Tensor | None = None,
                   block_m: int = 128, block_n: int = 64, num_warps: int = 8,
                   num_stages: int = 3, causal: bool = True) -> None:
    """Twin of `toolkit.kernels.self_attention.self_attention` (tile sizes ignored): each chunk
    attends causally (causal=False: to every key) over its own keys and over all of its cached
    prefix (read from kv_cache's pages), in float32; the chunks are read from the tile table
    (start row, tile start, length, prefix length, page-list start)."""
    del block_m, block_n, num_warps, num_stages
    h, h_kv = q.shape[1], k.shape[1]
    for start, n, prefix, page_base in sorted({(s, n, p, b) for s, _, n, p, b in tiles.tolist()}):
        if prefix and kv_cache is None:
            raise ValueError(f"a tile has a cached prefix of {prefix} tokens but no kv_cache was given: "
                             f"pass kv_cache and kv_indices, or build the tiles with prefix_lens 0")
        ks, vs = k[start:start + n].float(), v[start:start + n].float()   # [S, H_kv, D]
        if prefix:
            page = kv_cache.shape[2]
            pos = torch.arange(prefix, device=q.device)
            blocks = kv_indices.long()[page_base + pos // page]
            ks = torch.cat([kv_cache[0, blocks, pos % page].float(), ks])  # [P + S, H_kv, D]
            vs = torch.cat([kv_cache[1, blocks, pos % page].float(), vs])
        qs = q[start:start + n].float()                                    # [S, H, D]
        ks, vs = ks.repeat_interleave(h // h_kv, dim=1), vs.repeat_interleave(h // h_kv, dim=1)
        s = torch.einsum("qhd,khd->hqk", qs, ks) * scale                   # [H, S, P + S]
        hidden = torch.ones(n, prefix + n, dtype=torch.bool, device=q.device).triu(prefix + 1)
        if not causal:
            hidden.zero_()
        s = s.masked_fill(hidden, float("-inf"))
        lse_s = torch.logsumexp(s, dim=-1)                                 # [H, S]
        out[start:start + n] = torch.einsum("hqk,khd->qhd", torch.exp(s - lse_s[..., None]), vs).to(out.dtype)
        if lse is not None:
            lse[start:start + n] = lse_s.T

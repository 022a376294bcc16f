"""Speculative decoding's rejection sampler as one Triton program per request.

Same contract, hashes and float64 arithmetic as the twin `reference_spec.rejection_sample`
(read its docstring for the algorithm). A program walks its k_b draft positions (a scalar test
each: u * q(x) < p(x), or x == argmax for greedy requests), then makes one pass over the
vocabulary of the first rejected row (or the bonus row) for the exponential race over
max(p - q, 0) and, in the same pass, over p (the fallback when the residual has no mass).
Nothing is synchronised with the host: the launcher sizes the output from a host integer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.kernels.gumbel_sample import _fmix32  # the shared hash of the sampling noise
from toolkit.kernels.reference_spec import ACCEPT_SALT, spec_row_starts

_SALT_MIX = (ACCEPT_SALT * 0x9E3779B9) & 0xFFFFFFFF   # the salt's first hash step, precomputed


@triton.jit
def _rejection_kernel(target_ptr, t_stride, draft_ids_ptr, draft_probs_ptr, d_stride,
                      num_drafts_ptr, row_start_ptr, keys_ptr, greedy_ptr, argmax_ptr,
                      out_ptr, out_stride, count_ptr, n_cols,
                      SALT_MIX: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    k = tl.load(num_drafts_ptr + b).to(tl.int64)
    r0 = tl.load(row_start_ptr + b)                                    # int64 first target row
    d0 = r0 - b                                                        # first draft row
    greedy_flag = tl.load(greedy_ptr + b)
    is_greedy = greedy_flag != 0

    # -- walk the drafts: n_acc = length of the accepted prefix
    n_acc = tl.zeros((), tl.int64)
    alive = tl.full((), 1, tl.int1)
    for j in range(k):
        row = r0 + j
        x = tl.load(draft_ids_ptr + d0 + j)
        key = tl.load(keys_ptr + row)
        k1 = (key & 0xFFFFFFFF).to(tl.uint32)
        k2 = ((key >> 32) & 0xFFFFFFFF).to(tl.uint32)
        u = (_fmix32(_fmix32(k1 + SALT_MIX) ^ k2).to(tl.float64) + 0.5) * (1.0 / 4294967296.0)
        p_x = tl.load(target_ptr + row * t_stride + x).to(tl.float64)
        if HAS_DRAFT_PROBS:
            q_x = tl.load(draft_probs_ptr + (d0 + j) * d_stride + x).to(tl.float64)
        else:
            q_x = 1.0
        ok = tl.where(is_greedy, x == tl.load(argmax_ptr + row), u * q_x < p_x)
        alive = alive & ok
        tl.store(out_ptr + b * out_stride + j, tl.where(alive, x, -1))   # -1 past the prefix
        n_acc += alive.to(tl.int64)

    # -- the last token: from the first rejected row, or the bonus row (q = 0)
    frow = r0 + n_acc
    rejected = n_acc < k
    qrow = tl.where(rejected, d0 + n_acc, 0)                           # a draft row that exists
    x_rej = tl.where(rejected, tl.load(draft_ids_ptr + qrow), -1)
    key = tl.load(keys_ptr + frow)
    k1 = (key & 0xFFFFFFFF).to(tl.uint32)
    k2 = ((key >> 32) & 0xFFFFFFFF).to(tl.uint32)
    best_r = tl.full([BLOCK], float("-inf"), tl.float64)               # race over max(p - q, 0)
    idx_r = tl.full([BLOCK], 2147483647, tl.int64)
    best_p = tl.full([BLOCK], float("-inf"), tl.float64)               # race over p (fallback)
    idx_p = tl.full([BLOCK], 2147483647, tl.int64)
    mass = tl.zeros([BLOCK], tl.float64)
    if greedy_flag == 0:                                               # greedy rows need no race
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            m = cols < n_cols
            p = tl.load(target_ptr + frow * t_stride + cols, mask=m, other=0.0).to(tl.float64)
            if HAS_DRAFT_PROBS:
                q = tl.load(draft_probs_ptr + qrow * d_stride + cols, mask=m, other=0.0)
                q = tl.where(rejected, q.to(tl.float64), 0.0)             # bonus row: q = 0
            else:
                q = tl.where(cols == x_rej, 1.0, 0.0).to(tl.float64)
            r = tl.maximum(p - q, 0.0)
            h = _fmix32(_fmix32(cols.to(tl.uint32) * 0x9E3779B9 + k1) ^ k2)
            uv = (h.to(tl.float64) + 0.5) * (1.0 / 4294967296.0)
            g = -tl.log(-tl.log(uv))
            s_r = tl.where(r > 0.0, tl.log(tl.where(r > 0.0, r, 1.0)) + g, float("-inf"))
            s_p = tl.where(p > 0.0, tl.log(tl.where(p > 0.0, p, 1.0)) + g, float("-inf"))
            upd = s_r > best_r                                         # strict: earlier id wins
            best_r = tl.where(upd, s_r, best_r)
            idx_r = tl.where(upd, cols.to(tl.int64), idx_r)
            upd = s_p > best_p
            best_p = tl.where(upd, s_p, best_p)
            idx_p = tl.where(upd, cols.to(tl.int64), idx_p)
            mass += r
    top_r = tl.max(best_r, axis=0)
    tok_r = tl.min(tl.where(best_r == top_r, idx_r, 2147483647), axis=0)
    top_p = tl.max(best_p, axis=0)
    tok_p = tl.min(tl.where(best_p == top_p, idx_p, 2147483647), axis=0)
    tok = tl.where(tl.sum(mass, axis=0) > 0.0, tok_r, tok_p)
    tok = tl.where(tok >= n_cols, 0, tok)                              # a row without mass
    tok = tl.where(is_greedy, tl.load(argmax_ptr + frow), tok)
    tl.store(out_ptr + b * out_stride + n_acc, tok)
    tl.store(count_ptr + b, (n_acc + 1).to(tl.int32))


def rejection_sample(
    target_probs: torch.Tensor,          # float32 [R, V], R = sum_b (k_b + 1)
    draft_token_ids: torch.Tensor,       # int64 [D], D = sum_b k_b
    draft_probs: torch.Tensor | None,    # float32 [D, V] or None (one-hot drafts)
    num_draft_tokens: torch.Tensor,      # int32 [B]
    keys: torch.Tensor,                  # int64 [R]
    greedy: torch.Tensor,                # bool [B]
    max_num_draft_tokens: int,           # host int >= max k_b
    target_argmax: torch.Tensor | None = None,   # int64 [R]
    *, block: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (tokens int64 [B, max_num_draft_tokens + 1] padded with -1, num_emitted int32 [B])."""
    assert target_probs.dim() == 2 and target_probs.dtype == torch.float32
    assert target_probs.stride(1) == 1
    b_n, v = num_draft_tokens.shape[0], target_probs.shape[1]
    dev = target_probs.device
    out = torch.full((b_n, max_num_draft_tokens + 1), -1, dtype=torch.int64, device=dev)
    counts = torch.empty(b_n, dtype=torch.int32, device=dev)
    if b_n == 0:
        return out, counts
    if target_argmax is None:
        target_argmax = torch.argmax(target_probs, dim=-1)
    has_q = draft_probs is not None
    if has_q:
        assert draft_probs.dtype == torch.float32 and draft_probs.stride(1) == 1
    ids = draft_token_ids if draft_token_ids.numel() else torch.zeros(1, dtype=torch.int64, device=dev)
    q = draft_probs if has_q and draft_probs.numel() else target_probs   # never read when absent
    _rejection_kernel[(b_n,)](
        target_probs, target_probs.stride(0), ids.contiguous(), q, q.stride(0),
        num_draft_tokens.to(torch.int32).contiguous(), spec_row_starts(num_draft_tokens).contiguous(),
        keys.contiguous(), greedy.to(torch.int8).contiguous(), target_argmax.contiguous(),
        out, out.stride(0), counts, v,
        SALT_MIX=_SALT_MIX, HAS_DRAFT_PROBS=has_q, BLOCK=min(block, triton.next_power_of_2(v)))
    return out, counts

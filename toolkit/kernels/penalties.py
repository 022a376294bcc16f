"""Repetition, frequency and presence penalties in one launch, touching only listed tokens (Triton).

One program per penalising row (the lists may hold only those rows: `rows` maps them to
logits rows). Only the row's prompt and output tokens change, so the kernel never
reads the vocabulary: for each listed token t it counts t in the output (a [BL, BO] compare,
O(L x Lo) per row; no [N, V] count buffer), computes from the original logit (all reads,
then a barrier, then all writes)
    x = logits[t];  x = x / rep if x > 0 else x * rep;  x -= freq * count;  x -= pres * (count > 0)
A token listed twice gets the same value twice, so duplicate writes agree. The twin is
`reference_sampling.apply_penalties`, whose arithmetic this follows operation by operation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _new_values(x_row, tok_row, n_tok, out_row, n_out, v, rep, freq, pres, val_row,
                BL: tl.constexpr, BO: tl.constexpr):
    """Phase A: the penalised value of each listed token, from the original logits, into
    val_row (reads only: a token listed twice must not be penalised twice)."""
    for start in range(0, n_tok, BL):
        i = start + tl.arange(0, BL)
        t = tl.load(tok_row + i, mask=i < n_tok, other=v)                 # [BL]; pad = v
        live = t < v
        count = tl.zeros([BL], dtype=tl.float32)
        for o_start in range(0, n_out, BO):
            j = o_start + tl.arange(0, BO)
            o = tl.load(out_row + j, mask=j < n_out, other=v)            # [BO]
            count += tl.sum((t[:, None] == o[None, :]).to(tl.float32), axis=1)
        x = tl.load(x_row + tl.where(live, t, 0), mask=live, other=0.0)
        x = tl.where(x > 0, tl.div_rn(x, rep), x * rep)                  # as torch divides
        x = x - freq * count
        x = x - pres * (count > 0).to(tl.float32)
        tl.store(val_row + i, x, mask=i < n_tok)


@triton.jit
def _write_values(x_row, tok_row, n_tok, v, val_row, BL: tl.constexpr):
    """Phase B: scatter the values (a duplicate token writes the same value again)."""
    for start in range(0, n_tok, BL):
        i = start + tl.arange(0, BL)
        t = tl.load(tok_row + i, mask=i < n_tok, other=v)
        tl.store(x_row + t, tl.load(val_row + i, mask=i < n_tok), mask=t < v)


# the list widths change every step: specialising on them (divisibility by 16) would compile
# new variants mid-run
@triton.jit(do_not_specialize=["prompt_stride", "n_prompt", "out_stride", "n_out"])
def _penalties_kernel(x_ptr, x_stride, prompt_ptr, prompt_stride, n_prompt, out_ptr, out_stride,
                      n_out, rep_ptr, freq_ptr, pres_ptr, val_ptr, rows_ptr, v,
                      HAS_ROWS: tl.constexpr, BL: tl.constexpr, BO: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)                   # the token lists' row
    row = tl.load(rows_ptr + i).to(tl.int64) if HAS_ROWS else i          # the logits row
    rep = tl.load(rep_ptr + row)
    freq = tl.load(freq_ptr + row)
    pres = tl.load(pres_ptr + row)
    if (rep != 1.0) | (freq != 0.0) | (pres != 0.0):
        x_row = x_ptr + row * x_stride
        p_row = prompt_ptr + i * prompt_stride
        o_row = out_ptr + i * out_stride
        val_row = val_ptr + i * (n_prompt + n_out)                         # scratch [Lp + Lo]
        _new_values(x_row, p_row, n_prompt, o_row, n_out, v, rep, freq, pres, val_row, BL, BO)
        _new_values(x_row, o_row, n_out, o_row, n_out, v, rep, freq, pres, val_row + n_prompt,
                    BL, BO)
        tl.debug_barrier()                       # every read of the row before any write
        _write_values(x_row, p_row, n_prompt, v, val_row, BL)
        _write_values(x_row, o_row, n_out, v, val_row + n_prompt, BL)


def apply_penalties(logits: torch.Tensor, prompt_tokens: torch.Tensor, output_tokens: torch.Tensor,
                    repetition: torch.Tensor, frequency: torch.Tensor,
                    presence: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """In place on logits float32 [N, V] (returned): prompt_tokens int64 [R, Lp] and
    output_tokens int64 [R, Lo] padded with V; repetition / frequency / presence float32 [N]
    (1 / 0 / 0 = off). Repetition applies to tokens in the prompt or the output, frequency
    (x count) and presence (once) to tokens in the output. Token-list row r belongs to logits
    row rows[r] (int64 [R], distinct), or to row r when rows is None (then R = N): only the
    penalising rows need lists, so the step uploads and reads only theirs."""
    assert logits.dim() == 2 and logits.dtype == torch.float32 and logits.stride(1) == 1
    n, v = logits.shape
    p, o = prompt_tokens.contiguous(), output_tokens.contiguous()
    r = p.shape[0]
    assert o.shape[0] == r and (r == n if rows is None else tuple(rows.shape) == (r,))
    if r:
        scratch = torch.empty(r, p.shape[1] + o.shape[1], device=logits.device)
        _penalties_kernel[(r,)](logits, logits.stride(0), p, p.stride(0), p.shape[1], o,
                                o.stride(0), o.shape[1], repetition.float().contiguous(),
                                frequency.float().contiguous(), presence.float().contiguous(),
                                scratch, rows.contiguous() if rows is not None else p, v,
                                HAS_ROWS=rows is not None, BL=32, BO=64, num_warps=4)
    return logits

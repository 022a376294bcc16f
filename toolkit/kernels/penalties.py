"""Repetition, frequency and presence penalties, touching only listed tokens (Triton).

The penalising rows' prompt and output lists (the lists may hold only those rows: `rows`
maps them to logits rows) are cut into blocks, one program each. Only the listed tokens
change, so the kernels never read the vocabulary: for each listed token t the first launch
counts t in the output (a [BL, BO] compare, O(L x Lo) per row; no [N, V] count buffer) and
computes from the original logit; the second, after every read, writes
    x = logits[t];  x = x / rep if x > 0 else x * rep;  x -= freq * count;  x -= pres * (count > 0)
A token listed twice gets the same value twice, so duplicate writes agree. The twin is
`reference_sampling.apply_penalties`, whose arithmetic this follows operation by operation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _list_block(prompt_ptr, prompt_stride, n_prompt, out_ptr, out_stride, n_out, i, b, v,
                BL: tl.constexpr):
    """Block b of token-list row i's prompt + output list: (positions, tokens; pad = v)."""
    j = b * BL + tl.arange(0, BL)                        # position in prompt ++ output
    in_p = j < n_prompt
    t = tl.load(prompt_ptr + i * prompt_stride + j, mask=in_p, other=v)
    jo = tl.where(in_p, 0, j - n_prompt)
    t = tl.where(in_p, t, tl.load(out_ptr + i * out_stride + jo,
                                  mask=~in_p & (jo < n_out), other=v))
    return j, t


@triton.jit
def _program_row(rows_ptr, rep_ptr, freq_ptr, pres_ptr, HAS_ROWS: tl.constexpr):
    """(token-list row i, list block b, logits row, rep, freq, pres, whether it penalises)."""
    i = tl.program_id(0).to(tl.int64)
    row = tl.load(rows_ptr + i).to(tl.int64) if HAS_ROWS else i
    rep = tl.load(rep_ptr + row)
    freq = tl.load(freq_ptr + row)
    pres = tl.load(pres_ptr + row)
    return i, tl.program_id(1), row, rep, freq, pres, (rep != 1.0) | (freq != 0.0) | (pres != 0.0)


# the list widths change every step: specialising on them (divisibility by 16) would compile
# new variants mid-run
@triton.jit(do_not_specialize=["prompt_stride", "n_prompt", "out_stride", "n_out"])
def _values_kernel(x_ptr, x_stride, prompt_ptr, prompt_stride, n_prompt, out_ptr, out_stride,
                   n_out, rep_ptr, freq_ptr, pres_ptr, val_ptr, rows_ptr, v,
                   HAS_ROWS: tl.constexpr, BL: tl.constexpr, BO: tl.constexpr):
    """Phase A, a block of BL listed tokens a program: each one's penalised value, from the
    original logits, into the scratch (reads only: a token listed twice must not be
    penalised twice)."""
    i, b, row, rep, freq, pres, on = _program_row(rows_ptr, rep_ptr, freq_ptr, pres_ptr, HAS_ROWS)
    if on:
        j, t = _list_block(prompt_ptr, prompt_stride, n_prompt, out_ptr, out_stride, n_out, i, b,
                           v, BL)
        live = t < v
        count = tl.zeros([BL], dtype=tl.float32)
        for o_start in range(0, n_out, BO):              # t's count in the output: [BL, BO]
            jo = o_start + tl.arange(0, BO)
            o = tl.load(out_ptr + i * out_stride + jo, mask=jo < n_out, other=v)
            count += tl.sum((t[:, None] == o[None, :]).to(tl.float32), axis=1)
        x = tl.load(x_ptr + row * x_stride + tl.where(live, t, 0), mask=live, other=0.0)
        x = tl.where(x > 0, tl.div_rn(x, rep), x * rep)                  # as torch divides
        x = x - freq * count
        x = x - pres * (count > 0).to(tl.float32)
        tl.store(val_ptr + i * (n_prompt + n_out) + j, x, mask=j < n_prompt + n_out)


@triton.jit(do_not_specialize=["prompt_stride", "n_prompt", "out_stride", "n_out"])
def _write_kernel(x_ptr, x_stride, prompt_ptr, prompt_stride, n_prompt, out_ptr, out_stride,
                  n_out, rep_ptr, freq_ptr, pres_ptr, val_ptr, rows_ptr, v,
                  HAS_ROWS: tl.constexpr, BL: tl.constexpr):
    """Phase B (after every read of phase A): scatter the values (a token listed twice
    writes the same value twice)."""
    i, b, row, rep, freq, pres, on = _program_row(rows_ptr, rep_ptr, freq_ptr, pres_ptr, HAS_ROWS)
    if on:
        j, t = _list_block(prompt_ptr, prompt_stride, n_prompt, out_ptr, out_stride, n_out, i, b,
                           v, BL)
        val = tl.load(val_ptr + i * (n_prompt + n_out) + j, mask=t < v)
        tl.store(x_ptr + row * x_stride + t, val, mask=t < v)


def apply_penalties(logits: torch.Tensor, prompt_tokens: torch.Tensor, output_tokens: torch.Tensor,
                    repetition: torch.Tensor, frequency: torch.Tensor,
                    presence: torch.Tensor, rows: torch.Tensor | None = None,
                    *, block: int = 64) -> torch.Tensor:
    """In place on logits float32 [N, V] (returned): prompt_tokens int64 [R, Lp] and
    output_tokens int64 [R, Lo] padded with V; repetition / frequency / presence float32 [N]
    (1 / 0 / 0 = off). Repetition applies to tokens in the prompt or the output, frequency
    (x count) and presence (once) to tokens in the output. Token-list row r belongs to logits
    row rows[r] (int64 [R], distinct), or to row r when rows is None (then R = N): only the
    penalising rows need lists, so the step uploads and reads only theirs. Each list row is
    cut into blocks of `block` tokens, one program each, in two launches (values, then
    writes)."""
    assert logits.dim() == 2 and logits.dtype == torch.float32 and logits.stride(1) == 1
    n, v = logits.shape
    p, o = prompt_tokens.contiguous(), output_tokens.contiguous()
    r = p.shape[0]
    assert o.shape[0] == r and (r == n if rows is None else tuple(rows.shape) == (r,))
    if r:
        width = p.shape[1] + o.shape[1]
        scratch = torch.empty(r, width, device=logits.device)        # [R, Lp + Lo] values
        args = (logits, logits.stride(0), p, p.stride(0), p.shape[1], o, o.stride(0), o.shape[1],
                repetition.float().contiguous(), frequency.float().contiguous(),
                presence.float().contiguous(), scratch,
                rows.contiguous() if rows is not None else p, v)
        grid = (r, triton.cdiv(width, block))
        _values_kernel[grid](*args, HAS_ROWS=rows is not None, BL=block, BO=64, num_warps=4)
        _write_kernel[grid](*args, HAS_ROWS=rows is not None, BL=block, num_warps=4)
    return logits

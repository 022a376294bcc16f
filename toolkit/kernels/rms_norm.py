"""RMSNorm with the residual add fused (Triton): one program per row.

`rms_norm(x, weight, eps, residual)` returns (weight * normalize(x + residual), x + residual),
the pair a pre-norm decoder layer needs: the normed input of the next sub-block and the
running residual stream. The sum is rounded to x's dtype before it is normalized, as a
model that adds in its own dtype does (Hugging Face Llama), so the two paths agree.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.kernels.reference_model import check_rms_norm


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    n_cols,
    stride_x,
    stride_res,
    stride_out,
    stride_res_out,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        # round the sum to the activation dtype, as the residual stream is kept in it
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_res_out + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    # normalize in fp32, round to the activation dtype, then scale by the weight
    y = (xf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


def _output(buf: torch.Tensor | None, x: torch.Tensor, name: str) -> torch.Tensor:
    if buf is None:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if buf.shape != x.shape or buf.dtype != x.dtype or not buf.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous {tuple(x.shape)} {x.dtype}, "
            f"got {tuple(buf.shape)} {buf.dtype}"
        )
    return buf


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., N] (+ residual [..., N]), weight [N] -> (normed [..., N], new_residual [..., N]).

    Without a residual, new_residual is x itself. Results go to `out` / `residual_out`
    (contiguous, x's shape and dtype) when given, else to new tensors.
    """
    check_rms_norm(x, weight, residual)
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = _output(out, x, "out").view(x2.shape)  # [rows, N]
    if residual is None:
        res2, res_out = x2, x2
    else:
        res2 = residual.reshape(-1, n)
        if res2.stride(-1) != 1:
            res2 = res2.contiguous()
        res_out = _output(residual_out, x, "residual_out").view(x2.shape)
    rows, block = x2.shape[0], triton.next_power_of_2(n)
    if rows:
        _rms_norm_kernel[(rows,)](
            x2,
            res2,
            weight,
            out,
            res_out,
            n,
            x2.stride(0),
            res2.stride(0),
            out.stride(0),
            res_out.stride(0),
            float(eps),
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            num_warps=min(max(block // 512, 1), 16),   # wide rows (hidden 4096+) get more warps
        )
    new_residual = x if residual is None else res_out.view(x.shape)
    return out.view(x.shape), new_residual

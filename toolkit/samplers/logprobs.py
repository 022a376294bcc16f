"""Logprobs of chosen tokens, their ranks and the top-k alternatives (batched, no host sync).

`gather_logprobs` picks the Triton kernel (kernels/logprobs.py) for CUDA logits and its torch
twin (kernels/reference_sampling.py) elsewhere; both have the same signature and tie rule.
"""

from __future__ import annotations

from torch import Tensor

from toolkit.kernels import reference_sampling


def gather_logprobs(logits: Tensor, token_ids: Tensor, k: int, rows: Tensor | None = None,
                    *, compact: bool = False, use_triton: bool | None = None
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """See `reference_sampling.gather_logprobs`; use_triton None = on CUDA only."""
    if logits.is_cuda if use_triton is None else use_triton:
        from toolkit.kernels.logprobs import gather_logprobs as fast
        return fast(logits, token_ids, k, rows, compact=compact)
    return reference_sampling.gather_logprobs(logits, token_ids, k, rows, compact=compact)

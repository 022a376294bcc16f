"""Logprobs of chosen tokens, their ranks and the top-k alternatives (batched, no host sync).

`gather_logprobs` picks the Triton kernel (kernels/logprobs.py) for CUDA logits and its torch
twin (kernels/reference_sampling.py) elsewhere; both have the same signature and tie rule.
"""

from __future__ import annotations

from torch import Tensor

from toolkit.samplers.stages import kernel


def gather_logprobs(logits: Tensor, token_ids: Tensor, k: int, rows: Tensor | None = None,
                    *, saved: Tensor | None = None, saved_rows: Tensor | None = None,
                    use_triton: bool | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """See `reference_sampling.gather_logprobs`; use_triton None = on CUDA only."""
    return kernel("gather_logprobs", logits, use_triton)(logits, token_ids, k, rows,
                                                         saved=saved, saved_rows=saved_rows)

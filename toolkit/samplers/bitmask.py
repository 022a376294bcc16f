"""Packed per-row token bitmasks: int32 [N, ceil(V/32)], bit v%32 of word v//32 = token v allowed.

The layout grammar backends fill (xgrammar, outlines-core); allowed_token_ids use it too.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor


def pack_token_bitmask(allowed: Sequence[Sequence[int] | None], vocab_size: int) -> Tensor:
    """int32 [N, ceil(V/32)] on the CPU: row i allows `allowed[i]`, or every token when None."""
    words = (vocab_size + 31) // 32
    out = np.zeros((len(allowed), words), dtype=np.uint32)
    for i, ids in enumerate(allowed):
        if ids is None:
            out[i] = 0xFFFFFFFF
            continue
        a = np.asarray(list(ids), dtype=np.int64)
        if a.size and (a.min() < 0 or a.max() >= vocab_size):
            raise ValueError(f"row {i}: token ids must lie in [0, {vocab_size}), got "
                             f"{a[(a < 0) | (a >= vocab_size)][:5].tolist()}")
        np.bitwise_or.at(out[i], a // 32, (np.uint32(1) << (a % 32).astype(np.uint32)))
    return torch.from_numpy(out.view(np.int32).copy())


def unpack_token_bitmask(bitmask: Tensor, vocab_size: int) -> Tensor:
    """bool [N, V]: True where the token is allowed."""
    ids = torch.arange(vocab_size, device=bitmask.device)
    words = bitmask.to(torch.int64)[:, ids // 32]
    return ((words >> (ids % 32)) & 1).bool()

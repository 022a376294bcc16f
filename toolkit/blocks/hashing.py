"""Block hashes for prefix caching: a chain over (parent hash, token ids, extra key).

The hash is 128 bits of BLAKE2b over the exact bytes of its inputs. Two different
prefixes share a hash only by a BLAKE2b collision: for a cache that has ever seen
N blocks the chance of any collision is below N^2 / 2^129 (about 3e-27 for N = 10^6),
far below the rate of hardware memory errors. That is the written argument that a
hash match means a token match; the allocator therefore does not store tokens.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

NONE_HASH = 0  # parent of the first block


def hash_block(parent: int, token_ids: Sequence[int], extra: int = 0) -> int:
    """Hash of one full block given its parent block's hash and an extra key (salt, adapter)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent.to_bytes(16, "little", signed=False))
    h.update(int(extra).to_bytes(8, "little", signed=True))
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little")


def hash_blocks(token_ids: Sequence[int], block_size: int, extra: int = 0,
                parent: int = NONE_HASH) -> list[int]:
    """Hashes of every full block of `token_ids` (a trailing partial block has none)."""
    out = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start:start + block_size], extra)
        out.append(parent)
    return out

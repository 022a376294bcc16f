"""Argument checks shared by the fast allocators (same rules and messages as the reference)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def check_size(name: str, v: object) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return v


def check_count(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"block count must be a non-negative integer, got {n!r}")
    return n


def check_held(ref: list[int], block_ids: Sequence[int], what: str) -> None:
    """Raise ValueError unless every id is held (for "free": at least as often as it appears).

    Validates the whole list before the caller changes anything. The common case (distinct
    ids) costs one pass; duplicates fall back to counting.
    """
    for b in block_ids:
        try:
            ok = b >= 0 and ref[b] >= 1          # b < 0 would wrap around in a list index
        except (IndexError, TypeError):          # out of range, or not an integer
            ok = False
        if not ok:
            got = ref[b] if isinstance(b, int) and 0 <= b < len(ref) else 0
            raise ValueError(f"cannot {what} block {b!r}: it is not held (ref count {got}); "
                             f"valid: ids in [0, {len(ref)}) with ref count >= 1")
    if what == "free" and len(set(block_ids)) != len(block_ids):
        for b, c in Counter(block_ids).items():
            if ref[b] < c:
                raise ValueError(f"cannot free block {b} {c} times: its ref count is {ref[b]}")

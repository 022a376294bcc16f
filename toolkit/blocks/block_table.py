"""BlockTable: the blocks of one request and how many of their slots hold tokens."""

from __future__ import annotations

from collections.abc import Iterable

from toolkit.blocks.layout import slot_mapping


class BlockTable:
    """Block ids in token order; token position p lives in block_ids[p // block_size]."""

    def __init__(self, block_size: int, block_ids: Iterable[int] = (), num_tokens: int = 0) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        self.block_size = block_size
        self.block_ids: list[int] = list(block_ids)
        self.num_tokens = 0
        self.append_tokens(num_tokens)

    @property
    def capacity(self) -> int:
        """Tokens the current blocks can hold."""
        return len(self.block_ids) * self.block_size

    @property
    def num_full_blocks(self) -> int:
        return self.num_tokens // self.block_size

    def blocks_needed(self, num_new_tokens: int) -> int:
        """How many more blocks `num_new_tokens` more tokens need (0 if they fit)."""
        if not isinstance(num_new_tokens, int) or num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be a non-negative integer, got {num_new_tokens!r}")
        total = -(-(self.num_tokens + num_new_tokens) // self.block_size)
        return max(0, total - len(self.block_ids))

    def append_blocks(self, block_ids: Iterable[int]) -> None:
        self.block_ids.extend(block_ids)

    def append_tokens(self, n: int) -> None:
        """Record n more tokens; the blocks for them must already be appended."""
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"token count must be a non-negative integer, got {n!r}")
        if self.num_tokens + n > self.capacity:
            raise ValueError(f"{self.num_tokens + n} tokens do not fit in {len(self.block_ids)} "
                             f"blocks of {self.block_size}; append {self.blocks_needed(n)} more blocks first")
        self.num_tokens += n

    def slots(self, start: int, stop: int) -> list[int]:
        """Physical slots (block * block_size + offset) of positions [start, stop)."""
        if not (0 <= start <= stop <= self.capacity):
            raise ValueError(f"need 0 <= start <= stop <= capacity={self.capacity}, "
                             f"got start={start}, stop={stop}")
        return slot_mapping(self.block_ids, start, stop, self.block_size)

    def clear(self) -> list[int]:
        """Empty the table; returns the block ids (in order) for the allocator to free."""
        ids, self.block_ids, self.num_tokens = self.block_ids, [], 0
        return ids

    def __len__(self) -> int:
        return len(self.block_ids)

    def __repr__(self) -> str:
        return f"BlockTable(tokens={self.num_tokens}, block_size={self.block_size}, blocks={self.block_ids})"

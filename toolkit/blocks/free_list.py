"""FreeListAllocator: O(1) allocate/free with reference counts, no prefix caching."""

from __future__ import annotations

from collections.abc import Sequence

from toolkit.blocks._validate import check_count, check_held, check_size
from toolkit.blocks.base import OutOfBlocks


class FreeListAllocator:
    """A stack of free block ids plus a ref-count array.

    `lookup` always misses and `publish` is a no-op on a held block, so it plugs into a
    scheduler that asks for prefix caching and simply never gets a hit.
    """

    num_reserved = 0  # block 0 is an ordinary block

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = check_size("num_blocks", num_blocks)
        self.block_size = check_size("block_size", block_size)
        self._ref = [0] * num_blocks                        # [num_blocks] ref count per block
        self._free = list(range(num_blocks - 1, -1, -1))    # stack; lowest id on top

    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        check_count(n)
        if n > len(self._free):
            raise OutOfBlocks(f"asked for {n} blocks, {len(self._free)} free "
                              f"(of {self.num_blocks}); ask for at most {len(self._free)}")
        if n == 0:
            return []
        out = self._free[-n:]
        del self._free[-n:]
        out.reverse()
        ref = self._ref
        for b in out:
            ref[b] = 1
        return out

    def free(self, block_ids: Sequence[int]) -> None:
        check_held(self._ref, block_ids, "free")
        ref, free = self._ref, self._free
        for b in block_ids:
            ref[b] -= 1
            if ref[b] == 0:
                free.append(b)

    def fork(self, block_ids: Sequence[int]) -> None:
        check_held(self._ref, block_ids, "fork")
        for b in block_ids:
            self._ref[b] += 1

    def lookup(self, block_hashes: Sequence[int]) -> list[int]:
        return []

    def peek(self, block_hashes: Sequence[int]) -> int:
        return 0

    def publish(self, block_id: int, block_hash: int) -> None:
        check_held(self._ref, [block_id], "publish")

    # -- introspection (conformance suite, notebooks) --
    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id] if 0 <= block_id < self.num_blocks else 0

    def num_cached_blocks(self) -> int:
        return 0

    def cached_blocks(self) -> frozenset[int]:
        return frozenset()

    def __repr__(self) -> str:
        held = self.num_blocks - len(self._free)
        return (f"FreeListAllocator(blocks={self.num_blocks}x{self.block_size}, "
                f"free={len(self._free)}, held={held})")

    def _repr_html_(self) -> str:
        from toolkit.blocks.render import block_map_html
        return block_map_html(self)

    def __rich__(self):  # -> rich.console.RenderableType
        from toolkit.blocks.render import block_map_rich
        return block_map_rich(self)

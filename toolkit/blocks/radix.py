"""RadixAllocator: a prefix cache whose lookup walks a token radix tree, one block a level.

Each tree node is one full block: its edge key is the block's token ids (the root's
children also carry the extra key: cache salt, adapter id), so the node's path from the
root spells the whole token prefix it caches. `lookup` walks the tree from the root by
the request's tokens and stops at the first missing or empty node, so it never reads a
hash. Hashes are used only at publish, to find the block's parent node in O(1)
(`_by_hash`): a publish whose block hash names a node with other tokens (a collision, or
a caller's bug) caches nothing, but a block is hung under whatever node its parent's hash
names, so where a block is attached still rests on the chain hashes not colliding (the
BLAKE2b-128 bound of blocks/hashing.py), as every hit of the hash chain does.

The allocator keys by tokens (`keyed_by_tokens = True`), so the KV-cache manager hands it
`tokens=` / `extra=` on lookup and peek and `tokens=` / `parent=` / `extra=` on publish
(the contract in blocks/base.py).

Eviction follows the policy written in blocks/reference.py, as the conformance suite
requires of every prefix cache: never-cached free blocks first, then the least recently
freed unreferenced cached block. The KV-cache manager frees a request's blocks tail first
and a lookup re-takes a whole prefix, so the least recently freed block is a leaf of the
tree: in the engine this is LRU eviction of leaves. When a block is evicted while its
children are still cached (only possible after out-of-order frees, or when a request
published children under another request's copy of a prefix block), the node stays as
an empty inner node holding the subtree, and the subtree is reachable again as soon as
the prefix is recomputed and republished, exactly as the hash chain's orphaned hashes
become reachable again. Empty nodes without children are pruned at once.

Where it beats the hash chain and where it does not (reasoning, and what
`benchmarks/prefix_cache.py` measures: the two find the same hits on every trace, with or
without the CPU tier, throughput is the same within noise, and the tree costs the host more
per request):
- Hits, evictions, TTFT and throughput: no difference, by construction. Both follow the
  reference policy block for block (the conformance suite checks it), so hit rates are
  identical on every trace (a small pool that evicts and preempts included) and greedy
  outputs are the same.
- Collisions: lookups compare token ids, so a colliding or forged block hash makes a miss
  where the chain would serve another prompt's KV (tests/blocks/test_radix.py); only a
  collision of a parent's hash at publish time can misplace a block. In practice both
  rest on the same 128-bit bound. (Linking a published block to its parent by the
  request's previous block id instead of its hash would remove that last dependence.)
- Inspection: the cache is a tree a notebook can walk (`prefixes()`, `num_nodes()`).
- Host cost: it is slower. Its lookup + publish + free cost 2-3x the hash chain's (a token
  tuple, a dict probe and a node per block), on top of the hashing both pay (the manager
  still hashes: the contract and the tree's publish take hashes): a fraction of a
  millisecond per 1-2k-token request, small against a GPU prefill of that prompt, but not
  zero on a host-bound step. A tree that linked blocks by id would need no hashes,
  and then, skipping the chain's BLAKE2b, it would cost the host less than the chain.
- Not done here (the shared policy forbids it for every allocator): dedup of a prefix
  computed twice by requests admitted in the same step (SGLang repoints the later request
  at the tree's copy), and eviction that skips an inner node whose children are cached
  (here the least recently freed block goes first even then; with the manager's tail-first
  frees that block is a leaf anyway, except after such duplicate computations).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from toolkit.blocks._validate import check_held
from toolkit.blocks.cached_pool import CachedBlockPool

_NEEDS_TOKENS = ("RadixAllocator is keyed by token ids: pass tokens= (and extra=, parent= on "
                 "publish); the KVCacheManager does so for an allocator with keyed_by_tokens = True")


class _Node:
    """One block of a cached prefix; `block` None = empty (evicted, or not yet published)."""

    __slots__ = ("block", "children", "hash", "key", "parent")

    def __init__(self, block_hash: int | None) -> None:
        self.key: tuple | None = None            # edge key under parent; None = detached
        self.parent: _Node | None = None
        self.children: dict[tuple, _Node] = {}
        self.block: int | None = None
        self.hash = block_hash


class RadixAllocator(CachedBlockPool):
    """`LLM(..., allocator="radix")`; or by hand, with the tokens behind the hashes:

        a = RadixAllocator(num_blocks=64, block_size=16)
        hits = a.lookup(hashes, tokens=prompt_ids, extra=salt)       # refs taken
        a.publish(block, hashes[i], tokens=prompt_ids[16 * i:16 * (i + 1)],
                  parent=hashes[i - 1] if i else None, extra=salt)
    """

    keyed_by_tokens = True           # the manager passes tokens (blocks/base.py)

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)   # _cached: cached block -> its node
        self._root = _Node(None)
        # chain hash -> node, for every node (empty and detached ones too): a publish finds
        # its parent node by the parent's hash instead of walking from the root
        self._by_hash: dict[int, _Node] = {}

    # -- the allocator contract (allocate / free / fork: CachedBlockPool) --
    def lookup(self, block_hashes: Sequence[int], *, tokens: Sequence[int] | None = None,
               extra: int = 0) -> list[int]:
        out = [node.block for node in self._walk(block_hashes, tokens, extra)]
        ref = self._ref
        for b in out:
            if ref[b] == 0:
                del self._lru[b]
            ref[b] += 1
        return out

    def peek(self, block_hashes: Sequence[int], *, tokens: Sequence[int] | None = None,
             extra: int = 0) -> int:
        return sum(1 for _ in self._walk(block_hashes, tokens, extra))

    def publish(self, block_id: int, block_hash: int, *, tokens: Sequence[int] | None = None,
                parent: int | None = None, extra: int = 0) -> None:
        """`tokens`: the block's own block_size token ids; `parent`: the previous block's
        chain hash (None for a request's first block, which hangs under the root by
        (extra, tokens))."""
        check_held(self._ref, [block_id], "publish")
        key = self._key(tokens, 0, parent is None, extra)
        if block_id in self._cached:
            return                                   # keep the block's first content
        node = self._by_hash.get(block_hash)
        if node is None:
            node = self._by_hash[block_hash] = _Node(block_hash)
        elif node.block is not None:
            return                                   # duplicate: keep the existing block
        if node.key is None and not self._attach(node, key, parent):
            self._prune(node)                        # a collision left it detached
            return
        if node.key != key or node.parent.hash != parent:
            return                                   # hash collision: cache nothing
        node.block = block_id
        self._cached[block_id] = node

    # -- introspection (render, notebooks) --
    def num_nodes(self) -> int:
        """Tree nodes, empty inner ones included (memory the tree costs beyond its blocks)."""
        return len(self._by_hash)

    def prefixes(self) -> Iterator[tuple[int, int, int]]:
        """(depth in blocks, block id, number of children) of every cached node reachable
        from the root, depth first: the cached prefixes as a tree."""
        stack = [(c, 1) for c in self._root.children.values()]
        while stack:
            node, depth = stack.pop()
            if node.block is None:
                continue                            # a lookup stops here
            yield depth, node.block, len(node.children)
            stack.extend((c, depth + 1) for c in node.children.values())

    # -- the tree --
    def _key(self, tokens: Sequence[int] | None, start: int, at_root: bool, extra: int) -> tuple:
        """Edge key of the block at tokens[start:start + block_size]."""
        if tokens is None:
            raise ValueError(_NEEDS_TOKENS)
        bs = self.block_size
        block = tuple(tokens[start:start + bs])
        if len(block) != bs:
            raise ValueError(f"publish needs the block's {bs} token ids, got {len(block)}")
        return (extra, block) if at_root else block

    def _walk(self, block_hashes: Sequence[int], tokens: Sequence[int] | None,
              extra: int) -> Iterator[_Node]:
        """Nodes of the longest cached prefix, at most len(block_hashes) blocks deep."""
        if tokens is None:
            raise ValueError(_NEEDS_TOKENS)
        bs = self.block_size
        n = min(len(block_hashes), len(tokens) // bs)
        node = self._root
        for i in range(n):
            key = tuple(tokens[i * bs:(i + 1) * bs])
            node = node.children.get((extra, key) if i == 0 else key)
            if node is None or node.block is None:
                return
            yield node

    def _attach(self, node: _Node, key: tuple, parent: int | None) -> bool:
        """Hang a detached node under its parent (found by hash; a detached empty
        placeholder when that parent was never published, as the hash chain keeps an
        orphan's hash). False when the slot is taken by a node of another hash."""
        if parent is None:
            up = self._root
        else:
            up = self._by_hash.get(parent)
            if up is None:
                up = self._by_hash[parent] = _Node(parent)
        if key in up.children:
            return False
        up.children[key] = node
        node.key, node.parent = key, up
        return True

    def _evict(self, b: int) -> int:
        node = self._cached.pop(b)
        node.block = None
        self._prune(node)
        return node.hash

    def _prune(self, node: _Node) -> None:
        """Drop empty childless nodes, walking up (an empty node with children stays: its
        subtree is reachable again once its prefix is republished)."""
        while node is not self._root and node.block is None and not node.children:
            del self._by_hash[node.hash]
            up = node.parent
            if up is None:                           # a detached placeholder
                return
            del up.children[node.key]
            node = up

    def __repr__(self) -> str:
        held = self.num_blocks - self.num_free_blocks()
        return (f"RadixAllocator(blocks={self.num_blocks}x{self.block_size}, "
                f"free={self.num_free_blocks()} ({len(self._lru)} evictable cached), "
                f"held={held}, cached={len(self._cached)}, nodes={len(self._by_hash)})")

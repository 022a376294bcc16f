"""Conformance suite for block allocators: a hypothesis state machine run step by step
against ReferenceAllocator.

    from toolkit.testing import check_allocator
    check_allocator(MyAllocator)                         # factory(num_blocks, block_size)
    check_allocator(MyPlainAllocator, prefix_caching=False)

Besides the BlockAllocator protocol the suite needs `ref_count(block_id)` and
`num_cached_blocks()`; an allocator with `keyed_by_tokens = True` also gets the tokens behind
the hashes (blocks/base.py); `num_reserved` (default 0) tells it how many ids the allocator
never hands out. Block ids may differ from the reference's (fresh blocks may come in any
order), so the machine pairs each allocator id with the reference id handed out in the
same position, and checks that evictions and lookup hits pick the paired blocks.

Invariants, after every step:
- num_free_blocks() (never-cached free + unreferenced cached) equals the reference's, and
  num_free_blocks() + #blocks with ref_count > 0 == num_blocks - num_reserved;
- ref_count of every block equals how often the simulated requests hold it (and the
  reference's count for the paired block); num_cached_blocks() equals the reference's;
- a block is never handed out while referenced; ids are distinct and in range;
- a lookup hit holds the whole token prefix (extra key and tokens) it was looked up for;
  the machine records what each block holds when a request writes it;
- with no request left, every block is free again;
- bad input (over-allocation, unheld or over-freed blocks, bad counts) raises and changes
  nothing that can be observed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from toolkit.blocks.base import OutOfBlocks
from toolkit.blocks.hashing import hash_blocks
from toolkit.blocks.reference import ReferenceAllocator

Factory = Callable[[int, int], Any]
# Prompts: one of a few shared "system prompts" + a short random tail, so that lookups hit
# several blocks deep; a small alphabet makes chance overlaps common too.
PREFIXES = [(), (1, 1, 1, 1), (1, 1, 1, 1, 2, 0), (0, 2, 0, 2, 0)]
TOKENS = st.builds(lambda p, t: list(p + tuple(t)), st.sampled_from(PREFIXES),
                   st.lists(st.integers(0, 2), max_size=4)).filter(len)
EXTRA = st.sampled_from([0, 0, 0, 7])                           # cache salt / adapter id
BAD_COUNTS = [-1, -3, 1.5, "2", None]


def _expect(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(msg)


class _Req:
    """A simulated request: its tokens (None = filler with no content) and impl block ids."""

    def __init__(self, tokens: tuple[int, ...] | None, extra: int, blocks: list[int]) -> None:
        self.tokens, self.extra, self.blocks = tokens, extra, blocks


def allocator_state_machine(factory: Factory, *, prefix_caching: bool = True, num_blocks: int = 10,
                            block_size: int = 2) -> type[RuleBasedStateMachine]:
    """The state machine class for `factory`; use `.TestCase` for unittest/pytest collection."""

    class AllocatorMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.impl = factory(num_blocks, block_size)
            self.total = num_blocks - int(getattr(self.impl, "num_reserved", 0))
            self.ref = ReferenceAllocator(self.total, block_size, prefix_caching=prefix_caching)
            self.bs = block_size
            self.to_ref: dict[int, int] = {}      # impl id -> ref id, for held or cached blocks
            self.to_impl: dict[int, int] = {}
            self.content: dict[int, Any] = {}     # impl id -> what its slots hold (physical)
            self.reqs: dict[int, _Req] = {}
            self.next_id = 0
            # an allocator keyed by tokens (blocks/base.py) gets the tokens behind each hash
            self.by_tokens = bool(getattr(self.impl, "keyed_by_tokens", False))
            self.token_key: dict[int, dict] = {}  # hash -> publish's token arguments

        # -- helpers --
        def held(self) -> Counter:
            return Counter(b for r in self.reqs.values() for b in r.blocks)

        def snapshot(self) -> tuple:
            i = self.impl
            return (i.num_free_blocks(), i.num_cached_blocks(),
                    tuple(i.ref_count(b) for b in range(num_blocks)))

        def key(self, req: _Req, i: int) -> Any:
            """What block i of req holds: its whole prefix if full, else a private partial key."""
            if req.tokens is None:
                return ("filler", id(req), i)
            end = (i + 1) * self.bs
            if end <= len(req.tokens):
                return (req.extra, req.tokens[:end])
            return ("partial", id(req), i, req.tokens[i * self.bs:])

        def pair_allocated(self, a_ids: list[int], r_ids: list[int]) -> None:
            held = self.held()
            _expect(len(a_ids) == len(r_ids), f"allocate returned {len(a_ids)} blocks, asked {len(r_ids)}")
            _expect(len(set(a_ids)) == len(a_ids), f"allocate returned a block twice: {a_ids}")
            for a, r in zip(a_ids, r_ids):
                _expect(isinstance(a, int) and 0 <= a < num_blocks,
                        f"allocate returned {a!r}, not an id in [0, {num_blocks})")
                _expect(a not in held, f"allocate handed out block {a} while it is referenced")
                if r in self.to_impl or a in self.to_ref:
                    _expect(self.to_impl.get(r) == a,
                            f"allocate took block {a} where the reference "
                            + (f"evicted the least recently freed cached block (yours: {self.to_impl[r]})"
                               if r in self.to_impl else "took a never-cached free block")
                            + "; policy: never-cached free blocks first, then evict LRU")
                self.unpair(a)
                self.unpair_ref(r)
                self.to_ref[a], self.to_impl[r] = r, a

        def unpair(self, a: int) -> None:
            r = self.to_ref.pop(a, None)
            if r is not None:
                del self.to_impl[r]

        def unpair_ref(self, r: int) -> None:
            a = self.to_impl.pop(r, None)
            if a is not None:
                del self.to_ref[a]

        def after_free(self, a_ids: list[int]) -> None:
            for a in set(a_ids):
                r = self.to_ref[a]
                if self.ref.ref_count(r) == 0 and r not in self.ref.hash_of:
                    self.unpair(a)

        def lookup(self, tokens: tuple[int, ...], extra: int) -> tuple[list[int], list[int]]:
            hashes = hash_blocks(list(tokens), self.bs, extra)
            free = self.impl.num_free_blocks()
            kw = {"tokens": list(tokens), "extra": extra} if self.by_tokens else {}
            peeked = self.impl.peek(hashes, **kw)       # a look that takes nothing
            _expect(self.impl.num_free_blocks() == free, "peek changed the number of free blocks")
            a_hits = [int(b) for b in self.impl.lookup(hashes, **kw)]
            _expect(peeked == len(a_hits), f"peek said {peeked} blocks would hit, lookup hit {len(a_hits)}")
            r_hits = self.ref.lookup(hashes)
            _expect(len(a_hits) == len(r_hits), f"lookup hit {len(a_hits)} blocks, the reference "
                    f"{len(r_hits)} (prefix caching {'on' if prefix_caching else 'off'})")
            for i, (a, r) in enumerate(zip(a_hits, r_hits)):
                want = (extra, tokens[:(i + 1) * self.bs])
                _expect(self.content.get(a) == want, f"lookup hit block {a} at position {i} holds "
                        f"{self.content.get(a)!r}, not the prefix {want!r}")
                _expect(self.to_ref.get(a) == r, f"lookup hit block {a}, which is not the block "
                        "the reference hit (the one published first under that hash)")
            return a_hits, r_hits

        def publish(self, req: _Req, first: int, stop: int) -> None:
            hashes = hash_blocks(list(req.tokens), self.bs, req.extra)
            for i in range(first, stop):
                self.token_key[hashes[i]] = {"tokens": list(req.tokens[i * self.bs:(i + 1) * self.bs]),
                                             "parent": hashes[i - 1] if i else None, "extra": req.extra}
                self.impl.publish(req.blocks[i], hashes[i], **self.publish_kw(hashes[i]))
                self.ref.publish(self.to_ref[req.blocks[i]], hashes[i])

        def publish_kw(self, block_hash: int) -> dict:
            return self.token_key[block_hash] if self.by_tokens else {}

        def pick(self, data: Any, with_tokens: bool = False) -> int:
            ids = sorted(k for k, r in self.reqs.items() if not with_tokens or r.tokens is not None)
            return data.draw(st.sampled_from(ids), label="request")

        def new_req(self, req: _Req) -> None:
            self.reqs[self.next_id] = req
            self.next_id += 1

        def expect_unchanged(self, before: tuple, what: str) -> None:
            _expect(self.snapshot() == before, f"{what} raised but changed the allocator's state")

        # -- rules --
        @rule(tokens=TOKENS, extra=EXTRA, data=st.data())
        def admit(self, tokens: list[int], extra: int, data: Any) -> None:
            """Scheduler admission: lookup the cached prefix, allocate the rest, publish full blocks."""
            toks = tuple(tokens)
            a_hits, r_hits = self.lookup(toks, extra)
            need = -(-len(toks) // self.bs) - len(a_hits)
            if need > self.ref.num_free_blocks():
                before = self.snapshot()
                try:
                    self.impl.allocate(need)
                except OutOfBlocks:
                    pass
                else:
                    raise AssertionError(f"allocate({need}) with {self.ref.num_free_blocks()} free "
                                         "blocks did not raise OutOfBlocks")
                self.expect_unchanged(before, f"allocate({need})")
                self.impl.free(a_hits[::-1])
                self.ref.free(r_hits[::-1])
                self.after_free(a_hits)
                return
            a_new = [int(b) for b in self.impl.allocate(need)]
            self.pair_allocated(a_new, self.ref.allocate(need))
            req = _Req(toks, extra, a_hits + a_new)
            for i in range(len(a_hits), len(req.blocks)):
                self.content[req.blocks[i]] = self.key(req, i)
            self.new_req(req)
            full = len(toks) // self.bs
            self.publish(req, len(a_hits), data.draw(st.integers(len(a_hits), max(full, len(a_hits)))))

        @precondition(lambda self: self.reqs)
        @rule(data=st.data())
        def finish(self, data: Any) -> None:
            """Free a request's blocks in some order (that order is the eviction order)."""
            req = self.reqs.pop(self.pick(data))
            order = data.draw(st.permutations(req.blocks), label="free order")
            self.impl.free(order)
            self.ref.free([self.to_ref[b] for b in order])
            self.after_free(order)

        @precondition(lambda self: self.reqs)
        @rule(data=st.data())
        def fork(self, data: Any) -> None:
            """A parallel sample shares every block of its parent."""
            req = self.reqs[self.pick(data)]
            self.impl.fork(req.blocks)
            self.ref.fork([self.to_ref[b] for b in req.blocks])
            self.new_req(_Req(req.tokens, req.extra, list(req.blocks)))

        @precondition(lambda self: any(r.tokens is not None and r.blocks for r in self.reqs.values()))
        @rule(data=st.data(), more=st.lists(st.integers(0, 2), min_size=1, max_size=5))
        def decode(self, data: Any, more: list[int]) -> None:
            """Append tokens: copy-on-write of a shared partial last block, new blocks, publish."""
            req = self.reqs[self.pick(data, with_tokens=True)]
            old_full = len(req.tokens) // self.bs
            toks = req.tokens + tuple(more)
            last = len(req.blocks) - 1
            cow = len(req.tokens) % self.bs != 0 and self.impl.ref_count(req.blocks[last]) > 1
            n = -(-len(toks) // self.bs) - len(req.blocks) + int(cow)
            if n > self.ref.num_free_blocks():
                return                                      # the scheduler would preempt instead
            a_new = [int(b) for b in self.impl.allocate(n)]
            self.pair_allocated(a_new, self.ref.allocate(n))
            if cow:
                old, req.blocks[last] = req.blocks[last], a_new.pop(0)
                self.content[req.blocks[last]] = self.content[old]      # the copy
                self.impl.free([old])
                self.ref.free([self.to_ref[old]])
                self.after_free([old])
            req.blocks += a_new
            req.tokens = toks
            for i in range(old_full, len(req.blocks)):
                self.content[req.blocks[i]] = self.key(req, i)
            self.publish(req, old_full, len(toks) // self.bs)

        @precondition(lambda self: prefix_caching)
        @rule(data=st.data())
        def pressure(self, data: Any) -> None:
            """Allocate past the never-cached free blocks so that cached blocks get evicted."""
            fresh, evictable = len(self.ref.free_set), len(self.ref.evictable)
            if not evictable:
                return
            n = fresh + data.draw(st.integers(1, evictable), label="evictions")
            a_new = [int(b) for b in self.impl.allocate(n)]
            self.pair_allocated(a_new, self.ref.allocate(n))
            req = _Req(None, 0, a_new)
            for i, b in enumerate(a_new):
                self.content[b] = self.key(req, i)
            self.new_req(req)

        @precondition(lambda self: prefix_caching and self.reqs and self.ref.block_of)
        @rule(data=st.data())
        def publish_duplicate(self, data: Any) -> None:
            """Publish a held block under a hash another block holds: the existing one stays."""
            req = self.reqs[self.pick(data)]
            b = data.draw(st.sampled_from(req.blocks), label="block")
            h = data.draw(st.sampled_from(sorted(self.ref.block_of)), label="hash")
            self.impl.publish(b, h, **self.publish_kw(h))
            self.ref.publish(self.to_ref[b], h)

        @rule(data=st.data())
        def bad_allocate(self, data: Any) -> None:
            before = self.snapshot()
            n = data.draw(st.sampled_from(BAD_COUNTS + ["over"]), label="count")
            err: type[Exception] = ValueError
            if n == "over":
                n, err = self.ref.num_free_blocks() + data.draw(st.integers(1, 3)), OutOfBlocks
            try:
                self.impl.allocate(n)
            except err:
                pass
            else:
                raise AssertionError(f"allocate({n!r}) with {self.ref.num_free_blocks()} free did "
                                     f"not raise {err.__name__}")
            self.expect_unchanged(before, f"allocate({n!r})")

        @rule(data=st.data(), op=st.sampled_from(["free", "fork", "publish"]))
        def bad_release(self, data: Any, op: str) -> None:
            """free/fork/publish of a block that is not held (or freed more often than held)."""
            held = self.held()
            unheld = [b for b in range(num_blocks) if b not in held] + [-1, num_blocks]
            u = data.draw(st.sampled_from(unheld), label="unheld block")
            valid = list(self.reqs[self.pick(data)].blocks) if self.reqs else []
            if op == "free" and held and data.draw(st.booleans(), label="over-free"):
                b = data.draw(st.sampled_from(sorted(held)), label="block")
                ids = [b] * (held[b] + 1)
            else:
                ids = data.draw(st.permutations(valid + [u]), label="order")
            before = self.snapshot()
            try:
                if op == "publish":
                    ids = [u]
                    self.impl.publish(u, 123, **({"tokens": [0] * self.bs} if self.by_tokens else {}))
                else:
                    getattr(self.impl, op)(ids)
            except ValueError:
                pass
            else:
                raise AssertionError(f"{op}({ids}) of a block that is not held did not raise ValueError")
            self.expect_unchanged(before, f"{op}({ids})")

        # -- invariants --
        @invariant()
        def counts_match(self) -> None:
            i, r = self.impl, self.ref
            _expect(i.num_free_blocks() == r.num_free_blocks(),
                    f"num_free_blocks() is {i.num_free_blocks()}, the reference's {r.num_free_blocks()}")
            want = r.num_cached_blocks() if prefix_caching else 0
            _expect(i.num_cached_blocks() == want, f"num_cached_blocks() is {i.num_cached_blocks()}, expected {want}")
            held = self.held()
            for b in range(num_blocks):
                _expect(i.ref_count(b) == held.get(b, 0),
                        f"ref_count({b}) is {i.ref_count(b)}; the requests hold it {held.get(b, 0)} times")
            for b, c in held.items():
                _expect(r.ref_count(self.to_ref[b]) == c, "internal: reference ref count out of step")
            _expect(i.num_free_blocks() + len(held) == self.total,
                    f"free ({i.num_free_blocks()}) + referenced ({len(held)}) != total ({self.total})")
            if not self.reqs:
                _expect(i.num_free_blocks() == self.total,
                        f"every request freed its blocks but only {i.num_free_blocks()} of {self.total} are free")

    AllocatorMachine.__name__ = f"AllocatorMachine_{getattr(factory, '__name__', 'factory')}"
    return AllocatorMachine


def check_allocator(factory: Factory, *, prefix_caching: bool = True, num_blocks: int = 10,
                    block_size: int = 2, max_examples: int | None = None,
                    stateful_step_count: int = 40, shrink: bool = True) -> None:
    """Run the conformance state machine; raises AssertionError (shrunk) on the first violation.

    factory(num_blocks, block_size) -> allocator. prefix_caching=False compares with
    ReferenceAllocator(prefix_caching=False): lookups must miss and nothing is cached.
    max_examples=None takes the loaded hypothesis profile's value; shrink=False reports the
    first failing run unshrunk (much faster when a failure is expected).
    """
    if not isinstance(num_blocks, int) or num_blocks < 2 or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"need num_blocks >= 2 and block_size >= 1, got {num_blocks}, {block_size}")
    kw: dict[str, Any] = {"stateful_step_count": stateful_step_count, "deadline": None,
                              "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much]}
    if max_examples is not None:
        kw["max_examples"] = max_examples
    if not shrink:
        kw["phases"] = [Phase.explicit, Phase.reuse, Phase.generate]
    machine = allocator_state_machine(factory, prefix_caching=prefix_caching,
                                      num_blocks=num_blocks, block_size=block_size)
    run_state_machine_as_test(machine, settings=settings(**kw))

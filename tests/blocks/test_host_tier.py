"""HostTier against its twin ReferenceHostTier (a hypothesis state machine, call by call),
its own edge cases, and HostKVCache's copies against the per-block twins (odd shapes,
poisoned buffers: a block not copied keeps the poison and fails)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from toolkit.blocks.host_kv import HostKVCache, swap_in_reference, swap_out_reference
from toolkit.blocks.host_tier import HostTier
from toolkit.blocks.reference import ReferenceHostTier

KEYS = st.integers(0, 11)


class HostTierMachine(RuleBasedStateMachine):
    @initialize(n=st.integers(1, 6))
    def setup(self, n: int) -> None:
        self.fast, self.ref = HostTier(n), ReferenceHostTier(n)
        self.owned: list[list[int]] = []        # allocations not yet freed
        self.step_slots: dict[int, str] = {}    # slot -> "w" (written) / "r" (read) this step

    def _same(self, got, want, what):
        assert got == want, f"{what}: HostTier {got!r}, reference {want!r}"

    @rule(key=KEYS)
    def store(self, key: int) -> None:
        got = self.fast.store(key)
        self._same(got, self.ref.store(key), f"store({key})")
        if got is not None:
            assert got not in self.step_slots, f"slot {got} reused within one step"
            self.step_slots[got] = "w"

    @rule(keys=st.lists(KEYS, max_size=4))
    def load(self, keys: list[int]) -> None:
        self._same(self.fast.peek(keys), self.ref.peek(keys), f"peek({keys})")
        got = self.fast.load(keys)
        self._same(got, self.ref.load(keys), f"load({keys})")
        for s in got:
            self.step_slots.setdefault(s, "r")

    @rule(n=st.integers(0, 4))
    def allocate(self, n: int) -> None:
        got = self.fast.allocate(n)
        self._same(got, self.ref.allocate(n), f"allocate({n})")
        if got is not None:
            for s in got:
                assert s not in self.step_slots, f"slot {s} reused within one step"
                self.step_slots[s] = "w"
            self.owned.append(got)

    @precondition(lambda self: self.owned)
    @rule(i=st.integers(0, 10))
    def free(self, i: int) -> None:
        slots = self.owned.pop(i % len(self.owned))
        self.fast.free(slots)
        self.ref.free(slots)

    @rule()
    def begin_step(self) -> None:
        self.fast.begin_step()
        self.ref.begin_step()
        self.step_slots = {}

    @invariant()
    def agree(self) -> None:
        if not hasattr(self, "fast"):
            return
        self.fast.check()
        for name in ("num_free_slots", "num_cached", "num_owned"):
            self._same(getattr(self.fast, name)(), getattr(self.ref, name)(), name)
        assert self.fast.num_owned() == sum(map(len, self.owned))


TestHostTierMatchesReference = HostTierMachine.TestCase
TestHostTierMatchesReference.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)


def test_lru_pinning_and_inclusive_hits() -> None:
    h = HostTier(2)
    assert (h.store(10), h.store(11)) == (0, 1)
    assert h.store(12) is None and h.num_dropped == 1      # both pinned this step: dropped
    h.begin_step()
    assert h.load([10, 99, 11]) == [0]                     # stops at the first miss; 10 is MRU
    assert h.store(12) == 1 and 11 not in h                # 11 (LRU, unpinned) evicted
    assert h.store(10) is None and 10 in h                 # inclusive: a hit stays cached
    h.begin_step()
    assert h.allocate(3) is None and h.num_cached() == 2   # short: nothing changed
    slots = h.allocate(2)
    assert sorted(slots) == [0, 1] and h.num_cached() == 0
    h.free(slots)
    assert h.num_free_slots() == 0 and h.num_pending() == 2   # reusable from the next step
    h.begin_step()
    assert h.num_free_slots() == 2
    h.check()


def test_errors_name_what_is_valid() -> None:
    with pytest.raises(ValueError, match="positive integer"):
        HostTier(0)
    h = HostTier(3)
    with pytest.raises(ValueError, match="non-negative integer"):
        h.allocate(-1)
    (s,) = h.allocate(1)
    with pytest.raises(ValueError, match="not owned"):
        h.free([s, s])
    with pytest.raises(ValueError, match="not owned"):
        h.free([2])
    h.check()


@settings(max_examples=25, deadline=None)
@given(num_blocks=st.integers(1, 9), num_slots=st.integers(1, 9), layers=st.integers(1, 3),
       bs=st.sampled_from([1, 3, 4]), heads=st.integers(1, 3), dim=st.sampled_from([1, 5, 8]),
       dtype=st.sampled_from([torch.float32, torch.float16]), data=st.data())
def test_copies_match_the_twins(num_blocks, num_slots, layers, bs, heads, dim, dtype, data) -> None:
    n = data.draw(st.integers(0, min(num_blocks, num_slots)))
    blocks = data.draw(st.permutations(range(num_blocks)))[:n]
    slots = data.draw(st.permutations(range(num_slots)))[:n]
    cache = [torch.randn(2, num_blocks, bs, heads, dim).to(dtype) for _ in range(layers)]
    fast = HostKVCache(num_slots, layers, bs, heads, dim, dtype)
    twin = HostKVCache(num_slots, layers, bs, heads, dim, dtype)
    fast.slots.fill_(float("nan"))
    twin.slots.fill_(float("nan"))
    fast.swap_out(cache, list(zip(blocks, slots)))
    swap_out_reference(twin, cache, list(zip(blocks, slots)))
    assert torch.equal(fast.slots.isnan(), twin.slots.isnan())
    assert torch.equal(fast.slots.nan_to_num(7.0), twin.slots.nan_to_num(7.0))
    # poison the device blocks, bring the slots back into a shuffled set of blocks
    back = data.draw(st.permutations(range(num_blocks)))[:n]
    got = [c.clone().fill_(float("nan")) for c in cache]
    want = [c.clone().fill_(float("nan")) for c in cache]
    fast.swap_in(got, list(zip(slots, back)))
    swap_in_reference(twin, want, list(zip(slots, back)))
    for g, w, c in zip(got, want, cache):
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(7.0), w.nan_to_num(7.0))
        for b, d in zip(blocks, back):                   # the bytes came back, block for block
            assert torch.equal(g[:, d], c[:, b])


def test_poisoned_block_is_restored_bytewise() -> None:
    """Swap a block out, poison it on the device, swap it back into the same block."""
    cache = [torch.randn(2, 5, 4, 2, 8) for _ in range(3)]
    saved = [c[:, 3].clone() for c in cache]
    host = HostKVCache(4, 3, 4, 2, 8, torch.float32)
    host.swap_out(cache, [(3, 2)])
    for c in cache:
        c[:, 3] = float("nan")
    host.swap_in(cache, [(2, 3)])
    for c, s in zip(cache, saved):
        assert torch.equal(c[:, 3], s)


def test_bad_pairs_and_shapes_are_refused() -> None:
    host = HostKVCache(4, 2, 4, 2, 8, torch.float32)
    cache = [torch.zeros(2, 5, 4, 2, 8) for _ in range(2)]
    with pytest.raises(ValueError, match="host slot must be in"):
        host.swap_out(cache, [(0, 4)])
    with pytest.raises(ValueError, match="device block in"):
        host.swap_in(cache, [(0, 5)])
    with pytest.raises(ValueError, match="layers"):
        host.swap_out(cache[:1], [(0, 0)])
    with pytest.raises(ValueError, match="layer cache must be"):
        host.swap_out([torch.zeros(2, 5, 4, 2, 7)] * 2, [(0, 0)])


@pytest.mark.gpu
def test_cuda_copies_match_the_twins_across_chunks() -> None:
    """On CUDA: pinned pool, staged non_blocking copies, more pairs than one staging chunk,
    runs of consecutive slots and scattered ones; bf16 and fp8 (copied as bytes)."""
    from toolkit.blocks import host_kv

    dev = torch.device("cuda")
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        nb, ns = 300, 200
        cache = [torch.randn(2, nb, 16, 8, 128, device=dev).to(dtype) for _ in range(4)]
        fast = HostKVCache(ns, 4, 16, 8, 128, dtype, pin=True)
        assert fast.slots.is_pinned()
        g = torch.Generator().manual_seed(0)
        blocks = torch.randperm(nb, generator=g)[:host_kv.CHUNK * 2 + 5].tolist()
        slots = list(range(10, 10 + 70)) + torch.randperm(ns, generator=g)[:200].tolist()
        slots = list(dict.fromkeys(slots))[:len(blocks)]
        fast.swap_out(cache, list(zip(blocks, slots)))
        back = torch.randperm(nb, generator=g)[:len(blocks)].tolist()
        out = [torch.empty_like(c) for c in cache]
        for o in out:
            o.view(torch.uint8).fill_(0xFF)                       # poison: NaN in bf16 and e4m3
        fast.swap_in(out, list(zip(slots, back)))
        torch.cuda.synchronize()
        for o, c in zip(out, cache):
            assert torch.equal(o.view(torch.uint8)[:, back], c.view(torch.uint8)[:, blocks])

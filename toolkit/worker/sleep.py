"""Sleep mode on one rank: free the device memory of the weights and the KV cache, and bring
it back, without rebuilding a tensor (vLLM's sleep levels).

    weights   every parameter and buffer of the model (tag "weights")
    kv_cache  the KVCache's per-layer tensors (tag "kv_cache")

A part is put to sleep by resizing the storages under its tensors to 0 bytes
(`UntypedStorage.resize_(0)`, FSDP's way of freeing a parameter): the Parameter objects, every
view of them (the CPU's transposed matrices, a tied head, a truncated draft model's shared
layers) and the KVCache's list stay the same objects, so nothing that holds them goes stale;
using one while asleep fails loudly (its storage holds 0 bytes). Waking resizes each storage
back and copies its bytes in again.

    level 1   weights' bytes copied to host memory first (pinned on CUDA); the KV is dropped
    level 2   the parameters' bytes dropped too (waking gives zeros until new weights are
              loaded); buffers, which no checkpoint restores (rotary tables, ...), still go
              to host memory, as vLLM keeps them

The storages come back at new device addresses, so a rank's CUDA graphs (which bake in the
addresses of weights, KV and the attention backend's static tables) are dropped on sleep
and rebuilt on wake by the caller (engine/sleep.py): each bucket is captured again at its
first step after wake, which costs the warm-up's capture time once.

The functions at the end are what an executor runs on every rank (`Executor.call`):
module-level, so a tensor-parallel worker process can unpickle them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

TAGS = ("weights", "kv_cache")


class _Stored:
    """One storage put to sleep: its byte size, and its bytes on the host (None: dropped)."""

    def __init__(self, storage: torch.UntypedStorage, host: torch.Tensor | None, is_param: bool) -> None:
        self.storage, self.nbytes, self.host = storage, storage.nbytes(), host
        self.is_param = is_param              # a parameter's bytes: what a checkpoint restores


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor [nbytes] over a storage (the whole allocation, whatever views use it)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _unique_storages(tensors: Iterable[torch.Tensor]) -> list[torch.UntypedStorage]:
    """Each distinct non-empty storage once (tied weights share one)."""
    seen: dict[int, torch.UntypedStorage] = {}
    for t in tensors:
        s = t.untyped_storage()
        if s.nbytes() and s.data_ptr() not in seen:
            seen[s.data_ptr()] = s
    return list(seen.values())


class RankSleeper:
    """What one rank's ModelRunner has asleep: tag -> the storages put to sleep."""

    def __init__(self) -> None:
        self.asleep: dict[str, list[_Stored]] = {}

    def tensors(self, runner: Any, tag: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(tensors whose bytes a level-2 sleep drops, tensors always kept) of a tag."""
        if tag == "kv_cache":
            return list(runner.kv_cache.layers), []
        model = runner.model
        params = [p for _, p in model.named_parameters()] if hasattr(model, "named_parameters") else []
        buffers = [b for _, b in model.named_buffers()] if hasattr(model, "named_buffers") else []
        return params, buffers

    def check(self, runner: Any, tags: Sequence[str]) -> None:
        """ValueError before anything changes if a storage of these tags cannot be freed."""
        for tag in tags:
            drop, keep = self.tensors(runner, tag)
            for s in _unique_storages(drop + keep):
                if not s.resizable():
                    raise ValueError(f"a {tag} tensor's storage is not resizable (memory torch does not "
                                     "own, e.g. from_blob / a memory map); it cannot be put to sleep")

    @torch.no_grad()
    def sleep(self, runner: Any, tag: str, keep_weights: bool) -> int:
        """Free a tag's device memory; returns the bytes freed. keep_weights: level 1 (the
        weights' bytes to host memory) rather than level 2 (buffers only)."""
        if tag in self.asleep:
            if tag == "weights" and not keep_weights:          # level 1 -> level 2: drop the copies
                for st in self.asleep[tag]:
                    if st.is_param:
                        st.host = None
            return 0
        drop, keep = self.tensors(runner, tag)
        kept = {s.data_ptr() for s in _unique_storages(keep)}
        pin = runner.device.type == "cuda"
        stored: list[_Stored] = []
        for s in _unique_storages(drop + keep):
            to_host = s.data_ptr() in kept or (tag == "weights" and keep_weights)
            host = None
            if to_host:
                host = torch.empty(s.nbytes(), dtype=torch.uint8, pin_memory=pin)
                host.copy_(_bytes_of(s))
            stored.append(_Stored(s, host, is_param=s.data_ptr() not in kept))
        if pin:
            torch.cuda.synchronize(runner.device)               # the copies read the device memory
        for st in stored:
            st.storage.resize_(0)
        self.asleep[tag] = stored
        return sum(st.nbytes for st in stored)

    @torch.no_grad()
    def wake(self, runner: Any, tag: str) -> None:
        """Re-allocate a tag's storages: host copies copied back, dropped ones zeroed."""
        stored = self.asleep.pop(tag, None)
        if stored is None:
            return
        for st in stored:
            st.storage.resize_(st.nbytes)
            dest = _bytes_of(st.storage)
            if st.host is not None:
                dest.copy_(st.host, non_blocking=True)
            elif tag == "weights":
                dest.zero_()                  # discarded weights: zeros, until loaded again
        if runner.device.type == "cuda":
            torch.cuda.synchronize(runner.device)               # before the host copies are freed


def sleeper_of(runner: Any) -> RankSleeper:
    s = getattr(runner, "sleeper", None)
    if s is None:
        s = runner.sleeper = RankSleeper()
    return s


# -- run on every rank through Executor.call(fn, *args): fn(ModelRunner, *args) --

def check_rank(runner: Any, tags: Sequence[str]) -> None:
    sleeper_of(runner).check(runner, tags)


def sleep_rank(runner: Any, tags: Sequence[str], level: int) -> int:
    """Put these tags to sleep on this rank (its CUDA graphs dropped first: they reference the
    memory); returns the device bytes freed."""
    runner.graphs = None
    freed = sum(sleeper_of(runner).sleep(runner, tag, keep_weights=level == 1) for tag in tags)
    if runner.device.type == "cuda":
        torch.cuda.empty_cache()              # back to the driver, not only to torch's cache
    return freed


def wake_rank(runner: Any, tags: Sequence[str]) -> None:
    for tag in tags:
        sleeper_of(runner).wake(runner, tag)


def load_rank(runner: Any, weights: Sequence[tuple[str, Any]]) -> set[tuple[str, int]]:
    """model.load_weights on this rank: each layer's loader copies its slice in place."""
    with torch.no_grad():
        loaded = runner.model.load_weights(iter(weights))
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    return set(loaded or ())


def snapshot_rank(runner: Any) -> None:
    """Host copies of every parameter, kept on the rank: the rollback of an update to a model
    that cannot check a whole update before loading it."""
    runner.weights_snapshot = {n: p.detach().to("cpu", copy=True) for n, p in runner.model.named_parameters()}


def restore_rank(runner: Any, restore: bool) -> None:
    """Copy the snapshot back (restore=True: the update failed), then drop it."""
    saved = getattr(runner, "weights_snapshot", None)
    runner.weights_snapshot = None
    if restore and saved is not None:
        with torch.no_grad():
            for n, p in runner.model.named_parameters():
                p.copy_(saved[n])

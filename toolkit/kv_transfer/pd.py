"""PDConnector: prefill/decode disaggregation through a shared KV store.

A producer engine (kv_role "kv_producer") prefills a request and samples its first token;
when the request finishes there (the proxy gives it max_tokens=1), `request_finished`
saves every block of its computed tokens, the partial last one included, under handoff
keys (request id + the tokens' hash + block index) and holds the blocks until the copy is
in the store. A consumer engine (kv_role "kv_consumer") is given the same request id, the
prompt followed by the first token, and the remaining budget (`handoff_request`): its
connector finds the handoff, loads positions [local prefix hit, prompt length) into the
request's blocks, and the request goes on as if it had prefilled there: its first
computed token is the first sampled one, at the position after the prompt. Given the
prompt alone (vLLM's proxy, the HTTP one here: kv_transfer/http_proxy.py), it loads all
but the last prompt token, computes that one again and samples the first token itself. The consumer
removes a handoff once loaded. The keys hash the tokens, so a consumer never loads KV
computed for other tokens under the same id.

The store is a MemoryKVStore shared by two engines in one process, or a DiskKVStore over a
directory both processes see (the server: `python -m toolkit.serve --kv-role ...`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from toolkit.kv_transfer.base import KV_ROLES
from toolkit.kv_transfer.store_connector import StoreConnector, Transfer


def handoff_keys(request_id: str, token_ids: Sequence[int], block_size: int) -> list[str]:
    """Store keys of the blocks covering token_ids (a partial last block included)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(request_id.encode())
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    base = h.hexdigest()
    return [f"pd-{base}-{i}" for i in range(-(-len(token_ids) // block_size))]


def handoff_request(prompt_token_ids: Sequence[int], params: Any, first_token: int) -> tuple[list[int], Any]:
    """What a proxy sends the consumer after the producer sampled `first_token`: the prompt
    followed by it, and the sampling parameters less the token already produced. The first
    token is then a prompt token on the consumer: penalties do not count it and a seeded
    request's draws start again, so for those send the prompt alone (the consumer samples
    the first token itself; proxy.disaggregated_generate does)."""
    left = params.max_tokens - 1
    if left < 1:
        raise ValueError(f"max_tokens={params.max_tokens}: the producer's first token was the whole output; "
                         "nothing is left for the consumer")
    changes: dict[str, Any] = {"max_tokens": left}
    if getattr(params, "min_tokens", 0):
        changes["min_tokens"] = max(0, params.min_tokens - 1)
    return list(prompt_token_ids) + [int(first_token)], dataclasses.replace(params, **changes)


class PDConnector(StoreConnector):
    """`handoff_wait_s` (a consumer, async loads): a request whose handoff is not in the store
    yet is parked (WAITING_FOR_REMOTE_KVS) and its load waits up to that long for the
    producer's write to land, then reads it; past that it fails and the request is
    recomputed. The HTTP proxy sends the decode as soon as the prefill answered, which can
    be before the producer's I/O thread wrote the blocks; 0 (in-process handoffs, written
    before the consumer is asked): a missing handoff is recomputed at once."""

    def __init__(self, store: Any, block_size: int, role: str, *, load_async: bool = True,
                 handoff_wait_s: float = 0.0) -> None:
        if role not in KV_ROLES[:2]:
            raise ValueError(f"PDConnector role must be one of {KV_ROLES[:2]}, got {role!r}")
        if not (isinstance(handoff_wait_s, (int, float)) and handoff_wait_s >= 0):
            raise ValueError(f"handoff_wait_s must be a number of seconds >= 0, got {handoff_wait_s!r}")
        super().__init__(store, block_size, load_async=load_async)
        self.role = role
        self.handoff_wait_s = float(handoff_wait_s)
        self._covered: dict[str, list[str]] = {}    # handoff blocks a local prefix hit made unneeded
        self._awaited: set[str] = set()             # requests whose handoff had not landed yet
        self._drop_after: dict[str, list[str]] = {}  # their unneeded keys, removed after the load
        self.num_handoffs = 0

    # -- scheduler side --
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        self._matched.pop(request.request_id, None)
        if self.role != "kv_consumer" or num_computed_tokens % self.block_size:
            return 0, False
        first = num_computed_tokens // self.block_size
        for n in (request.num_tokens - 1, request.num_tokens):
            # n = num_tokens - 1: the prompt was sent with the first token after it (handoff_request);
            # n = num_tokens: the prompt alone (vLLM's proxy): its last token is computed here again
            keys = handoff_keys(request.request_id, request.all_token_ids[:n], self.block_size)
            if n - 1 > num_computed_tokens and self.store.lookup(keys[first:]) == len(keys) - first:
                self._matched[request.request_id] = (first, keys[first:])
                self._covered[request.request_id] = keys[:first]
                return min(n, request.num_tokens - 1) - num_computed_tokens, self.load_async
        if self.handoff_wait_s > 0 and self.load_async:
            # not landed yet: expect the prompt-alone form (the HTTP proxy's) and wait for it
            n = request.num_tokens
            keys = handoff_keys(request.request_id, request.all_token_ids[:n], self.block_size)
            if n - 1 > num_computed_tokens and len(keys) > first:
                self._matched[request.request_id] = (first, keys[first:])
                self._covered[request.request_id] = keys[:first]
                self._awaited.add(request.request_id)
                return n - 1 - num_computed_tokens, True
        return 0, False

    def update_state_after_alloc(self, request: Any, block_ids: Sequence[int], num_external_tokens: int) -> None:
        rid = request.request_id
        first, keys = self._matched.pop(rid)
        need = -(-(first * self.block_size + num_external_tokens) // self.block_size) - first
        # handoff blocks it will not load: a local prefix hit covers them, or its last prompt
        # token is computed again; dropped now, or once an awaited handoff has landed
        unneeded = self._covered.pop(rid, []) + keys[need:]
        keys = keys[:need]
        blocks = list(block_ids[first:first + need])
        assert len(blocks) == need, "the consumer's blocks do not cover the handoff"
        wait = self.handoff_wait_s if rid in self._awaited else 0.0
        self._awaited.discard(rid)
        if wait:
            self._drop_after[rid] = unneeded
        else:
            for k in unneeded:
                self.store.remove(k)
        self._loads.append(Transfer(rid, list(zip(keys, blocks)), self.load_async, wait))
        self.num_hit_blocks += len(keys)

    def request_finished(self, request: Any, block_ids: Sequence[int]) -> tuple[bool, dict | None]:
        self._matched.pop(request.request_id, None)
        self._covered.pop(request.request_id, None)
        self._awaited.discard(request.request_id)
        self._drop_after.pop(request.request_id, None)     # a load that failed: nothing to drop after
        if self.role != "kv_producer" or request.status.name in ("FINISHED_ABORTED", "FINISHED_IGNORED"):
            return False, None
        n = request.num_computed_tokens
        keys = handoff_keys(request.request_id, request.all_token_ids[:n], self.block_size)
        if not keys or len(block_ids) < len(keys):
            return False, None
        self._saves.append(Transfer(request.request_id, list(zip(keys, block_ids[:len(keys)]))))
        self.num_handoffs += 1
        return True, {"transfer_id": request.request_id, "num_tokens": n}

    # -- worker side --
    def _read(self, t: Transfer) -> Any:
        """On the I/O thread: an awaited handoff's keys polled until they all landed (or
        t.wait_s passed: the read below then fails and the request is recomputed)."""
        if t.wait_s > 0:
            keys, deadline = [k for k, _ in t.pairs], time.monotonic() + t.wait_s
            while self.store.lookup(keys) < len(keys) and time.monotonic() < deadline:
                time.sleep(0.005)
        return super()._read(t)

    def _copy_in(self, t: Transfer, blocks: Any) -> None:
        super()._copy_in(t, blocks)
        for k in [k for k, _ in t.pairs] + self._drop_after.pop(t.request_id, []):
            self.store.remove(k)                    # consumed: the handoff is not kept

    def load_finished(self, request_id: str) -> None:
        """Under TP the ranks drop their loaded keys; the handoff blocks a local hit made
        unneeded for an awaited handoff are dropped from every rank here (after it landed)."""
        for k in self._drop_after.pop(request_id, []):
            self.store.remove(k)

    def __repr__(self) -> str:
        return (f"PDConnector({self.role}, {self.store!r}, handoffs={self.num_handoffs}, "
                f"loaded={self.num_loaded_blocks}, failed={self.num_failed_blocks})")

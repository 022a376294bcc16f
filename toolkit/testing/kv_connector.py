"""Conformance check for KV connectors (toolkit/kv_transfer/base.py), without a model.

    from toolkit.testing import check_kv_connector
    check_kv_connector(saver, loader, num_layers=2, block_size=4, num_kv_heads=2, head_dim=8)

`saver` and `loader` are connectors built for KV blocks of that geometry (the same object
for a cache such as the disk tier; a producer and a consumer for prefill/decode). The check
gives each its own random KV cache and plays the scheduler and the runner
(kv_transfer/worker.py's connector_step), checking that:
- a request nobody saved matches 0 tokens;
- a finished request (prompt of 3.5 blocks, one output token) whose save is delayed
  (request_finished -> delay_free) is reported in finished_sending exactly once, and a
  request not delayed never is; once reported, the saver's blocks may be overwritten (they
  are poisoned here) without changing what is loaded later;
- the same tokens (a new request, or the same request id with `same_request_id=True`)
  match n > 0 tokens, at most num_tokens - 1, a (int, bool) pair; after
  update_state_after_alloc and the steps (an async load: reported in finished_recving
  exactly once; a sync load: done after one step), the loaded positions [0, n) hold the
  saver's values bit for bit, the request's block after them untouched, and no load
  error is reported;
- build_connector_meta returns a KVConnectorMetadata; a local hit of one block bounds the
  match to num_tokens - 1 - block_size.
Raises AssertionError naming the broken rule.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from toolkit.kv_transfer.base import KVConnectorMetadata
from toolkit.kv_transfer.worker import connector_step
from toolkit.types import Request, RequestStatus, SamplingParams, SchedulerOutput


class _Side:
    """One connector with its own KV cache, stepped like a runner."""

    def __init__(self, connector: Any, shape: tuple, num_blocks: int, dtype: torch.dtype, seed: int,
                 device: str) -> None:
        L, _, bs, H, D = shape
        g = torch.Generator().manual_seed(seed)
        self.c = connector
        self.layers = [torch.randn(2, num_blocks, bs, H, D, generator=g).to(device=device, dtype=dtype)
                       for _ in range(L)]
        connector.register_kv_caches(self.layers)
        self.sent: list[str] = []
        self.recv: list[str] = []
        self.errors: set[int] = set()

    def step(self, finished: list[str] = ()) -> None:
        meta = self.c.build_connector_meta(SchedulerOutput(finished_ids=list(finished)))
        assert isinstance(meta, KVConnectorMetadata), \
            f"build_connector_meta must return a KVConnectorMetadata, got {type(meta).__name__}"
        out = SchedulerOutput(finished_ids=list(finished), kv_connector_metadata=meta)
        kvo = connector_step(self.c, out, len(self.layers))
        self.sent += kvo.finished_sending
        self.recv += kvo.finished_recving
        self.errors |= kvo.invalid_block_ids

    def poll(self, done, timeout_s: float) -> bool:
        t = time.monotonic()
        while not done():
            if time.monotonic() - t > timeout_s:
                return False
            self.step()
            time.sleep(0.001)
        return True

    def tokens_at(self, blocks: list[int], n: int) -> list[torch.Tensor]:
        """Per layer the KV of the first n token positions of these blocks, [2, n, H, D]."""
        out = []
        for layer in self.layers:
            flat = layer[:, blocks].flatten(1, 2)            # [2, len * bs, H, D]
            out.append(flat[:, :n].clone())
        return out


def check_kv_connector(saver: Any, loader: Any = None, *, num_layers: int, block_size: int,
                       num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.float32,
                       same_request_id: bool = False, num_blocks: int = 32, timeout_s: float = 20.0,
                       device: str = "cpu") -> None:
    loader = saver if loader is None else loader
    bs = block_size
    shape = (num_layers, 2, bs, num_kv_heads, head_dim)
    s = _Side(saver, shape, num_blocks, dtype, 1, device)
    ld = s if loader is saver else _Side(loader, shape, num_blocks, dtype, 2, device)
    params = SamplingParams(temperature=0.0, max_tokens=8)

    # a miss
    fresh = Request("kvc-miss", [(5 * j + 1) % 97 + 3 for j in range(3 * bs + 1)], params)
    n, _ = ld.c.get_num_new_matched_tokens(fresh, 0)
    assert n == 0, f"a request nobody saved matched {n} tokens"

    # save a finished request: 3.5 blocks of prompt, one output token
    P = 3 * bs + bs // 2 + 1
    prompt = [(7 * j + 3) % 101 + 5 for j in range(P)]
    a = Request("kvc-a", prompt, params)
    a.output_token_ids = [42]
    a.num_computed_tokens = P
    blocks_a = [3, 9, 4, 11]
    a.block_ids = list(blocks_a)
    a.status = RequestStatus.FINISHED_LENGTH
    expect = s.tokens_at(blocks_a, P)
    delay, params_out = s.c.request_finished(a, list(blocks_a))
    assert isinstance(delay, bool) and (params_out is None or isinstance(params_out, dict)), \
        f"request_finished must return (bool, dict | None), got {(delay, params_out)!r}"
    if delay:
        assert s.poll(lambda: "kvc-a" in s.sent, timeout_s), "a delayed save was never reported in finished_sending"
        for layer in s.layers:                               # the blocks are free now: reused
            layer[:, blocks_a] = float("nan")
    s.step()
    assert s.sent.count("kvc-a") == (1 if delay else 0), \
        f"finished_sending reported kvc-a {s.sent.count('kvc-a')} times (delay_free={delay})"

    # load it back
    b = Request("kvc-a" if same_request_id else "kvc-b", prompt + [42], params)
    n, is_async = ld.c.get_num_new_matched_tokens(b, 0)
    assert isinstance(n, int) and isinstance(is_async, bool), f"got {(n, is_async)!r}; want (int, bool)"
    assert 0 < n <= b.num_tokens - 1, f"matched {n} tokens of {b.num_tokens}; valid: 1 .. {b.num_tokens - 1}"
    nb = -(-n // bs)
    blocks_b = [20 + 2 * i for i in range(nb)][::-1] if num_blocks > 20 + 2 * nb else list(range(nb))
    spare = num_blocks - 1                       # the block after them: never written
    for layer in ld.layers:
        layer[:, blocks_b + [spare]] = float("nan")
    b.block_ids = list(blocks_b) + [spare]
    ld.c.update_state_after_alloc(b, list(b.block_ids), n)
    ld.step()
    if is_async:
        assert ld.poll(lambda: b.request_id in ld.recv, timeout_s), "an async load was never reported in finished_recving"
        ld.step()
        assert ld.recv.count(b.request_id) == 1, f"finished_recving reported {b.request_id} {ld.recv.count(b.request_id)} times"
    assert not ld.errors, f"load errors reported for blocks {sorted(ld.errors)}"
    got = ld.tokens_at(blocks_b, nb * bs)
    for i, (g, e) in enumerate(zip(got, expect)):
        assert torch.equal(g[:, :n], e[:, :n]), f"layer {i}: loaded positions [0, {n}) differ from the saved ones"
        assert torch.isnan(ld.layers[i][:, spare]).all(), f"layer {i}: a block after the {n} loaded tokens was written"

    # a local hit of one block bounds the match
    c = Request("kvc-a" if same_request_id else "kvc-c", prompt + [42], params)
    n2, _ = ld.c.get_num_new_matched_tokens(c, bs)
    assert 0 <= n2 <= c.num_tokens - 1 - bs, f"after a local hit of {bs} tokens, matched {n2} of {c.num_tokens}"
    for conn in {id(saver): saver, id(loader): loader}.values():
        r = Request("kvc-end", [1, 2, 3], params)
        r.status = RequestStatus.FINISHED_ABORTED
        conn.request_finished(r, [])                         # forget any state of the probes

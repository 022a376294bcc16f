"""Issue 54 item 6: one request's fault fails only it. A policy hook that raises for one
request ends that request with the error, and every other request finishes as usual; an
unexpected error type still ends a stream with an error event and [DONE]."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from transformers import LlamaConfig

from toolkit import LLM, SamplingParams
from toolkit.entrypoints.async_engine import AsyncEngine
from toolkit.samplers.pipeline import Sampler
from toolkit.schedulers.policies import FCFS
from toolkit.types import RequestFault

PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def config() -> LlamaConfig:
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=300, max_position_embeddings=256,
                       eos_token_id=2, bos_token_id=1)


class _RaisesFor(FCFS):
    """FCFS whose `hook` raises for the request "bad" (its samples included)."""

    def __init__(self, hook: str) -> None:
        super().__init__()
        self.hook = hook

    def _maybe(self, req) -> None:
        if req.request_id.startswith("bad"):
            raise KeyError(f"{self.hook} broke")

    def sort_key(self, r):
        if self.hook == "sort_key":
            self._maybe(r)
        return super().sort_key(r)

    def admit(self, r):
        if self.hook == "admit":
            self._maybe(r)
        return super().admit(r)

    def on_grant(self, s):
        if self.hook == "on_grant":
            self._maybe(s.request)


def _free(ae: AsyncEngine) -> bool:
    return ae.call(lambda e: not e.has_unfinished()
                   and e.allocator.num_free_blocks() == e.allocator.num_blocks).result(timeout=30)


@pytest.mark.parametrize("hook", ["sort_key", "admit", "on_grant"])
def test_a_policy_raising_for_one_request_ends_only_it(hook):
    torch.manual_seed(0)
    ae = AsyncEngine(LLM(config(), num_blocks=64, block_size=8, max_num_seqs=8, policy=_RaisesFor(hook)))
    try:
        async def one(rid: str):
            ids = []
            async for d in ae.generate([5, 6, int(rid[-1]) + 7], PARAMS, request_id=rid):
                ids += d.outputs[0].token_ids
            return ids

        async def run():
            return await asyncio.gather(*(one(f"ok{i}") for i in range(6)), one("bad0"),
                                        return_exceptions=True)
        *good, bad = asyncio.run(run())
        assert isinstance(bad, RequestFault) and hook in str(bad) and "'bad0'" in str(bad)
        assert all(isinstance(g, list) and len(g) == 6 for g in good), good
        assert _free(ae) and ae.num_unfinished == 0 and ae.is_running
    finally:
        ae.close()


class _KeyErrorSampler(Sampler):
    def __call__(self, *a, **k):
        raise KeyError("a user's sampler bug")


def test_an_unexpected_error_still_ends_the_stream_with_an_error_event():
    """Thread mode: a KeyError from a step cut the SSE stream with no error event and no
    [DONE] (only ValueError / RuntimeError were caught)."""
    from toolkit.serving.handlers import OpenAIHandlers, Prepared

    ae = AsyncEngine(LLM(config(), num_blocks=64, block_size=8, max_num_seqs=8, sampler=_KeyErrorSampler()))
    try:
        h = OpenAIHandlers(ae, "m")
        prep = Prepared("r", "m", [[5, 6, 7]], [None], [PARAMS], 0, 1)

        async def run():
            return [e async for e in h.stream(prep, chat=False, include_usage=False)]
        events = asyncio.run(run())
        assert events[-1] == "data: [DONE]\n\n"
        err = json.loads(events[-2][len("data: "):])["error"]
        assert "KeyError" in err["message"] and "sampler bug" in err["message"]
        assert _free(ae) and ae.is_running
    finally:
        ae.close()


def test_a_closed_sse_response_closes_the_handler_stream_at_once():
    """Issue 54 item 11: a client that disconnects must abort its request when it goes
    (serving/app.py `_prepend` closes the handler's stream), not when the generator is
    garbage-collected."""
    from toolkit.serving.app import _prepend

    closed = []

    async def handler_stream():
        try:
            yield "b"
            yield "c"
        finally:
            closed.append(True)             # where the handler aborts the request

    async def run():
        rest = handler_stream()
        first = await rest.__anext__()       # the server reads the first chunk before answering
        outer = _prepend(first, rest)
        assert await outer.__anext__() == "b"
        await outer.aclose()                 # what the server does when the client is gone
        return bool(closed)
    assert asyncio.run(run())


class _VictimRaises(FCFS):
    """FCFS whose victim() raises: preemption becomes a fault of the request that needed room."""

    def victim(self, running):
        raise KeyError("victim broke")


def test_a_policy_raising_in_victim_ends_only_the_request_that_needed_room():
    """Blocks run out (6 blocks for 7 requests of 2 blocks each), so a growing request needs a
    victim; victim() raises: that request ends with the error (its blocks freed), the others
    finish, nothing leaks, the engine goes on."""
    torch.manual_seed(0)
    ae = AsyncEngine(LLM(config(), num_blocks=6, block_size=8, max_num_seqs=8,
                         enable_prefix_caching=False, policy=_VictimRaises()))
    try:
        async def one(rid: str):
            ids = []
            async for d in ae.generate([5, 6, int(rid[-1]) + 7, 9, 10, 11, 12], PARAMS, request_id=rid):
                ids += d.outputs[0].token_ids
            return ids

        async def run():
            return await asyncio.gather(*(one(f"r{i}") for i in range(7)), return_exceptions=True)
        outs = asyncio.run(run())
        faults = [o for o in outs if isinstance(o, RequestFault)]
        assert faults and all("victim" in str(f) and "making room" in str(f) for f in faults), outs
        done = [o for o in outs if isinstance(o, list)]
        assert done and all(len(o) == 6 for o in done) and len(done) + len(faults) == 7, outs
        assert _free(ae) and ae.num_unfinished == 0 and ae.is_running
    finally:
        ae.close()

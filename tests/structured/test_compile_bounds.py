"""Issue 54 item 7: grammar compiles are bounded, cancelled when their requests are gone, and
small grammars never queue behind large ones."""

from __future__ import annotations

import threading
import time

import pytest

from toolkit.engine.structured import StructuredOutputManager
from toolkit.samplers.grammar import Structured
from toolkit.samplers.grammar.compiled import CompiledGrammar
from toolkit.types import Request, SamplingParams


def test_a_huge_schema_is_refused_at_once_with_what_is_valid():
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(400)}}
    t = time.perf_counter()
    with pytest.raises(ValueError, match="400 optional properties; at most 64 compile in bounded time"):
        SamplingParams(structured=Structured.json(schema))
    with pytest.raises(ValueError, match="at most 65536 are compiled"):
        Structured.regex("a" * 70_000)
    assert time.perf_counter() - t < 5
    SamplingParams(structured=Structured.json(                 # required properties stay linear
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(100)},
         "required": [f"p{i}" for i in range(100)]}))


@pytest.fixture
def manager(zoo, monkeypatch):
    """A manager whose regex compiles block until `release` is set (a slow, large grammar)."""
    tok = zoo.tokenizer("smollm2")
    release = threading.Event()
    started = []
    real = CompiledGrammar.compile

    def compile(spec, *a, **k):
        if spec.kind == "regex":
            started.append(spec.value)
            release.wait(30)
        return real(spec, *a, **k)
    monkeypatch.setattr(CompiledGrammar, "compile", staticmethod(compile))
    sm = StructuredOutputManager(tok, vocab_size=len(tok), eos_token_ids=[tok.eos_token_id],
                                 compile_timeout_s=30)
    yield sm, release, started
    release.set()
    sm.close()


def _request(rid: str, spec) -> Request:
    return Request(rid, [1, 2], SamplingParams(max_tokens=4, structured=spec))


def _wait(cond, timeout: float = 10.0) -> bool:
    """Whether cond() became true within timeout (cond is called until it is: it may consume)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_small_grammars_do_not_queue_behind_large_ones(manager):
    sm, release, started = manager
    for i in range(3):                            # more slow compiles than the pool's workers
        sm.submit(_request(f"big{i}", Structured.regex(f"[ab]+c{i}")))
    assert _wait(lambda: len(started) == 2)
    sm.submit(_request("small", Structured.choice(["yes", "no"])))
    assert _wait(lambda: any(r.request_id == "small" for r in sm.take_compiled()[0]), 20), \
        "a guided choice waited behind large compiles"


def test_a_removed_request_cancels_its_queued_compile(manager):
    sm, release, started = manager
    for i in range(2):
        sm.submit(_request(f"busy{i}", Structured.regex(f"[ab]+d{i}")))
    assert _wait(lambda: len(started) == 2)
    sm.submit(_request("gone", Structured.regex("[ab]+e")))
    fut = sm._compiling[-1][1]
    sm.remove(["gone"])
    assert fut.cancelled()                         # it never takes a worker
    sm.submit(_request("shared0", Structured.regex("[ab]+f")))
    sm.submit(_request("shared1", Structured.regex("[ab]+f")))
    shared = sm._compiling[-1][1]
    sm.remove(["shared0"])                         # the other still waits for it
    assert not shared.cancelled()
    release.set()
    assert _wait(lambda: not sm.take_compiled()[1] and not sm.num_compiling, 20)
    assert "[ab]+e" not in started


def test_a_compile_past_its_timeout_rejects_its_request(manager):
    sm, release, started = manager
    sm.compile_timeout_s = 0.2
    sm.submit(_request("slow", Structured.regex("[ab]+g")))
    time.sleep(0.3)
    ready, failed = sm.take_compiled()
    assert not ready and [r.request_id for r, _ in failed] == ["slow"]
    assert "did not compile within 0.2 s" in failed[0][1] and not sm.num_compiling

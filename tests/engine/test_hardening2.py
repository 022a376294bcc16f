"""Regression tests of issue 54 ("Hardening 2"), engine side: each failed before its fix.

The tiny random Llama (no tokenizer unless a grammar needs one: prompts are token ids)."""

from __future__ import annotations

import time

import pytest

from toolkit import LLM, SamplingParams
from toolkit.schedulers.policies import FCFS

GREEDY = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)


def _clean(e) -> None:
    assert not e.has_unfinished(), "requests left queued"
    assert e.allocator.num_free_blocks() == e.allocator.num_blocks, "KV blocks leaked"
    assert not e.output_processor.request_ids() and not e.best_of._wanted
    assert not e.structured.num_compiling and not len(e.siblings)


def _drain(e, steps: int = 200) -> list:
    outs = []
    for _ in range(steps):
        if not e.has_unfinished():
            break
        outs += e.step()
    return outs


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=24, block_size=4,
             max_model_len=96, max_num_seqs=4) as llm:
        yield llm


# -- item 2: n is capped (max_num_seqs) and refused at once; the fan-out is linear --
@pytest.mark.parametrize("kw", [dict(n=5), dict(n=2**63), dict(n=1, best_of=5), dict(n=20000, max_tokens=1)])
def test_n_beyond_max_num_seqs_is_refused_at_once(llm, kw):
    e = llm.engine
    t = time.perf_counter()
    with pytest.raises(ValueError, match=r"max_num_seqs=4; n and best_of must be in \[1, 4\]"):
        e.add_request([5, 6], SamplingParams(**kw))
    assert time.perf_counter() - t < 0.5
    _clean(e)
    e.add_request([5, 6], SamplingParams(n=4, max_tokens=2, seed=1))    # the limit itself is fine
    assert len([o for o in _drain(e) if o.finished][0].outputs) == 4
    _clean(e)


def test_adding_n_samples_costs_linear_time(tiny_llama_dir):
    """Adding n samples rebuilt the list of n sample ids per sample (O(n^2)): n=20000 held
    the engine loop for minutes. Linear: 4x the samples take about 4x the time."""
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=24, block_size=4,
             max_num_seqs=4096) as llm:
        e = llm.engine

        def cost(n: int) -> float:
            best = float("inf")
            for _ in range(2):
                t = time.perf_counter()
                rid = e.add_request([5, 6], SamplingParams(n=n, max_tokens=1))
                e.abort(rid)
                best = min(best, time.perf_counter() - t)
            return best
        cost(64)                                   # warm
        small, large = cost(1024), cost(4096)
        assert large < 9 * small, (small, large)
        _clean(e)


# -- item 3: a refused request leaves nothing; user ids never collide with sample ids --
def test_a_user_id_that_is_another_requests_sample_id_is_refused_cleanly(llm):
    e = llm.engine
    e.add_request([5, 6], GREEDY, request_id="x#1")
    with pytest.raises(ValueError, match=r"sample ids .*in use"):
        e.add_request([7, 8], SamplingParams(n=2, max_tokens=2, seed=0), request_id="x")
    e.add_request([9], GREEDY, request_id="other")
    finished = {o.request_id for o in _drain(e) if o.finished}
    assert finished == {"x#1", "other"}
    _clean(e)


def test_a_refused_grammar_request_leaves_no_compile_behind(tiny_llama_dir):
    """Issue 54 item 3: `x#1` in flight, then `x` with n=2 and a grammar: it was refused
    after its compiles were queued; they then put an ownerless `x#0` and a duplicate `x#1`
    in the scheduler, and the next step raised for every client."""
    from toolkit.models import default_model_path, load_tokenizer
    from toolkit.samplers.grammar import Structured

    tok = load_tokenizer(default_model_path())
    with LLM(tiny_llama_dir, tokenizer=tok, dtype="float32", device="cpu", num_blocks=32,
             block_size=4) as llm:
        e = llm.engine
        e.add_request([5, 6], SamplingParams(max_tokens=6, ignore_eos=True), request_id="x#1")
        with pytest.raises(ValueError, match="in use"):
            e.add_request([7], SamplingParams(n=2, max_tokens=4, structured=Structured.choice(["yes", "no"])),
                          request_id="x")
        assert not e.structured.num_compiling
        e.add_request([8], SamplingParams(max_tokens=6, ignore_eos=True), request_id="y")
        time.sleep(0.2)                           # a compile that was queued would finish now
        finished = {o.request_id: o for o in _drain(e, 400) if o.finished}
        assert set(finished) == {"x#1", "y"}
        assert all(o.outputs[0].finish_reason == "length" for o in finished.values())
        _clean(e)


class _Refuses(FCFS):
    """A policy that raises in on_add (after the scheduler queued the request) while
    `refuse` is set."""

    refuse = True

    def on_add(self, request) -> None:
        if self.refuse:
            raise ValueError("refused by the policy")


def test_a_policy_raising_in_on_add_leaves_no_hidden_request(tiny_llama_dir):
    policy = _Refuses()
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=24, block_size=4,
             policy=policy) as llm:
        e = llm.engine
        with pytest.raises(ValueError, match="refused by the policy"):
            e.add_request([5, 6], GREEDY, request_id="a")
        assert not e.scheduler.requests and not e.scheduler.waiting
        _clean(e)
        # item 9: a refused best_of request left its entry; the id reused lost its outputs
        with pytest.raises(ValueError, match="refused by the policy"):
            e.add_request([5, 6], SamplingParams(n=1, best_of=2, max_tokens=3), request_id="b")
        _clean(e)
        policy.refuse = False
        e.add_request([5, 6], SamplingParams(max_tokens=3, ignore_eos=True, logprobs=1), request_id="b")
        outs = [o for o in _drain(e) if o.request_id == "b"]
        assert len(outs) == 3 and [len(o.outputs) for o in outs] == [1, 1, 1]
        assert len(outs[-1].outputs[0].logprobs) == 3
        _clean(e)


# -- item 4: tiny temperatures are greedy; float parameters must be finite in float32 --
@pytest.mark.parametrize("t", [1e-300, 1e-45, 5e-324, 1e-6])
def test_a_tiny_temperature_is_greedy_and_keeps_the_masks(llm, t):
    """1e-45 passed validation and underflowed in float32: token 0 forever, the allowed
    token ids ignored."""
    allowed = [7, 9, 11]
    p = SamplingParams(temperature=t, seed=1, max_tokens=5, ignore_eos=True, allowed_token_ids=allowed)
    assert p.greedy and p.temperature == 0.0
    got = llm.generate([[5, 6, 7]], p, use_tqdm=False)[0].outputs[0].token_ids
    want = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True,
                                                    allowed_token_ids=allowed), use_tqdm=False)
    assert got == want[0].outputs[0].token_ids and set(got) <= set(allowed)


@pytest.mark.parametrize("kw, name", [
    (dict(repetition_penalty=1e308), "repetition_penalty"), (dict(repetition_penalty=1e39), "repetition_penalty"),
    (dict(temperature=float("inf")), "temperature"), (dict(temperature=1e39), "temperature"),
    (dict(logit_bias={5: 1e39}), r"logit_bias\[5\]"), (dict(logit_bias={5: -float("inf")}), r"logit_bias\[5\]"),
])
def test_float_parameters_beyond_float32_are_refused(kw, name):
    with pytest.raises(ValueError, match=name + " must be a finite"):
        SamplingParams(**kw)
    SamplingParams(temperature=3.4e38, repetition_penalty=3.4e38)    # float32's largest: accepted


# -- item 9: an interrupted beam search leaves nothing queued --
def test_an_interrupted_beam_search_frees_its_requests(tiny_llama_dir, monkeypatch):
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=64, block_size=4) as llm:
        e = llm.engine
        real, calls = e.step, []

        def interrupted():
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return real()
        monkeypatch.setattr(e, "step", interrupted)
        with pytest.raises(KeyboardInterrupt):
            llm.beam_search([[5, 6, 7, 8, 9]], 3, 8, ignore_eos=True)
        monkeypatch.setattr(e, "step", real)
        assert not e.has_unfinished() and e.allocator.num_free_blocks() == e.allocator.num_blocks


# -- item 11: aborting an n = 2 request frees every block at once --
def test_aborting_an_n2_request_frees_all_its_blocks_at_once(llm):
    e = llm.engine
    rid = e.add_request(list(range(5, 19)), SamplingParams(n=2, temperature=1.0, seed=2, max_tokens=30,
                                                           ignore_eos=True))
    for _ in range(4):                        # both samples running, on forked prompt blocks
        e.step()
    seqs = e.output_processor.sequence_ids(rid)
    assert len(seqs) == 2 and all(s in e.scheduler.requests for s in seqs)
    assert e.allocator.num_free_blocks() < e.allocator.num_blocks
    e.abort(rid)                              # no step in between
    assert e.allocator.num_free_blocks() == e.allocator.num_blocks
    assert not any(s in e.scheduler.requests for s in seqs)
    _drain(e)
    _clean(e)


# -- item 10: beam search shows its progress --
def test_beam_search_reports_progress(tiny_llama_dir, monkeypatch):
    import contextlib

    from toolkit.entrypoints import beam

    seen = []

    @contextlib.contextmanager
    def bar(total, enabled=True, desc="", unit="it"):
        seen.append((total, enabled, desc))
        yield type("Bar", (), {"update": lambda self, n=1: seen.append(n)})()
    monkeypatch.setattr(beam, "progress_bar", bar)
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=64, block_size=4) as llm:
        llm.beam_search([[5, 6, 7]], 2, 3, ignore_eos=True)
    assert seen == [(3, True, "beam search"), 1, 1, 1]

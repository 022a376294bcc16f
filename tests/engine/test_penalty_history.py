"""PenaltyHistory: the penalised rows' token lists it keeps on the device are, at every
step, exactly the lists SamplingMetadata.build makes from the host (its twin); the engine's
penalised outputs do not change with it; its rows are freed and reused."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit import LLM, SamplingParams
from toolkit.worker.penalty_history import PenaltyHistory
from toolkit.samplers.base import _pad
from toolkit.types import PLACEHOLDER, Request, RequestStatus

V = 50


def _request(rid: str, prompt: list[int], rep: float = 1.2) -> Request:
    return Request(request_id=rid, prompt_token_ids=prompt,
                   sampling_params=SamplingParams(repetition_penalty=rep, presence_penalty=0.5))


def _expected(reqs: list[Request], reps: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """What SamplingMetadata.build makes from the host's lists (the twin)."""
    return (_pad([r.prompt_array if rep else [] for r, rep in zip(reqs, reps)], V),
            _pad([r.output_token_ids for r in reqs], V))


# one op per step: admit a request, decode (every live request gains 1-3 tokens, as drafts
# can), finish one, replace one by a new object under the same id (shorter output), cut one's
# output (the same object)
OPS = st.lists(st.tuples(st.sampled_from(["add", "decode", "decode", "finish", "replace", "cut"]),
                         st.integers(0, 10**6), st.lists(st.integers(0, V - 1), max_size=40)),
               min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_lists_equal_the_hosts_at_every_step(ops) -> None:
    history = PenaltyHistory(V, torch.device("cpu"), rows=2, width=1)    # every op may grow it
    live: list[Request] = []
    ids = 0
    for op, pick, tokens in ops:
        if op == "add" or not live:
            live.append(_request(f"r{ids}", tokens or [pick % V]))
            ids += 1
        elif op == "decode":
            for r in live:
                r.output_token_ids.extend([(pick + len(r.output_token_ids)) % V] * (1 + pick % 3))
        elif op == "finish":
            live.pop(pick % len(live)).status = RequestStatus.FINISHED_STOPPED
        elif op == "cut":
            out = live[pick % len(live)].output_token_ids
            del out[pick % (len(out) + 1):]
        else:
            i = pick % len(live)
            old = live[i]
            live[i] = _request(old.request_id, tokens or [1])
            live[i].output_token_ids.extend(old.output_token_ids[: pick % (len(old.output_token_ids) + 1)])
        step = [r for j, r in enumerate(live) if (pick >> j) & 1] or live   # this step's penalised rows
        reps = [(pick >> (j + 7)) & 1 == 1 for j in range(len(step))]
        got = history.lists(step, reps)
        want = _expected(step, reps)
        for g, w in zip(got, want):
            assert g.shape == w.shape and torch.equal(g, w)
    assert len(history) <= len(live) + sum(1 for op, _, _ in ops if op == "finish")


def test_rows_are_freed_and_reused() -> None:
    """Requests that finish give their rows back: 200 requests, 4 at a time, never need more
    than the first buffer's rows; each token crosses to the device once."""
    history = PenaltyHistory(V, torch.device("cpu"))
    rows0 = history._prompt.shape[0]
    for k in range(50):
        batch = [_request(f"{k}-{i}", [i, k % V, 3]) for i in range(4)]
        for _ in range(5):
            history.lists(batch, [True] * 4)
            for r in batch:
                r.output_token_ids.append(7)
        for r in batch:
            r.status = RequestStatus.FINISHED_LENGTH
    history.lists([_request("last", [1])], [True])
    assert len(history) == 1 and history._prompt.shape[0] == rows0
    assert history.num_uploaded_tokens == 200 * 3 + 200 * 4 + 1     # prompts, outputs, the last


def test_a_token_sampled_on_the_device_needs_no_host_value() -> None:
    """note_sampled appends the step's token on the device: the next step's lists hold it while
    the host still has a placeholder (async scheduling), and nothing more is uploaded."""
    history = PenaltyHistory(V, torch.device("cpu"), rows=2, width=1)
    a, b = _request("a", [1, 2]), _request("b", [4], rep=1.0)
    a.output_token_ids.append(3)
    history.lists([a, b], [True, False])
    sent = history.num_uploaded_tokens
    history.note_sampled([b, a], torch.tensor([7, 9]))
    for r in (a, b):
        r.output_token_ids.append(PLACEHOLDER)
    prompt, out = history.lists([a, b], [True, False])
    assert history.num_uploaded_tokens == sent
    a.output_token_ids[-1], b.output_token_ids[-1] = 9, 7       # the step lands
    want = _expected([a, b], [True, False])
    assert torch.equal(prompt, want[0]) and torch.equal(out, want[1])
    # a row the host never caught up with (its request finished on that token) is released
    history.note_sampled([a], torch.tensor([11]))
    a.status = RequestStatus.FINISHED_STOPPED
    history.lists([b], [False])
    assert len(history) == 1


def test_an_output_token_not_on_the_host_is_refused() -> None:
    """A row written from the host's lists (new, or stale) needs every token's value there."""
    history = PenaltyHistory(V, torch.device("cpu"))
    r = _request("a", [1, 2])
    r.output_token_ids.extend([3, PLACEHOLDER])
    with pytest.raises(RuntimeError, match="not on the host yet"):
        history.lists([r], [True])


@pytest.mark.parametrize("num_blocks", [64, 12])       # 12: preemption and recompute
def test_engine_outputs_do_not_change_with_the_history(tiny_llama_dir, num_blocks) -> None:
    """Greedy outputs with repetition / presence / frequency penalties (n = 2 among them),
    with the history and with lists rebuilt per step; the penalties change the outputs."""
    prompts = [[5, 6, 7, 8, 9, 10] * 3, [11, 12, 13] * 5, [20, 21, 22, 23], [30, 31] * 4] * 2
    params = [SamplingParams(max_tokens=24, temperature=0, repetition_penalty=1.5, ignore_eos=True),
              SamplingParams(max_tokens=24, temperature=0, presence_penalty=1.0, frequency_penalty=0.5,
                             ignore_eos=True),
              SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=24, temperature=0, repetition_penalty=1.3, n=2, ignore_eos=True)]
    outs, preempted = {}, {}
    for mode in ("history", "lists", "off"):
        with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=num_blocks, block_size=4,
                 max_num_seqs=6) as llm:
            if mode != "history":
                llm.engine.runner.penalty_history = None
            ps = params if mode != "off" else [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True,
                                                              n=p.n) for p in params]
            res = llm.generate(prompts, [ps[i % 4] for i in range(len(prompts))])
            outs[mode] = [[o.token_ids for o in r.outputs] for r in res]
            preempted[mode] = llm.engine.num_preemptions
            if mode == "history":
                assert llm.engine.runner.penalty_history.num_uploaded_tokens > 0
    assert outs["history"] == outs["lists"]
    assert outs["history"] != outs["off"]
    if num_blocks == 12:
        assert preempted["history"] > 0


def test_abort_while_in_flight_with_penalties(tiny_llama_dir) -> None:
    """Async steps of penalised requests, two aborted while a step is in flight: the others
    finish with the tokens a synchronous run gives them, and every row and block is freed."""
    params = SamplingParams(max_tokens=20, temperature=0, repetition_penalty=1.4, ignore_eos=True)
    prompts = [[5, 6, 7, 8] * 3, [9, 10] * 4, [11, 12, 13], [14] * 6]
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=4, num_blocks=64,
             async_scheduling=False) as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(prompts[2:], params, use_tqdm=False)]
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=4, num_blocks=64,
             async_scheduling=True) as llm:
        e = llm.engine
        ids = [e.add_request(p, params) for p in prompts]
        for _ in range(4):
            e.step()
        assert e._inflight is not None and e.num_overlapped_steps > 0
        e.abort(ids[:2])
        done = {}
        while e.has_unfinished():
            done.update({o.request_id: o.outputs[0].token_ids for o in e.step() if o.finished})
        assert [done[i] for i in ids[2:]] == want
        e.runner.penalty_history.lists([], [])          # a later step: finished rows go
        assert len(e.runner.penalty_history) == 0
        assert e.allocator.num_free_blocks() == 64

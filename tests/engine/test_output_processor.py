"""The output processor alone, on a real byte-level tokenizer (the embedded SmolLM2's): text
that only grows, stop strings across token boundaries, multi-byte UTF-8 split across tokens,
n > 1 merged, logprobs and metrics.

Each test feeds the processor the scheduler's per-step outputs by hand (one token a step, or
a few), as the engine would, and checks every step's visible text, not only the last."""

from __future__ import annotations

import pytest

from toolkit.engine.output import OutputProcessor
from toolkit.types import (
    Request,
    RequestOutput,
    SamplingParams,
    ScheduledRequest,
    SchedulerOutput,
    StepResult,
)

TEXT = "Le café coûte 3 € 😀 日本語, et 5, 6, 7 à la fin."


@pytest.fixture(scope="module")
def tok():
    from toolkit.models import default_model_path, load_tokenizer

    return load_tokenizer(default_model_path())


def _run(tok, text: str, params: SamplingParams, *, per_step: int = 1, finish_last: bool = True):
    """Feed text's tokens to a processor, per_step tokens a step; the scheduler reports the
    last step finished by length when finish_last. Returns (texts seen per step, the final
    output, the sequence ids a stop string finished)."""
    ids = tok.encode(text, add_special_tokens=False)
    proc = OutputProcessor(tok)
    req = Request("r", tok.encode("Say:", add_special_tokens=False), params)
    proc.add("r", "Say:", [req])
    seen, final, stopped = [], None, []
    for i in range(0, len(ids), per_step):
        chunk = ids[i:i + per_step]
        last = i + per_step >= len(ids)
        sched = [RequestOutput("r", chunk, last and finish_last, "length" if last and finish_last else None)]
        out = SchedulerOutput([ScheduledRequest(req, 0, 1, [])])
        outs, stop = proc.process(out, sched, StepResult({"r": chunk}))
        stopped += stop
        if outs:
            seen.append(outs[0].outputs[0].text)
            final = outs[0]
            if final.finished:
                break
    return seen, final, stopped


def _grows(seen: list[str]) -> None:
    for a, b in zip(seen, seen[1:]):
        assert b.startswith(a), f"text taken back: {a!r} -> {b!r}"


def test_multibyte_utf8_split_across_tokens(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    pieces = [tok.decode([t]) for t in ids]
    assert any("\ufffd" in p for p in pieces), "the test needs a character split across tokens"
    seen, final, _ = _run(tok, TEXT, SamplingParams())
    _grows(seen)
    assert all("\ufffd" not in s for s in seen), "an incomplete character was shown"
    assert final.text == TEXT and final.finished and final.outputs[0].finish_reason == "length"


@pytest.mark.parametrize("per_step", [1, 3])
def test_stop_string_spanning_tokens_held_back_then_cut(tok, per_step):
    # "6, 7" spans several tokens; before it completes, "6, " must not be shown
    seen, final, stopped = _run(tok, TEXT, SamplingParams(stop=["6, 7"]), per_step=per_step)
    _grows(seen)
    cut = TEXT.index("6, 7")
    assert final.text == TEXT[:cut] and final.finished
    assert final.outputs[0].finish_reason == "stop" and final.outputs[0].stop_reason == "6, 7"
    assert stopped == ["r"], "a stop string must ask the scheduler to abort the sequence"
    assert all(not s.endswith(("6", "6,", "6, ")) for s in seen[:-1]), seen


def test_include_stop_str_in_output(tok):
    seen, final, _ = _run(tok, TEXT, SamplingParams(stop=["€ 😀"], include_stop_str_in_output=True))
    _grows(seen)
    assert final.text == TEXT[: TEXT.index("€ 😀") + len("€ 😀")]


def test_earliest_stop_string_wins(tok):
    seen, final, _ = _run(tok, TEXT, SamplingParams(stop=["fin", "coûte"]), per_step=50)
    assert final.text == TEXT[: TEXT.index("coûte")] and final.outputs[0].stop_reason == "coûte"


def test_held_tail_released_when_it_is_not_a_stop(tok):
    # "5, 6, 7" shares the prefix "5, " with the stop "5, 8": held while undecided, then shown
    seen, final, stopped = _run(tok, TEXT, SamplingParams(stop=["5, 8"]), finish_last=False)
    _grows(seen)
    assert not stopped and not final.finished
    assert seen[-1] == TEXT            # nothing at the end could start "5, 8"


def test_n_sequences_merge_into_one_output(tok):
    proc = OutputProcessor(tok)
    prompt = tok.encode("Hi", add_special_tokens=False)
    seqs = [Request(f"q#{j}", prompt, SamplingParams(logprobs=0)) for j in range(2)]
    proc.add("q", "Hi", seqs)
    a, b = tok.encode(" yes", add_special_tokens=False), tok.encode(" no", add_special_tokens=False)
    out = SchedulerOutput([ScheduledRequest(s, 0, 1, []) for s in seqs])
    lp = {"q#0": [{a[0]: -0.5}], "q#1": [{b[0]: -1.5}]}
    outs, _ = proc.process(out, [RequestOutput("q#0", a[:1], True, "length")],
                           StepResult({"q#0": a[:1]}, logprobs=lp))
    assert len(outs) == 1 and outs[0].request_id == "q" and not outs[0].finished
    assert [c.index for c in outs[0].outputs] == [0, 1] and outs[0].outputs[1].token_ids == []
    assert outs[0].metrics.first_scheduled_time is not None
    outs, _ = proc.process(out, [RequestOutput("q#1", b[:1], True, "length")],
                           StepResult({"q#1": b[:1]}, logprobs=lp))
    (o,) = outs
    assert o.finished and [c.token_ids for c in o.outputs] == [a[:1], b[:1]]
    assert [c.cumulative_logprob for c in o.outputs] == [-0.5, -1.5]
    assert o.outputs[1].new_token_ids == b[:1] and o.outputs[0].new_token_ids == []
    assert "q" not in proc, "a finished request is forgotten"

"""OutputProcessor: the user-facing life of a request. Token ids -> text that only grows,
stop strings, logprobs, n > 1 merged, finish reasons, metrics.

The scheduler sees sequences: a request with n = 3 is three sequences ("<id>#0", "<id>#1",
"<id>#2"); the user sees one request with three completions. This object is where the two
meet: it turns the scheduler's per-sequence outputs and the step's StepResult into one
RequestOutput per user request that changed.

Text never shrinks from one step to the next: a tail that could still become a stop string
(the longest suffix of the text that is a proper prefix of a stop string) is held back
until the next tokens decide it, and an incomplete UTF-8 character waits for its other
bytes. Stop strings are found here and finish the sequence through the scheduler's abort
(the engine passes the ids this returns).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from toolkit.types import (
    CompletionOutput,
    Request,
    RequestMetrics,
    RequestOutput,
    SchedulerOutput,
    StepResult,
)

_CONTEXT = 5  # prompt tokens decoded with the output so leading spaces come out right


def sequence_ids(request_id: str, n: int) -> list[str]:
    """The scheduler's ids of a user request's n sequences: the request's own id when n = 1."""
    return [request_id] if n == 1 else [f"{request_id}#{j}" for j in range(n)]


@dataclass
class _Sequence:
    """One completion being produced: its detokenisation state and what was emitted."""

    request: Request
    index: int
    ids: list[int]                   # prompt context + output, for incremental decoding
    prefix_offset: int
    read_offset: int
    text: str = ""                   # decoded so far (cut at a stop string once found)
    shown: int = 0                   # characters of text already visible to the user
    output_ids: list[int] = field(default_factory=list)
    new_ids: list[int] = field(default_factory=list)     # gained this step
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class _Group:
    """One user request: n sequences, one prompt, one set of metrics."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sequences: list[_Sequence]
    metrics: RequestMetrics
    prompt_logprobs: list[dict[int, float] | None] | None = None
    final_only: bool = False         # output_kind "final": one RequestOutput, when it finishes

    @property
    def finished(self) -> bool:
        for s in self.sequences:         # a loop, not all() over a generator: once per step per request
            if s.finish_reason is None:
                return False
        return True


OUTPUT_KINDS = ("cumulative", "final")


class OutputProcessor:
    def __init__(self, tokenizer=None) -> None:
        self.tokenizer = tokenizer
        self._groups: dict[str, _Group] = {}        # user request id -> group
        self._seqs: dict[str, tuple[_Group, _Sequence]] = {}   # sequence id -> (group, sequence)

    def add(self, request_id: str, prompt: str | None, sequences: Sequence[Request],
            output_kind: str = "cumulative") -> None:
        """A user request and its n sequences (n = 1: the sequence's id is the request's).
        output_kind "cumulative": a RequestOutput (all text and tokens so far) each step the
        request changes; "final": only the finished one (LLM.generate's kind: no per-step
        copies of growing lists, which cost O(length) per request per step)."""
        if not sequences:
            raise ValueError("a request needs at least one sequence")
        if output_kind not in OUTPUT_KINDS:
            raise ValueError(f"output_kind must be one of {OUTPUT_KINDS}, got {output_kind!r}")
        taken = [r.request_id for r in sequences if r.request_id in self._seqs] + (
            [request_id] if request_id in self._groups else [])
        if taken:
            raise ValueError(f"request id {request_id!r}: id(s) {taken} already in use")
        ctx = sequences[0].prompt_token_ids[-_CONTEXT:]
        group = _Group(request_id, prompt, sequences[0].prompt_token_ids, [],
                       RequestMetrics(arrival_time=sequences[0].arrival_time),
                       final_only=output_kind == "final")
        for j, req in enumerate(sequences):
            seq = _Sequence(req, j, list(ctx), 0, len(ctx),
                            logprobs=[] if req.sampling_params.logprobs is not None else None)
            group.sequences.append(seq)
            self._seqs[req.request_id] = (group, seq)
        self._groups[request_id] = group

    def request_ids(self) -> list[str]:
        return list(self._groups)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._groups

    def sequence_ids(self, request_id: str) -> list[str]:
        g = self._groups.get(request_id)
        return [] if g is None else [s.request.request_id for s in g.sequences]

    def num_prompt_tokens(self, request_id: str) -> int:
        return len(self._groups[request_id].prompt_token_ids)

    def group_of(self, sequence_id: str) -> str | None:
        """The user request a sequence id belongs to."""
        hit = self._seqs.get(sequence_id)
        return None if hit is None else hit[0].request_id

    def forget(self, request_id: str) -> None:
        g = self._groups.pop(request_id, None)
        for s in g.sequences if g else ():
            if self._seqs.get(s.request.request_id, (None,))[0] is g:
                del self._seqs[s.request.request_id]

    def reject(self, request_id: str, reason: str) -> RequestOutput:
        """The final output of a request refused after it was queued (a grammar that did
        not compile); the request is forgotten."""
        g = self._groups[request_id]
        for s in g.sequences:
            s.finish_reason, s.stop_reason = "rejected", reason
        out = self._output(g, time.monotonic(), True)
        self.forget(request_id)
        return out

    # -- one step --
    def process(self, out: SchedulerOutput, finished: list[RequestOutput], result: StepResult,
                ) -> tuple[list[RequestOutput], list[str]]:
        """Apply one step: `finished` is what the scheduler's update returned (per sequence:
        new tokens, token-level finishes), `result` the step's logprobs. Returns (one
        RequestOutput per user request that changed, the sequence ids a stop string finished,
        which the scheduler must abort)."""
        now = time.monotonic()
        scheduled = {s.request_id: s.request for s in out.scheduled}
        for s in out.scheduled:
            hit = self._seqs.get(s.request_id)
            if hit is not None and hit[0].metrics.first_scheduled_time is None:
                hit[0].metrics.first_scheduled_time = now
                hit[0].metrics.num_cached_tokens = s.request.num_cached_tokens
        for rid, (start, lps) in result.prompt_logprobs.items():
            if rid in self._seqs and scheduled.get(rid) is self._seqs[rid][1].request:
                self._add_prompt_logprobs(self._seqs[rid][0], start, lps)
        changed: dict[str, _Group] = {}
        stopped: list[str] = []
        for o in finished:
            hit = self._seqs.get(o.request_id)
            if hit is None or hit[1].finish_reason is not None:
                continue
            if scheduled.get(o.request_id, hit[1].request) is not hit[1].request:
                continue                   # an earlier request's output under an id now reused
            group, seq = hit
            changed[group.request_id] = group
            if o.request_id in result.num_draft_tokens:
                group.metrics.num_spec_drafted += result.num_draft_tokens[o.request_id]
                group.metrics.num_spec_accepted += result.num_accepted(o.request_id)
            if o.new_token_ids and group.metrics.first_token_time is None:
                group.metrics.first_token_time = now
            stop = self._append(seq, o.new_token_ids, result.logprobs.get(o.request_id))
            if stop is not None:
                seq.finish_reason, seq.stop_reason = "stop", stop
                if not o.finished:
                    stopped.append(o.request_id)
            elif o.finished:
                seq.finish_reason, seq.stop_reason = o.finish_reason, o.stop_reason
        outputs = []
        for group in changed.values():
            done = group.finished
            if done:
                group.metrics.finished_time = now
            elif group.final_only:
                continue
            outputs.append(self._output(group, now, done))
            if done:
                self.forget(group.request_id)
        return outputs, stopped

    def _append(self, seq: _Sequence, tokens: Sequence[int], lps: list[dict[int, float]] | None,
                ) -> str | None:
        """Append tokens one by one; returns the stop string that finished the sequence (the
        tokens after it are dropped), or None."""
        seq.new_ids = []
        for i, tok in enumerate(tokens):
            seq.output_ids.append(tok)
            seq.new_ids.append(tok)
            if seq.logprobs is not None and lps is not None and i < len(lps):
                seq.logprobs.append(lps[i])
                seq.cumulative_logprob += lps[i].get(tok, 0.0)
            stop = self._decode(seq, tok)
            if stop is not None:
                return stop
        return None

    def _decode(self, seq: _Sequence, tok: int) -> str | None:
        """Decode one more token; returns the stop string if one now appears in the text."""
        if self.tokenizer is None:
            return None
        sp = seq.request.sampling_params
        seq.ids.append(tok)
        skip = sp.skip_special_tokens
        prefix = self.tokenizer.decode(seq.ids[seq.prefix_offset:seq.read_offset], skip_special_tokens=skip)
        full = self.tokenizer.decode(seq.ids[seq.prefix_offset:], skip_special_tokens=skip)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return None  # an incomplete UTF-8 sequence: wait for more bytes
        old_len = len(seq.text)
        seq.text += full[len(prefix):]
        seq.prefix_offset, seq.read_offset = seq.read_offset, len(seq.ids)
        return self._find_stop(seq, old_len)

    @staticmethod
    def _find_stop(seq: _Sequence, old_len: int) -> str | None:
        """The stop string that now occurs earliest in the text (searched only where new text
        could complete it); the text is cut there."""
        sp = seq.request.sampling_params
        best: tuple[int, str] | None = None
        for stop in sp.stop or ():
            i = seq.text.find(stop, max(0, old_len - len(stop) + 1))
            if i >= 0 and (best is None or i < best[0]):
                best = (i, stop)
        if best is None:
            return None
        i, stop = best
        seq.text = seq.text[: i + len(stop)] if sp.include_stop_str_in_output else seq.text[:i]
        return stop

    @staticmethod
    def _visible(seq: _Sequence) -> str:
        """The text the user may see now: all of it once finished; before, without the
        longest tail that is a proper prefix of a stop string (it may still become one)."""
        text = seq.text
        if seq.finish_reason is None:
            hold = 0
            for stop in seq.request.sampling_params.stop or ():
                for k in range(min(len(stop) - 1, len(text)), hold, -1):
                    if text.endswith(stop[:k]):
                        hold = k
                        break
            text = text[: len(text) - hold]
        # never shorter than what was shown (a stop string's start was held back, so a cut
        # at a stop string never reaches into shown text)
        assert len(text) >= seq.shown, "text shown to the user was taken back"
        seq.shown = len(text)
        return text

    def _output(self, g: _Group, now: float, done: bool) -> RequestOutput:
        """g's RequestOutput; done: g.finished (a pass over its sequences, computed once a
        step: with 128 running it was 30% of process())."""
        comps = [CompletionOutput(
            s.index, self._visible(s), list(s.output_ids), s.finish_reason, s.stop_reason,
            logprobs=None if s.logprobs is None else list(s.logprobs),
            cumulative_logprob=None if s.logprobs is None else s.cumulative_logprob,
            new_token_ids=s.new_ids) for s in g.sequences]
        for s in g.sequences:
            s.new_ids = []
        first = comps[0]
        return RequestOutput(
            request_id=g.request_id, new_token_ids=list(first.new_token_ids) if len(comps) == 1 else [],
            finished=done, finish_reason=first.finish_reason if done else None,
            stop_reason=first.stop_reason if done else None, prompt=g.prompt,
            prompt_token_ids=g.prompt_token_ids, outputs=comps, metrics=g.metrics,
            prompt_logprobs=g.prompt_logprobs, lora_request=g.sequences[0].request.lora_request)

    @staticmethod
    def _add_prompt_logprobs(g: _Group, start: int, lps: list[dict[int, float]]) -> None:
        """Logprobs of prompt tokens start+1 ... (a recompute after preemption overwrites)."""
        if g.prompt_logprobs is None:
            g.prompt_logprobs = [None]          # the first token has no logprob (vLLM's convention)
        need = start + 1 + len(lps)
        g.prompt_logprobs.extend([None] * (need - len(g.prompt_logprobs)))
        g.prompt_logprobs[start + 1:need] = lps

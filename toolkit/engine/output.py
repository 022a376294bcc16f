"""OutputProcessor: token ids -> incremental text, stop strings, per-request metrics.

The scheduler never sees text; stop strings are found here and finish the request
through the scheduler's abort (which frees its blocks at once).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from toolkit.types import CompletionOutput, Request, RequestMetrics, RequestOutput

_CONTEXT = 5  # prompt tokens decoded with the output so leading spaces come out right


@dataclass
class _Detok:
    ids: list[int]
    prefix_offset: int
    read_offset: int
    text: str = ""
    done: bool = False
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None   # per output token: {token id: logprob}
    prompt_logprobs: list[dict[int, float] | None] | None = None   # [None, then per prompt token]
    cumulative_logprob: float = 0.0


class OutputProcessor:
    def __init__(self, tokenizer=None) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, _Detok] = {}
        self.metrics: dict[str, RequestMetrics] = {}
        self.requests: dict[str, Request] = {}
        self.prompts: dict[str, str | None] = {}

    def add(self, request: Request, prompt: str | None) -> None:
        ctx = request.prompt_token_ids[-_CONTEXT:]
        self.states[request.request_id] = _Detok(list(ctx), 0, len(ctx))
        self.metrics[request.request_id] = RequestMetrics(arrival_time=request.arrival_time)
        self.requests[request.request_id] = request
        self.prompts[request.request_id] = prompt

    def add_prompt_logprobs(self, request_id: str, start: int, lps: list[dict[int, float]]) -> None:
        """Logprobs of prompt tokens start+1 ... (a recompute after preemption overwrites)."""
        st = self.states.get(request_id)
        if st is None:
            return
        if st.prompt_logprobs is None:
            st.prompt_logprobs = [None]          # the first token has no logprob (vLLM's convention)
        need = start + 1 + len(lps)
        st.prompt_logprobs.extend([None] * (need - len(st.prompt_logprobs)))
        st.prompt_logprobs[start + 1:need] = lps

    def add_spec(self, request_id: str, drafted: int, accepted: int) -> None:
        m = self.metrics.get(request_id)
        if m is not None:
            m.num_spec_drafted += drafted
            m.num_spec_accepted += accepted

    def add_logprobs(self, request_id: str, lp: dict[int, float]) -> None:
        """Logprobs of the token just sampled for this request (before update() appends it)."""
        st = self.states.get(request_id)
        if st is not None:
            st.logprobs = (st.logprobs or []) + [lp]

    def process(self, outs: list[RequestOutput], forced: dict[str, str] | None = None,
                ) -> tuple[list[RequestOutput], list[str]]:
        """Fill text and metrics. `forced` finishes requests for a reason found outside the
        scheduler (a grammar's end). Returns (outputs, ids the scheduler must abort because a
        stop string or `forced` finished them)."""
        forced = forced or {}
        now = time.monotonic()
        to_abort: list[str] = []
        result = []
        for o in outs:
            st = self.states.get(o.request_id)
            if st is None or st.done:
                continue
            req = self.requests[o.request_id]
            m = self.metrics[o.request_id]
            if o.new_token_ids and m.first_token_time is None:
                m.first_token_time = now
            finish, stop_reason = o.finish_reason, o.stop_reason
            for tok in o.new_token_ids:
                st.output_ids.append(tok)
                if st.logprobs is not None and len(st.logprobs) >= len(st.output_ids):
                    st.cumulative_logprob += st.logprobs[len(st.output_ids) - 1].get(tok, 0.0)
                hit = self._append(st, tok, req)
                if hit is not None:
                    finish, stop_reason = "stop", hit
                    if not o.finished:
                        to_abort.append(o.request_id)
                    break
            if o.request_id in forced and not o.finished and finish != "stop":
                finish = forced[o.request_id]
                to_abort.append(o.request_id)
            finished = o.finished or finish is not None
            if finished:
                st.done = True
                m.finished_time = now
            result.append(RequestOutput(
                request_id=o.request_id, new_token_ids=list(o.new_token_ids), finished=finished,
                finish_reason=finish if finished else None, stop_reason=stop_reason,
                prompt=self.prompts[o.request_id], prompt_token_ids=req.prompt_token_ids,
                outputs=[CompletionOutput(0, st.text, list(st.output_ids),
                                          finish if finished else None, stop_reason,
                                          logprobs=None if st.logprobs is None
                                          else st.logprobs[: len(st.output_ids)],
                                          cumulative_logprob=None if st.logprobs is None
                                          else st.cumulative_logprob)],
                metrics=m, prompt_logprobs=st.prompt_logprobs,
            ))
            if finished:
                self.forget(o.request_id)
        return result, to_abort

    def _append(self, st: _Detok, tok: int, req: Request) -> str | None:
        """Decode one more token; returns the stop string if one now appears in the text."""
        if self.tokenizer is None:
            return None
        sp = req.sampling_params
        st.ids.append(tok)
        skip = sp.skip_special_tokens
        prefix = self.tokenizer.decode(st.ids[st.prefix_offset:st.read_offset], skip_special_tokens=skip)
        full = self.tokenizer.decode(st.ids[st.prefix_offset:], skip_special_tokens=skip)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return None  # an incomplete UTF-8 sequence: wait for more bytes
        delta = full[len(prefix):]
        st.prefix_offset, st.read_offset = st.read_offset, len(st.ids)
        old_len = len(st.text)
        st.text += delta
        for stop in sp.stop or ():
            # search only where the new text could complete a match
            i = st.text.find(stop, max(0, old_len - len(stop) + 1))
            if i >= 0:
                st.text = st.text[: i + len(stop)] if sp.include_stop_str_in_output else st.text[:i]
                return stop
        return None

    def forget(self, request_id: str) -> None:
        for d in (self.states, self.requests, self.prompts, self.metrics):
            d.pop(request_id, None)

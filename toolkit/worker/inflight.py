"""A launched step whose sampled tokens may still be on the device.

`Runner.launch` returns one; `result()` is the only place the host waits for a step's tokens.
With async scheduling the engine launches step N + 1 before it asks for step N's result: the
tokens were copied device -> pinned host memory right after step N's sampling (enqueued before
step N + 1's work), so `result()` waits on that copy's event alone, not on step N + 1.

Until then the scheduler holds a placeholder token (`PLACEHOLDER`) for each request that
sampled; the next step's input ids at those positions are gathered on the device from
`tokens` (`rows` maps request id -> row).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from toolkit.types import PLACEHOLDER, Request, StepResult


def _to_host(t: torch.Tensor | None) -> torch.Tensor | None:
    """A non-blocking copy into pinned host memory (the CPU: the tensor itself)."""
    if t is None or t.device.type == "cpu":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


@dataclass
class Launched:
    result_now: StepResult | None = None          # a step that finished on the host already
    requests: list[Request] = field(default_factory=list)   # [B] sampling requests, row order
    tokens: torch.Tensor | None = None            # int64 [B] on the device
    rows: dict[str, int] = field(default_factory=dict)       # request id -> row of tokens
    ended: dict[str, str] = field(default_factory=dict)      # grammars that ended: tokens void
    prompt_logprobs: dict = field(default_factory=dict)
    _host: tuple = ()                              # pinned copies: tokens, logprobs, their ids
    _event: torch.cuda.Event | None = None
    # Runner.time_gpu: a timing event recorded on the stream before the step's first work
    gpu_start: torch.cuda.Event | None = None
    # seconds result() waited for the device (the host idle); None until then, or when the
    # tokens were on the host already
    wait: float | None = None
    pooled: dict = field(default_factory=dict)     # pooling requests' results (on the host already)
    kv_connector_output: object = None   # [kv_transfer] copied into the StepResult

    @classmethod
    def done(cls, result: StepResult) -> "Launched":
        return cls(result_now=result)

    @classmethod
    def sampled(cls, requests: list[Request], tokens: torch.Tensor, logprobs: torch.Tensor | None,
                logprob_ids: torch.Tensor | None, ended: dict[str, str], prompt_logprobs: dict,
                gpu_start: torch.cuda.Event | None = None) -> "Launched":
        """Start the device -> host copies of a plain step's outputs (nothing waits here);
        `gpu_start` (a timing event recorded before the step's work) makes gpu_seconds() work."""
        host = (_to_host(tokens), _to_host(logprobs), _to_host(logprob_ids))
        event = None
        if tokens.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=gpu_start is not None)
            event.record()
        return cls(None, requests, tokens, {r.request_id: i for i, r in enumerate(requests)}, ended,
                   prompt_logprobs, host, event, gpu_start if event is not None else None)

    def gpu_seconds(self) -> float | None:
        """Stream time from the step's start marker to its outputs' copy, in seconds, once
        result() has waited for them: the step's GPU work plus any gap in which the GPU
        waited for the host to enqueue more of it. None unless the runner timed the step."""
        if self.gpu_start is None or self._event is None or self.result_now is None:
            return None
        return self.gpu_start.elapsed_time(self._event) / 1e3

    def placeholders(self) -> StepResult:
        """One PLACEHOLDER token per sampling request: what update() is given before the
        tokens reach the host (a step already finished on the host gives its real tokens)."""
        if self.result_now is not None:
            return self._with_kv(self.result_now)
        return self._with_kv(StepResult({rid: [PLACEHOLDER] for rid in self.rows}))

    def _with_kv(self, result: StepResult) -> StepResult:
        """[kv_transfer] the connector's report rides on the result the scheduler updates from."""
        if self.kv_connector_output is not None:
            result.kv_connector_output = self.kv_connector_output
        return result

    def result(self) -> StepResult:
        """The step's StepResult (waits for its copies, not for later work)."""
        if self.result_now is not None:
            return self._with_kv(self.result_now)
        if self._event is not None:
            t = time.perf_counter()
            self._event.synchronize()
            self.wait = time.perf_counter() - t
        toks, lps, lp_ids = self._host
        result = StepResult({r.request_id: [t] for r, t in zip(self.requests, toks.tolist())})
        if lps is not None:
            for r, v, i in zip(self.requests, lps.tolist(), lp_ids.tolist()):
                n = r.sampling_params.logprobs
                if n is not None:
                    result.logprobs[r.request_id] = [dict(zip(i[: n + 1], v[: n + 1]))]
        apply_ended(result, self.ended)
        result.prompt_logprobs.update(self.prompt_logprobs)
        result.pooled.update(self.pooled)
        self.result_now = result
        return self._with_kv(result)


def apply_ended(result: StepResult, ended: dict[str, str]) -> None:
    """Requests whose grammar ended before this step: their tokens are void, they finish."""
    for rid, reason in ended.items():
        result.sampled_token_ids.pop(rid, None)
        result.logprobs.pop(rid, None)
        result.num_draft_tokens.pop(rid, None)
        result.finished[rid] = reason

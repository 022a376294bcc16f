"""Step observers: what each step did, for whoever attached (metrics, recorders, live views).

    engine.add_observer(records.append)    # a StepRecord after every step
    engine.add_observer(f, gpu_time=True)   # ... and each CUDA step's GPU time in it
    engine.remove_observer(records.append)

Nothing is measured or built when no observer is attached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from toolkit.types import SchedulerOutput, StepResult

StepObserver = Callable[["StepRecord"], None]


@dataclass
class StepRecord:
    step: int                                # the engine's step counter (0-based)
    start_time: float                        # time.perf_counter() when the step began
    duration: float                          # seconds of the step (wall time)
    grants: dict[str, int] = field(default_factory=dict)   # sequence id -> tokens run this step
    num_prefill_tokens: int = 0              # tokens of prompt (or recompute) chunks
    num_decode_tokens: int = 0               # one token per decoding sequence, plus its drafts
    num_draft_tokens: int = 0                # of the decode tokens, drafts verified
    num_accepted_tokens: int = 0             # of those, accepted
    num_running: int = 0                     # after the step
    num_waiting: int = 0
    num_preempted: int = 0                   # preempted in this step
    num_finished: int = 0                    # user requests finished in this step
    kv_blocks_used: int = 0                  # blocks held or cached-and-unevictable (after the step)
    kv_blocks_cached: int = 0                # blocks holding a published prefix
    kv_blocks_total: int = 0
    # CUDA, plain steps, while an observer that asked for it (add_observer(gpu_time=True)) is
    # attached: stream seconds from the step's first work to its tokens' copy (its GPU time, plus
    # any wait for the host to enqueue the rest); else None (the CPU; drafts, taken at once)
    gpu_time: float | None = None
    # CUDA: seconds the host waited on the device for this step's tokens when it landed (the
    # step() call's time less this is the host's own work in it); None when nothing waited
    wait_time: float | None = None
    # the step's plan itself (its ScheduledRequests name each request, its start and grant):
    # what a trace recorder keeps to replay the run on the simulator
    scheduler_output: SchedulerOutput | None = field(default=None, repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / max(self.kv_blocks_total, 1)


def step_record(step: int, start: float, end: float, out: SchedulerOutput, result: StepResult,
                scheduler, allocator, num_finished: int, gpu_time: float | None = None,
                wait_time: float | None = None) -> StepRecord:
    """The record of one step: the plan, its result and the state after it."""
    rec = StepRecord(step, start, end - start, num_preempted=len(out.preempted_ids), scheduler_output=out,
                     gpu_time=gpu_time, wait_time=wait_time,
                     num_finished=num_finished, num_running=scheduler.num_running,
                     num_waiting=scheduler.num_waiting, kv_blocks_total=allocator.num_blocks,
                     kv_blocks_used=allocator.num_blocks - allocator.num_free_blocks(),
                     kv_blocks_cached=allocator.num_cached_blocks())
    for s in out.scheduled:
        rec.grants[s.request_id] = s.num_new_tokens
        # read after update(): the request has grown since, so `s.samples` no longer tells;
        # a decode is one token (+ drafts) past the prompt, anything else a prompt or recompute chunk
        if s.num_new_tokens == 1 + s.num_spec_tokens and s.start >= s.request.num_prompt_tokens:
            rec.num_decode_tokens += s.num_new_tokens
        else:
            rec.num_prefill_tokens += s.num_new_tokens
    rec.num_draft_tokens = sum(result.num_draft_tokens.values())
    rec.num_accepted_tokens = sum(result.num_accepted(r) for r in result.num_draft_tokens)
    return rec

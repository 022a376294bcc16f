"""The real engine on the same traces: record a run, run a trace, replay a recording.

    rec = TraceRecorder(llm)                 # a step observer: arrivals and each step's plan
    llm.generate(prompts, params)            # any run (or run_on_engine below)
    trace = rec.trace()                      # its arrivals, prompts and output lengths
    cost = rec.fit_cost()                    # a cost model refit from its steps' wall times
    rec.detach()
    rec.save("run.json"); TraceRecorder.load("run.json").trace()   # replay / refit elsewhere

    real = run_on_engine(llm, trace)         # arrivals in real time -> RunResult
    sim = Simulator(policy, cost, ...).run(trace)   # the same trace, simulated

Token times on the engine are when `engine.step()` returned them (with async scheduling,
one step after they were computed, as a user sees them).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.engine.gc_freeze import GcPauses, frozen_heap
from toolkit.kernels.compiles import triton_compiles
from toolkit.progress import progress_bar
from toolkit.simulator.cost import CostModel, _is_decode, as_features, moe_routing, step_features
from toolkit.simulator.result import RequestTiming, RunResult, StepLog
from toolkit.simulator.trace import Trace, TraceRequest


@dataclass
class RecordedStep:
    time: float                   # engine clock (perf_counter) at the step's start
    duration: float               # wall seconds from the step's start to its record
    features: np.ndarray          # cost.step_features of its plan
    grants: dict[str, int]        # sequence id -> tokens
    log: StepLog
    period: float | None = None   # wall seconds of the engine.step() call that made the record
                                  # (run_on_engine sets it: the step-to-step time a cost model predicts)
    gap: float | None = None      # run_on_engine: the driver's seconds from that call's return to the
                                  # next call (its outputs handled; add_request and idle waits not counted)
    gpu: float | None = None      # StepRecord.gpu_time: the step's stream time on CUDA (None elsewhere)
    wait: float | None = None     # StepRecord.wait_time: the host's wait for its tokens (CUDA);
                                  # run_on_engine: the waits of the step() call that set period


def _engine_of(target: Any) -> Any:
    engine = getattr(target, "engine", target)
    if engine is None or not callable(getattr(engine, "add_observer", None)):
        raise TypeError(f"expected an open LLM or an Engine, got {type(target).__name__}")
    return engine


class TraceRecorder:
    """A step observer that keeps what a trace and a cost fit need: every request the
    scheduler ran (its arrival, prompt, policy fields and, at the end, its output length)
    and every step's plan and wall time."""

    def __init__(self, target: Any = None, attach: bool = True) -> None:
        self.engine = None if target is None else _engine_of(target)   # None: a loaded recording
        # the engine's largest CUDA-graph step: a larger one is an eager step (cost.FEATURES)
        self.graph_tokens: int | None = None if self.engine is None else self.engine.runner.graph_tokens
        # a mixture-of-experts model's routing: what the moe_experts feature counts ({}: dense)
        self.moe: dict[str, int] = {} if self.engine is None else \
            moe_routing(getattr(self.engine.model, "config", None))
        self.requests: dict[str, Any] = {}      # sequence id -> scheduler Request (first seen)
        self.steps: list[RecordedStep] = []
        self._trace: Trace | None = None        # a loaded recording's trace
        if attach and self.engine is not None:
            self.engine.add_observer(self, gpu_time=True)     # RecordedStep.gpu: host- or GPU-bound

    def __call__(self, rec) -> None:
        out = rec.scheduler_output
        if out is None:
            return
        by_client: dict[str, int] = {}
        prefill = decode = 0
        for s in out.scheduled:
            self.requests.setdefault(s.request_id, s.request)
            c = s.request.client_id or "-"
            by_client[c] = by_client.get(c, 0) + s.num_new_tokens
            if _is_decode(s):
                decode += 1
            else:
                prefill += s.num_new_tokens
        log = StepLog(rec.start_time, rec.duration, prefill, decode, rec.num_running, rec.num_waiting,
                      rec.num_preempted, rec.kv_blocks_used, rec.kv_blocks_total, by_client)
        self.steps.append(RecordedStep(rec.start_time, rec.duration, step_features(out, self.graph_tokens, self.moe),
                                       dict(rec.grants), log, gpu=rec.gpu_time, wait=rec.wait_time))

    def detach(self) -> None:
        if self.engine is not None and self in self.engine.observers:
            self.engine.remove_observer(self)

    def save(self, path: str) -> None:
        """The trace and every step (start, wall times, features, grants, log) as JSON: record
        on a GPU, replay and refit anywhere (`TraceRecorder.load`)."""
        steps = [dict(time=s.time, duration=s.duration, period=s.period, gap=s.gap, gpu=s.gpu,
                      wait=s.wait, features=s.features.tolist(), grants=s.grants,
                      log=dataclasses.asdict(s.log))
                 for s in self.steps]
        trace = self.trace()
        Path(path).write_text(json.dumps({"trace": {"label": trace.label, "meta": trace.meta,
                                                    "requests": [dataclasses.asdict(r) for r in trace.requests]},
                                          "steps": steps, "graph_tokens": self.graph_tokens,
                                          "moe": self.moe}))

    @classmethod
    def load(cls, path: str) -> "TraceRecorder":
        d = json.loads(Path(path).read_text())
        rec = cls()
        t = d["trace"]
        rec._trace = Trace([TraceRequest(**r) for r in t["requests"]], t["label"], t["meta"])
        rec.steps = [RecordedStep(s["time"], s["duration"], as_features(s["features"], one_step=True), s["grants"],
                                  StepLog(**s["log"]), s["period"], s.get("gap"), s.get("gpu"), s.get("wait"))
                     for s in d["steps"]]
        rec.graph_tokens = d.get("graph_tokens")
        rec.moe = dict(d.get("moe", {}))
        return rec

    def trace(self, label: str = "recorded") -> Trace:
        """The recorded requests as a trace: arrivals relative to the first, the prompt ids,
        the output length each actually produced, and their policy fields."""
        if self._trace is not None:
            return self._trace
        if not self.requests:
            raise ValueError("nothing recorded yet: run the engine with this recorder attached")
        t0 = min(r.arrival_time for r in self.requests.values())
        reqs = [TraceRequest(rid, r.arrival_time - t0, list(r.prompt_token_ids), max(1, r.num_output_tokens),
                             client_id=r.client_id, priority=r.priority, deadline=r.deadline,
                             expected_output_len=r.expected_output_len)
                for rid, r in self.requests.items()]
        return Trace(reqs, label, meta=dict(recorded_steps=len(self.steps)))

    def window_samples(self, window: int = 32, skip: int = 2) -> list[tuple[np.ndarray, float]]:
        """(summed features, summed seconds) of every `window` consecutive recorded steps
        (sliding), after the first `skip` (which compile and warm caches). Seconds are each
        engine.step() call's when run_on_engine recorded them (plus the driver's time until
        the next call: handling the outputs is part of every step's cadence), else start to
        record.

        Why sums: with async scheduling a plan is recorded by the next call, and the host
        part of launching a step (an eager prefill's kernel launches, its input copies) is
        paid in the call that launches it, so one call's time mixes two plans' costs. Per
        step, the fit then charges a prompt's cost to the decode step beside it (a refit of
        one H200 run gave prefill tokens a zero coefficient and TTFT came out 35% short);
        over a window only its two ends can be off by a step (tests/simulator: a one-step
        shift, windows of 8 recover 60% of the prefill coefficient, of 32 85%)."""
        if window < 1:
            raise ValueError(f"window must be >= 1 step, got {window}")
        steps = [s for s in self.steps[skip:]]
        secs = np.array([(s.period if s.period is not None else s.duration) + (s.gap or 0.0) for s in steps])
        feats = np.stack([as_features(s.features) for s in steps]) if steps else np.zeros((0, 1))
        if len(steps) < window:
            return []
        cf, cs = np.cumsum(feats, axis=0), np.cumsum(secs)
        cf = np.vstack([np.zeros((1, feats.shape[1])), cf])
        cs = np.concatenate([[0.0], cs])
        return [(cf[i + window] - cf[i], float(cs[i + window] - cs[i])) for i in range(len(steps) - window + 1)
                if cs[i + window] - cs[i] > 0]

    def fit_cost(self, source: str = "refit from a recorded run", skip: int = 2, window: int = 32) -> CostModel:
        """A cost model fitted to the recorded steps' wall times, over sliding windows of
        `window` steps (see window_samples; window=1: step by step)."""
        return CostModel.fit(self.window_samples(window, skip), source=source, graph_tokens=self.graph_tokens,
                             moe=self.moe)

    def __repr__(self) -> str:
        return f"TraceRecorder({len(self.requests)} requests, {len(self.steps)} steps)"


def _cuda_allocator_counts(engine: Any) -> dict[str, int] | None:
    """The CUDA caching allocator's cumulative device mallocs, frees and malloc retries on the
    engine's device (None off CUDA)."""
    import torch

    dev = getattr(engine.runner, "device", None)
    if getattr(dev, "type", "cpu") != "cuda":
        return None
    stats = torch.cuda.memory_stats(dev)
    return {k: int(stats.get(k, 0)) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries")}


def run_on_engine(target: Any, trace: Trace, *, label: str = "engine", realtime: bool = True,
                  time_limit: float | None = None, use_tqdm: bool = True) -> RunResult:
    """Run the trace on the real engine: each request is added when its arrival time comes
    (realtime=False: all at once, for a saturation measurement), with the trace's policy
    fields; returns the RunResult (token times as engine.step() returned them). `use_tqdm`:
    a bar over the trace's output tokens (one update a step), so a long run is not silent."""
    from toolkit.types import SamplingParams

    engine = _engine_of(target)
    rec = TraceRecorder(engine)
    pending = list(trace.requests)
    timing = {r.request_id: RequestTiming(r.request_id, r.arrival if realtime else 0.0, r.prompt_len,
                                          r.output_len, r.client_id, r.deadline) for r in pending}
    run = RunResult(timing, [], label)
    t0 = time.monotonic()
    pre0 = engine.num_preemptions
    alloc0 = _cuda_allocator_counts(engine)
    host = run.host_time = dict(step_s=0.0, add_s=0.0, steps=0, longest_step_s=0.0)   # where the wall time went
    last = None                           # (the last call's record, when it returned, add_s then)
    k = frozen_at = refrozen_step = 0
    # the heap frozen as LLM.generate runs (engine/gc_freeze.py): a full collector pass over the
    # process's objects is a pause of hundreds of ms inside some step, which no cost model predicts
    try:
        # Triton compiles inside the run (a specialization the warm-up missed) are steps of
        # seconds that no cost model predicts: counted, so a run that had one says so
        total = sum(r.output_len for r in pending)
        with frozen_heap() as heap, GcPauses() as pauses, triton_compiles(strict=False) as compiles, \
                progress_bar(total, enabled=use_tqdm, desc=label, unit="tok") as bar:
            while k < len(pending) or engine.has_unfinished():
                now = time.monotonic() - t0
                if time_limit is not None and now > time_limit:
                    raise TimeoutError(f"run_on_engine: {trace!r} not done after {time_limit} s")
                while k < len(pending) and (not realtime or pending[k].arrival <= now):
                    r = pending[k]
                    sp = SamplingParams(max_tokens=r.output_len, ignore_eos=True, temperature=0.0)
                    a = time.monotonic()
                    engine.add_request(r.prompt_ids, sp, request_id=r.request_id,
                                       arrival_time=t0 + (r.arrival if realtime else 0.0), **r.policy_fields())
                    timing[r.request_id].admitted = time.monotonic() - t0
                    timing[r.request_id].admitted_step = host["steps"]
                    host["add_s"] += timing[r.request_id].admitted + t0 - a
                    k += 1
                if k > frozen_at or host["steps"] >= refrozen_step + 256:
                    # what the run keeps (its requests, the recorder's steps) frozen as it
                    # comes: with 1000 requests queued, unfrozen, the collector's full passes
                    # over them took a few percent of a run (docs/decisions/0007-*.md)
                    heap.refreeze()
                    frozen_at, refrozen_step = k, host["steps"]
                if not engine.has_unfinished():
                    last = None               # idle: the wait is no step's
                    time.sleep(max(0.0, min(pending[k].arrival - now, 0.05)))
                    continue
                n_rec, call = len(rec.steps), time.perf_counter()
                if last is not None:          # the driver's time since the last call returned
                    last[0].gap = call - last[1] - (host["add_s"] - last[2])
                outs = engine.step()
                took = time.perf_counter() - call
                host["step_s"] += took
                host["steps"] += 1
                host["longest_step_s"] = max(host["longest_step_s"], took)
                last = None
                if len(rec.steps) > n_rec:
                    rec.steps[-1].period = took
                    waits = [s.wait for s in rec.steps[n_rec:] if s.wait is not None]
                    if len(rec.steps) > n_rec + 1 and waits:   # a call that landed two steps:
                        rec.steps[-1].wait = sum(waits)          # period and wait are the call's
                    last = (rec.steps[-1], call + took, host["add_s"])
                t = time.monotonic() - t0
                done = 0
                for o in outs:
                    rt = timing.get(o.request_id)
                    if rt is None:
                        continue
                    new = sum(len(c.new_token_ids) for c in o.outputs) if o.outputs else len(o.new_token_ids)
                    if new and not rt.token_times:
                        rt.first_token_step = host["steps"]
                    rt.token_times.extend([t] * new)
                    done += new
                    if o.finished:
                        rt.finish, rt.finish_reason = t, o.finish_reason
                if done:
                    bar.update(done)
    except BaseException:
        engine.abort([r.request_id for r in pending[:k] if timing[r.request_id].finish is None])
        raise
    finally:
        rec.detach()
    host.update(pauses.as_dict())
    host["compiles"] = {name: list(v) for name, v in compiles.items()}      # {kernel: [count, s]}
    # the CUDA caching allocator during the run: device mallocs / frees (a cudaFree waits for
    # the device) and retries (a failed malloc frees every cached block, then tries again)
    alloc1 = _cuda_allocator_counts(engine)
    if alloc0 is not None and alloc1 is not None:
        host["cuda_allocator"] = {k: alloc1[k] - alloc0[k] for k in alloc0}
    # step times on the trace's clock: perf_counter and monotonic share a rate; align at t0
    offset = (time.perf_counter() - time.monotonic()) + t0
    for s in rec.steps:
        s.log.time = s.time - offset
    run.steps = [s.log for s in rec.steps]
    run.num_preemptions = engine.num_preemptions - pre0
    run.recording = rec                   # the steps' features and wall times, for refits
    return run

"""Prefill/decode disaggregation on the virtual clock: pools of instances and a KV transfer
cost, against co-located instances that prefill in chunks between decodes.

    sim = PoolSimulator(CostModel.load("nvidia-h200/llama-3.1-8b"), num_prefill=1, num_decode=1,
                        transfer_s_per_block=block_bytes / 25e9)
    pd = sim.run(trace)                                    # RunResult, as Simulator's
    co = PoolSimulator(cost, num_colocated=2).run(trace)   # the same two GPUs, co-located

Each instance is a real scheduler stepped on its own clock by the cost model; the instance
whose next step starts first runs next, so a request handed from one to another never
starts before it was handed over. Disaggregated, a request:
1. arrives at a prefill instance (round robin), runs with max_tokens=1: its first token is
   reported when that step ends (TTFT);
2. its KV travels: `transfer_latency_s + blocks x transfer_s_per_block` (blocks of its
   prompt), then it joins the decode instance with the fewest unfinished requests;
3. there it runs as a toolkit consumer would (kv_transfer.ConnectorScheduler with a
   connector that matches every token but the last): only the first token's position is
   computed, then it decodes to its output length.
Co-located (num_colocated=n) is Simulator's loop over n instances (round robin); with n=1
it is Simulator exactly (tests/simulator/test_disagg.py compares them).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

from toolkit.blocks.prefix_caching import PrefixCachingAllocator
from toolkit.kv_transfer.base import KVConnectorBase, KVConnectorMetadata
from toolkit.kv_transfer.scheduler import ConnectorScheduler
from toolkit.schedulers.continuous import ContinuousBatchingScheduler
from toolkit.schedulers.simulate import fake_token
from toolkit.simulator.result import RequestTiming, RunResult, step_log
from toolkit.simulator.sim import IDLE_TICK
from toolkit.simulator.trace import Trace
from toolkit.types import Request, SamplingParams


class HandoffConnector(KVConnectorBase):
    """The decode side of the simulation: a handed-off request's tokens but the last are
    there (the transfer's time was paid before it arrived); nothing moves."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return max(0, request.num_tokens - 1 - num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, block_ids: Any, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def start_load_kv(self) -> None:
        pass


@dataclass
class _Instance:
    kind: str                                   # "prefill", "decode" or "both"
    sched: Any
    now: float = 0.0
    inbox: list = field(default_factory=list)   # heap of (time, seq, Request)

    def next_time(self) -> float:
        if self.sched.has_unfinished():
            return self.now
        return max(self.now, self.inbox[0][0]) if self.inbox else float("inf")


class PoolSimulator:
    def __init__(self, cost: Any, *, num_prefill: int = 0, num_decode: int = 0, num_colocated: int = 0,
                 transfer_s_per_block: float = 0.0, transfer_latency_s: float = 0.0,
                 num_blocks: int = 4096, block_size: int = 16, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, enable_prefix_caching: bool = True,
                 enable_chunked_prefill: bool = True, policy: Any = "fcfs", vocab_size: int = 32000,
                 max_steps: int = 2_000_000) -> None:
        for name, v in dict(num_prefill=num_prefill, num_decode=num_decode, num_colocated=num_colocated).items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if bool(num_colocated) == bool(num_prefill or num_decode) or bool(num_prefill) != bool(num_decode):
            raise ValueError("give num_prefill >= 1 and num_decode >= 1 (disaggregated), or num_colocated >= 1; "
                             f"got num_prefill={num_prefill}, num_decode={num_decode}, num_colocated={num_colocated}")
        for name, v in dict(transfer_s_per_block=transfer_s_per_block, transfer_latency_s=transfer_latency_s).items():
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
                raise ValueError(f"{name} must be seconds >= 0, got {v!r}")
        self.cost = cost
        self.kinds = ["prefill"] * num_prefill + ["decode"] * num_decode + ["both"] * num_colocated
        self.transfer_s_per_block, self.transfer_latency_s = float(transfer_s_per_block), float(transfer_latency_s)
        self.settings = dict(block_size=block_size, max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens,
                             enable_prefix_caching=enable_prefix_caching,
                             enable_chunked_prefill=enable_chunked_prefill)
        self.num_blocks, self.policy = num_blocks, policy
        self.vocab_size, self.max_steps = vocab_size, max_steps

    def _instance(self, kind: str) -> _Instance:
        inst = _Instance(kind, None)
        alloc = PrefixCachingAllocator(self.num_blocks, self.settings["block_size"])
        clock = lambda: inst.now
        if kind == "decode":
            inst.sched = ConnectorScheduler(alloc, kv_connector=HandoffConnector(), policy=self.policy,
                                            clock=clock, **self.settings)
        else:
            inst.sched = ContinuousBatchingScheduler(alloc, policy=self.policy, clock=clock, **self.settings)
        return inst

    def transfer_time(self, num_tokens: int) -> float:
        return self.transfer_latency_s + -(-num_tokens // self.settings["block_size"]) * self.transfer_s_per_block

    def run(self, trace: Trace, label: str | None = None) -> RunResult:
        insts = [self._instance(k) for k in self.kinds]
        entry = [i for i in insts if i.kind in ("prefill", "both")]
        decode = [i for i in insts if i.kind == "decode"]
        seq = itertools.count()
        timing = {r.request_id: RequestTiming(r.request_id, r.arrival, r.prompt_len, r.output_len,
                                              r.client_id, r.deadline) for r in trace.requests}
        what = (f"{len(entry)}P+{len(decode)}D, {self.transfer_s_per_block * 1e3:g} ms/block" if decode
                else f"{len(entry)} co-located")
        run = RunResult(timing, [], label or f"pools {what}")
        originals = {r.request_id: r for r in trace.requests}
        for k, r in enumerate(trace.requests):
            req = r.to_request()
            if entry[0].kind == "prefill":
                req.sampling_params = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)
            heapq.heappush(entry[k % len(entry)].inbox, (r.arrival, next(seq), req))
        admit = getattr(self.cost, "admission_time", None)
        for _ in range(self.max_steps):
            inst = min(insts, key=_Instance.next_time)
            t = inst.next_time()
            if t == float("inf"):
                return run
            inst.now = t
            while inst.inbox and inst.inbox[0][0] <= inst.now:
                _, _, req = heapq.heappop(inst.inbox)
                if admit is not None:
                    inst.now += admit(req.num_prompt_tokens)
                inst.sched.add_request(req)
                if inst.kind != "decode":
                    timing[req.request_id].admitted = inst.now
            start = inst.now
            out = inst.sched.schedule()
            if out.is_empty:
                self._stamp(inst, inst.sched.update(out, {}), timing)
                if inst.sched.has_unfinished():
                    inst.now = inst.inbox[0][0] if inst.inbox else inst.now + IDLE_TICK
                continue
            inst.now += float(self.cost(out))
            sampled = {s.request_id: [fake_token(s.request_id, s.request.num_tokens, self.vocab_size)]
                       for s in out.scheduled if s.samples}
            outputs = inst.sched.update(out, sampled)
            self._stamp(inst, outputs, timing)
            run.steps.append(step_log(start, inst.now - start, out, inst.sched, inst.sched.allocator))
            run.num_preemptions += len(out.preempted_ids)
            if inst.kind == "prefill":
                self._hand_off(inst, out, outputs, decode, originals, timing, seq)
        raise RuntimeError(f"simulation not done after max_steps={self.max_steps}; raise max_steps")

    def _hand_off(self, inst: _Instance, out, outputs, decode: list[_Instance], originals, timing, seq) -> None:
        """Finished prefills travel to the least loaded decode instance."""
        reqs = {s.request_id: s.request for s in out.scheduled}
        for o in outputs:
            r = originals[o.request_id]
            if not o.finished or r.output_len <= 1:
                if o.finished:
                    timing[o.request_id].finish, timing[o.request_id].finish_reason = inst.now, o.finish_reason
                continue
            first = reqs[o.request_id].output_token_ids[0]
            cont = Request(r.request_id, list(r.prompt_ids) + [first],
                           SamplingParams(max_tokens=r.output_len - 1, ignore_eos=True, temperature=0.0),
                           arrival_time=r.arrival, **r.policy_fields())
            dst = min(decode, key=lambda d: d.sched.num_unfinished() + len(d.inbox))
            heapq.heappush(dst.inbox, (inst.now + self.transfer_time(r.prompt_len), next(seq), cont))

    @staticmethod
    def _stamp(inst: _Instance, outputs, timing: dict[str, RequestTiming]) -> None:
        for o in outputs:
            t = timing[o.request_id]
            t.token_times.extend([inst.now] * len(o.new_token_ids))
            if o.finished and inst.kind != "prefill":
                t.finish, t.finish_reason = inst.now, o.finish_reason

    def __repr__(self) -> str:
        return (f"PoolSimulator({self.kinds}, transfer={self.transfer_s_per_block * 1e3:g} ms/block "
                f"+ {self.transfer_latency_s * 1e3:g} ms, cost={self.cost!r})")


def compare(trace: Trace, cost: Any, *, block_bytes: int, gbps: tuple[float, ...] = (50.0, 10.0, 1.0),
            gpus: int = 2, ttft_slo: float | None = None, tpot_slo: float | None = None, **settings: Any) -> str:
    """A table: `gpus` co-located instances against 1 prefill + (gpus - 1) decode instances at
    each transfer bandwidth (GB/s) for blocks of `block_bytes`."""
    from toolkit.simulator.metrics import table

    runs = [PoolSimulator(cost, num_colocated=gpus, **settings).run(trace)]
    for g in gbps:
        runs.append(PoolSimulator(cost, num_prefill=1, num_decode=gpus - 1,
                                  transfer_s_per_block=block_bytes / (g * 1e9), **settings)
                    .run(trace, label=f"1P+{gpus - 1}D @ {g:g} GB/s"))
    return table([r.summary(ttft_slo=ttft_slo, tpot_slo=tpot_slo) for r in runs])

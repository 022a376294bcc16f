"""Data-parallel replicas on the virtual clock: a router in front of N simulated engines.

    sim = ReplicaSimulator("prefix_affinity", 4, cost=CostModel.load("nvidia-h200/qwen3-0.6b"))
    run = sim.run(make_trace(lengths, rate=40.0, system_prompts=8))
    run.prefix_hit_rate, run.requests_per_replica, run.summary()

Each replica is what `Simulator` builds (the real scheduler, its policy and a prefix-caching
allocator) with its own clock: replicas run their steps in parallel, as N GPUs do. Events
happen in time order: an arrival is routed by the router over the replicas' views at that
instant (their schedulers' running and waiting counts, KV usage and exact cached block
hashes), then added to the chosen replica; a replica's step is planned when it starts
(`schedule()`) and its tokens land when it ends (`update()`, after `cost(out)` seconds).
A cost model's admission time is charged to the replica that takes the request, before its
next step. Async output is not modelled here (`Simulator(async_output=True)` is).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from toolkit.registry import create_part
from toolkit.routing.base import ReplicaView, RouteRequest
from toolkit.schedulers.simulate import fake_token
from toolkit.simulator.result import RequestTiming, RunResult, step_log
from toolkit.simulator.sim import IDLE_TICK, Simulator
from toolkit.simulator.trace import Trace


@dataclass
class ReplicaRunResult(RunResult):
    """A RunResult over every replica (steps of all replicas, in time order), plus which
    replica served each request and the prefix-cache hits at each request's admission."""

    replica_of: dict[str, int] = field(default_factory=dict)
    cached_tokens: dict[str, int] = field(default_factory=dict)   # prompt tokens hit at first admission
    num_replicas: int = 1

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens found in a prefix cache / prompt tokens, over admitted requests."""
        prompt = sum(self.requests[r].prompt_len for r in self.cached_tokens)
        return sum(self.cached_tokens.values()) / prompt if prompt else 0.0

    @property
    def requests_per_replica(self) -> list[int]:
        counts = [0] * self.num_replicas
        for i in self.replica_of.values():
            counts[i] += 1
        return counts

    def summary(self, **slo) -> dict:
        s = super().summary(**slo)
        s.update(prefix_hit_rate=self.prefix_hit_rate, requests_per_replica=self.requests_per_replica)
        return s


class _Cached:
    """A replica's cached block hashes, read through its allocator (read-only membership)."""

    __slots__ = ("_alloc",)

    def __init__(self, alloc: Any) -> None:
        self._alloc = alloc

    def __contains__(self, block_hash: object) -> bool:
        return isinstance(block_hash, int) and self._alloc.peek([block_hash]) == 1


@dataclass
class _Replica:
    sim: Simulator                  # its clock (sim.now) and its settings
    sched: Any
    step: Any = None                # (SchedulerOutput or None for an idle tick, start, end) in flight
    admit: float = 0.0              # admission seconds owed before the next step


class ReplicaSimulator:
    """`router`: a registered name ("round_robin", "least_loaded", "power_of_two",
    "prefix_affinity", "cache_aware"), a class or an instance (a prefix router's block_size
    defaults to the replicas'); the rest are `Simulator`'s arguments, the same for every
    replica."""

    def __init__(self, router: Any, num_replicas: int, policy: Any = "fcfs",
                 cost: Any = None, **settings: Any) -> None:
        if not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas must be a positive integer, got {num_replicas!r}")
        self.num_replicas = num_replicas
        self.template = Simulator(policy, cost, **settings)         # validates cost and settings
        self.policy, self.cost, self.settings = policy, cost, settings
        self.router_spec = router
        self.router = self._router()

    def _router(self) -> Any:
        return create_part("router", self.router_spec, block_size=self.template.settings["block_size"])

    def views(self, replicas: Sequence[_Replica]) -> list[ReplicaView]:
        out = []
        for i, r in enumerate(replicas):
            a = r.sched.allocator
            out.append(ReplicaView(i, True, r.sched.num_running, r.sched.num_waiting,
                                   1.0 - a.num_free_blocks() / max(a.num_blocks, 1), _Cached(a)))
        return out

    def run(self, trace: Trace, label: str | None = None) -> ReplicaRunResult:
        """Route and run every request of the trace to the end; the clock starts at 0. A
        fresh router (from a name or class) and fresh replicas each run."""
        if not isinstance(self.router_spec, str | type):
            router = self.router
        else:
            router = self.router = self._router()
        reps = []
        for _ in range(self.num_replicas):
            sim = Simulator(self.policy, self.cost, **self.settings)
            sim.now = 0.0
            reps.append(_Replica(sim, sim.build()))
        timing = {r.request_id: RequestTiming(r.request_id, r.arrival, r.prompt_len, r.output_len,
                                              r.client_id, r.deadline) for r in trace.requests}
        run = ReplicaRunResult(timing, [], label or f"{self.num_replicas} x {router!r}",
                               num_replicas=self.num_replicas)
        admit: Callable[[int], float] | None = getattr(self.cost, "admission_time", None)
        pending, k, steps = trace.requests, 0, 0
        for _ in range(self.template.max_steps * self.num_replicas):
            for r in reps:                                   # idle replicas with work start a step
                if r.step is None and r.sched.has_unfinished():
                    self._start(r, run)
            ends = [(r.step[2], i) for i, r in enumerate(reps) if r.step is not None]
            t_end, who = min(ends) if ends else (float("inf"), -1)
            if k < len(pending) and pending[k].arrival <= t_end:
                req = pending[k]
                k += 1
                for r in reps:                               # idle clocks catch up with the arrival
                    if r.step is None:
                        r.sim.now = max(r.sim.now, req.arrival)
                i = router.choose(RouteRequest(req.request_id, req.prompt_ids, req.client_id),
                                  self.views(reps))
                run.replica_of[req.request_id] = i
                rep = reps[i]
                if admit is not None:
                    rep.admit += admit(req.prompt_len)
                rep.sched.add_request(req.to_request())
                timing[req.request_id].admitted = max(req.arrival, rep.sim.now)
                timing[req.request_id].admitted_step = steps
                continue
            if who < 0:                                      # no arrival left, nothing running
                run.steps.sort(key=lambda s: s.time)
                return run
            steps += self._end(reps[who], run, steps)
        raise RuntimeError("replica simulation did not finish; raise max_steps")

    def _start(self, r: _Replica, run: ReplicaRunResult) -> None:
        r.sim.now += r.admit
        r.admit = 0.0
        start = r.sim.now
        out = r.sched.schedule()
        if out.is_empty:                                     # reports only, or nothing fits yet
            self._stamp(r.sched.update(out, {}), run, start)
            r.step = (None, start, start + IDLE_TICK) if r.sched.has_unfinished() else None
            return
        for s in out.scheduled:
            run.cached_tokens.setdefault(s.request_id, s.request.num_cached_tokens)
        r.step = (out, start, start + float(self.cost(out)))

    def _end(self, r: _Replica, run: ReplicaRunResult, steps: int) -> int:
        out, start, end = r.step
        r.step, r.sim.now = None, end
        if out is None:
            return 0
        vocab = self.template.vocab_size
        sampled = {s.request_id: [fake_token(s.request_id, s.request.num_tokens, vocab)]
                   for s in out.scheduled if s.samples}
        outputs = r.sched.update(out, sampled)
        for o in outputs:
            t = run.requests[o.request_id]
            if not t.token_times and o.new_token_ids:
                t.first_token_step = steps + 1
        self._stamp(outputs, run, end)
        run.steps.append(step_log(start, end - start, out, r.sched, r.sched.allocator))
        run.num_preemptions += len(out.preempted_ids)
        return 1

    @staticmethod
    def _stamp(outputs, run: ReplicaRunResult, now: float) -> None:
        for o in outputs:
            t = run.requests[o.request_id]
            t.token_times.extend([now] * len(o.new_token_ids))
            if o.finished:
                t.finish, t.finish_reason = now, o.finish_reason

    def __repr__(self) -> str:
        return (f"ReplicaSimulator({self.num_replicas} x {self.router!r}, policy={self.policy!r}, "
                f"cost={self.cost!r}, {self.settings})")


def compare_routers(routers: Sequence[Any], num_replicas: int, trace: Trace, **sim: Any) -> list[dict]:
    """One summary per router on the same trace and replica count (each with prefix_hit_rate
    and requests_per_replica)."""
    return [ReplicaSimulator(r, num_replicas, **sim).run(trace, label=f"{_name(r)} x{num_replicas}").summary()
            for r in routers]


def _name(router: Any) -> str:
    return router if isinstance(router, str) else getattr(router, "__name__", None) or repr(router)


__all__ = ["ReplicaSimulator", "ReplicaRunResult", "compare_routers"]

"""The simulator: the real scheduler and policy objects stepped on a virtual clock.

    sim = Simulator(policy="vtc", cost=CostModel.load("cpu/tiny-llama"), num_blocks=2048)
    run = sim.run(trace)                  # RunResult: token times, step log
    run.summary(ttft_slo=1.0, tpot_slo=0.1)

No model and no GPU: each step's plan comes from `ContinuousBatchingScheduler.schedule()`
exactly as in the engine, its duration from the cost model, its tokens from the fake model
(`schedulers.simulate.fake_token`, a hash; requests run with ignore_eos to their trace's
output length). The scheduler's clock is the virtual one, so time-aware policies (aging,
deadlines) see simulated time. `async_output=True` mirrors the engine's async
scheduling, where a step's tokens reach the caller at the end of the next step. A
CostModel with admission terms also charges each request's add_request on the clock when
it arrives, before the next step (the host work a driver of the engine does between steps).
"""

from __future__ import annotations

from typing import Any, Callable

from toolkit.blocks.prefix_caching import PrefixCachingAllocator
from toolkit.schedulers.continuous import ContinuousBatchingScheduler
from toolkit.schedulers.simulate import fake_token
from toolkit.simulator.cost import CostModel
from toolkit.simulator.result import RequestTiming, RunResult, step_log
from toolkit.simulator.trace import Trace
from toolkit.types import SchedulerOutput

IDLE_TICK = 1e-3   # seconds the clock moves when nothing can be scheduled before the next arrival


class Simulator:
    """Engine-like settings (the engine's EngineConfig names) and a cost model; `scheduler`
    replaces the built one with any factory(allocator, clock) -> scheduler."""

    def __init__(self, policy: Any = "fcfs", cost: CostModel | Callable[[SchedulerOutput], float] | None = None, *,
                 num_blocks: int = 4096, block_size: int = 16, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, enable_prefix_caching: bool = True,
                 enable_chunked_prefill: bool = True, max_model_len: int | None = None,
                 scheduler: Callable[[Any, Callable[[], float]], Any] | None = None,
                 vocab_size: int = 32000, max_steps: int = 2_000_000, async_output: bool = False,
                 max_loras: int | None = None, lora_load_s: float = 0.0) -> None:
        """max_loras: the scheduler keeps at most this many distinct adapters per step (trace
        requests' lora_id), as the engine's enable_lora does; each adapter copied into a slot
        that held another adds lora_load_s seconds to its step."""
        if cost is None:
            raise ValueError("give cost= a CostModel (CostModel.load(key), CostModel.fit(...)) or a "
                             f"function of the SchedulerOutput; shipped: {CostModel.available()}")
        self.policy, self.cost = policy, cost
        self.settings = dict(block_size=block_size, max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                             enable_prefix_caching=enable_prefix_caching,
                             enable_chunked_prefill=enable_chunked_prefill)
        self.num_blocks = num_blocks
        self.make_scheduler = scheduler
        self.vocab_size, self.max_steps = vocab_size, max_steps
        # the engine's async scheduling hands a step's tokens out at the end of the next step
        self.async_output = bool(async_output)
        self._held: list = []
        self.now = 0.0
        self.max_loras, self.lora_load_s = max_loras, float(lora_load_s)

    def build(self) -> Any:
        """A fresh allocator and scheduler on this simulator's clock (the policy is bound to it)."""
        alloc = PrefixCachingAllocator(self.num_blocks, self.settings["block_size"])
        if self.make_scheduler is not None:
            sched = self.make_scheduler(alloc, self._clock)
        else:
            sched = ContinuousBatchingScheduler(alloc, policy=self.policy, clock=self._clock, **self.settings)
        if self.max_loras is not None:
            from toolkit.lora.pool import AdapterPool

            if not getattr(sched, "supports_lora", False):
                raise ValueError(f"max_loras needs a scheduler that declares supports_lora; "
                                 f"{type(sched).__name__} does not")
            sched.lora_pool = AdapterPool(self.max_loras)
        return sched

    def _clock(self) -> float:
        return self.now

    def run(self, trace: Trace, label: str | None = None) -> RunResult:
        """Run every request of the trace to the end; the clock starts at 0."""
        self.now, self._held, self._steps = 0.0, [], 0
        sched = self.build()
        alloc = sched.allocator
        pending = list(trace.requests)
        timing = {r.request_id: RequestTiming(r.request_id, r.arrival, r.prompt_len, r.output_len,
                                              r.client_id, r.deadline) for r in pending}
        run = RunResult(timing, [], label or f"sim {getattr(sched, 'policy', self.policy)!r}")
        admit = getattr(self.cost, "admission_time", None)
        slot_holds: dict[int, int] = {}  # slot -> adapter, as the engine's LoRAState mirrors it
        k = 0
        for _ in range(self.max_steps):
            arrived = self.now           # like the engine's loop: who has arrived when it looks
            while k < len(pending) and pending[k].arrival <= arrived:
                if admit is not None:    # add_request's host time, before the next step
                    self.now += admit(pending[k].prompt_len)
                sched.add_request(pending[k].to_request())
                timing[pending[k].request_id].admitted = self.now
                timing[pending[k].request_id].admitted_step = self._steps
                k += 1
            if not sched.has_unfinished():
                self._flush(timing)
                if k == len(pending):
                    return run
                self.now = pending[k].arrival
                continue
            start = self.now
            out = sched.schedule()
            if out.is_empty:               # only reports (rejections), or nothing fits yet
                self._record(sched.update(out, {}), timing)
                if not sched.has_unfinished():
                    continue
                self.now = pending[k].arrival if k < len(pending) else self.now + IDLE_TICK
                continue
            self.now += float(self.cost(out))
            for adapter, slot in out.lora_slots.items():
                if slot_holds.get(slot) != adapter:
                    slot_holds[slot] = adapter
                    run.num_lora_loads += 1
                    self.now += self.lora_load_s
            self._steps += 1
            sampled = {s.request_id: [fake_token(s.request_id, s.request.num_tokens, self.vocab_size)]
                       for s in out.scheduled if s.samples}
            self._record(sched.update(out, sampled), timing)
            run.steps.append(step_log(start, self.now - start, out, sched, alloc))
            run.num_preemptions += len(out.preempted_ids)
        raise RuntimeError(f"simulation not done after max_steps={self.max_steps}; raise max_steps")

    def _record(self, outputs, timing: dict[str, RequestTiming]) -> None:
        """Stamp outputs with the clock (async_output: the previous step's now, these next)."""
        if self.async_output:
            self._flush(timing)
            self._held = list(outputs)
            return
        self._stamp(outputs, timing)

    def _flush(self, timing: dict[str, RequestTiming]) -> None:
        held, self._held = self._held, []
        self._stamp(held, timing)

    def _stamp(self, outputs, timing: dict[str, RequestTiming]) -> None:
        for o in outputs:
            t = timing[o.request_id]
            if not t.token_times and o.new_token_ids:
                t.first_token_step = self._steps
            t.token_times.extend([self.now] * len(o.new_token_ids))
            if o.finished:
                t.finish, t.finish_reason = self.now, o.finish_reason

    def __repr__(self) -> str:
        return f"Simulator(policy={self.policy!r}, cost={self.cost!r}, num_blocks={self.num_blocks}, {self.settings})"

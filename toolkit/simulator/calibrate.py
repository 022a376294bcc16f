"""Profile the real engine over step shapes and fit the simulator's cost model.

    samples = profile_engine(llm, decode=[(8, 256), (32, 512), (64, 1024)], prefill=[256, 1024, (64, 4)],
                             mixed=[(32, 512, 256), (16, 256, 128)])   # a sample per cost feature
    admission = profile_admission(llm)    # add_request's host seconds: per request, per token
    cost = CostModel.fit(samples, source="my GPU, my model", admission=admission)
    cost.save("my-gpu/my-model")          # toolkit/simulator/data/cost_models.json (or path=)

Each shape is a run of identical steps through the public engine (`add_request`, `step`):
- decode (B, L): B sequences with L-token prompts, all prefilled, then decode steps;
- prefill P or (P, k): one new P-token prompt per step (max_tokens=1), or k of them,
  nothing else running;
- mixed (B, L, P) or (B, L, P, k): the B decodes plus one (k) new P-token prompt(s) a step.
k prompts of P tokens against one of k * P tell a prompt's own cost (prefill_seqs) from its
tokens'. One sample per shape: the mean wall time of `engine.step()` over `steps` calls
(after `warmup`), with the mean features of the steps the observer saw. The mean, not the
median: a simulated run's length is the sum of its steps, so occasional slow steps (a busy
shared CPU, a collection) count as they do in a real run; but a step over `outlier` times
the shape's median is left out: a kernel compiled or a graph captured at the first step of
a new size (one such step in 10 moved a shape's mean by 2x on the H200). The engine's
max_num_batched_tokens must hold k * P (and B + k * P), and max_num_seqs B + k.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any, Callable, Sequence

import numpy as np

from toolkit.simulator.cost import CostModel, moe_routing
from toolkit.simulator.replay import TraceRecorder, _engine_of
from toolkit.types import SamplingParams


def device_key(engine_or_llm: Any, shape: str) -> str:
    """"<device>/<shape>": e.g. "nvidia-h200/llama-3.1-8b", "cpu/tiny-llama"."""
    import torch

    engine = _engine_of(engine_or_llm)
    dev = getattr(engine.runner, "device", torch.device("cpu"))
    name = torch.cuda.get_device_name(dev) if getattr(dev, "type", "cpu") == "cuda" else "cpu"
    return f"{name.lower().replace(' ', '-')}/{shape}"


class _Shapes:
    def __init__(self, engine: Any, steps: int, warmup: int, seed: int,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.engine, self.steps, self.warmup, self.clock = engine, steps, warmup, clock
        self.rng = random.Random(seed)
        self.vocab = engine.model.spec.vocab_size
        self.rec = TraceRecorder(engine)
        self.n = 0

    def prompt(self, length: int) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(length)]

    def add(self, length: int, max_tokens: int) -> str:
        self.n += 1
        return self.engine.add_request(self.prompt(length), SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, temperature=0.0), request_id=f"cal{self.n}")

    def decoders(self, batch: int, context: int) -> list[str]:
        """batch sequences with context-token prompts, prefilled (then they decode)."""
        # the first ones decode while the last ones prefill: enough tokens to outlast that
        budget = getattr(self.engine.scheduler, "max_num_batched_tokens", batch * context)
        prefill_steps = -(-batch * context // max(budget - batch, 1))
        ids = [self.add(context, prefill_steps + self.warmup + self.steps + 4) for _ in range(batch)]
        sched = self.engine.scheduler
        while any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.requests.values()):
            self.engine.step()
        return ids

    def timed(self, prefill: int | None, k: int = 1, outlier: float = 3.0) -> tuple[np.ndarray, float, int]:
        """Mean features and wall seconds of `steps` steps (after `warmup`), each adding k
        prefill-token prompts first when prefill is set; and how many steps were left out
        as outliers (over `outlier` x the median: compiles, captures)."""
        walls = []
        first = len(self.rec.steps)
        for i in range(self.warmup + self.steps):
            if prefill:
                for _ in range(k):
                    self.add(prefill, 1)
            t = self.clock()
            self.engine.step()
            if i >= self.warmup:
                walls.append(self.clock() - t)
        feats = [s.features for s in self.rec.steps[first + self.warmup:]] or \
            [s.features for s in self.rec.steps[first:]]
        med = statistics.median(walls)
        kept = [w for w in walls if w <= outlier * med]
        return np.mean(np.stack(feats), axis=0), statistics.fmean(kept), len(walls) - len(kept)

    def drain(self, ids: Sequence[str] = ()) -> None:
        self.engine.abort(list(ids))
        while self.engine.has_unfinished():
            self.engine.step()


def _prompts_of(spec: int | Sequence[int]) -> tuple[int, int]:
    """P or (P, k) -> (P, k)."""
    p, k = (spec, 1) if isinstance(spec, int) else tuple(spec)
    if p < 1 or k < 1:
        raise ValueError(f"a prefill shape is P or (P, k) with P, k >= 1, got {spec!r}")
    return int(p), int(k)


def profile_engine(target: Any, *, decode: Sequence[tuple[int, int]] = (), prefill: Sequence = (),
                   mixed: Sequence[tuple[int, ...]] = (), steps: int = 8, warmup: int = 2,
                   seed: int = 0, outlier: float = 3.0, progress: bool = False,
                   clock: Callable[[], float] = time.perf_counter) -> list[tuple[np.ndarray, float]]:
    """(features, seconds) samples, one per shape (see the module docstring). The engine
    must be idle; it is left idle. clock: wall time; `time.thread_time` (the CPU seconds of
    this thread) measures a CPU engine of one torch thread apart from other load on the host."""
    engine = _engine_of(target)
    if engine.has_unfinished():
        raise ValueError("profile_engine needs an idle engine (it aborts what it adds, nothing else)")
    sh = _Shapes(engine, steps, warmup, seed, clock)
    samples: list[tuple[np.ndarray, float]] = []
    shapes = [("decode", b, c, None, 1) for b, c in decode] + \
        [("prefill", 0, 0, *_prompts_of(p)) for p in prefill] + \
        [("mixed", m[0], m[1], *_prompts_of(tuple(m[2:]) if len(m) > 3 else m[2])) for m in mixed]
    try:
        for kind, b, c, p, k in shapes:
            ids = sh.decoders(b, c) if b else []
            x, y, dropped = sh.timed(p, k, outlier)
            samples.append((x, y))
            sh.drain(ids)
            if progress:
                print(f"  {kind:7s} B={b:<4d} L={c:<5d} P={p or 0:<5d} k={k:<3d} {y * 1e3:8.2f} ms"
                      + (f"  ({dropped} outlier step(s) left out)" if dropped else ""), flush=True)
    finally:
        sh.rec.detach()
        sh.drain()
    return samples


def profile_admission(target: Any, *, lengths: Sequence[int] = (16, 256, 1024), repeats: int = 20,
                      seed: int = 0) -> dict[str, float]:
    """Host seconds of engine.add_request (random prompt ids, nothing scheduled: each is
    aborted at once), fitted as per_request + per_token * prompt tokens (non-negative least
    squares over the median time of each length). The engine must be idle."""
    from toolkit.simulator.cost import _nnls

    engine = _engine_of(target)
    if engine.has_unfinished():
        raise ValueError("profile_admission needs an idle engine")
    rng = random.Random(seed)
    vocab = engine.model.spec.vocab_size
    params = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)
    lens, secs = [], []
    for n in lengths:
        times = []
        for i in range(repeats + 1):
            prompt = [rng.randrange(vocab) for _ in range(n)]
            t = time.perf_counter()
            rid = engine.add_request(prompt, params, request_id=f"adm{n}-{i}")
            times.append(time.perf_counter() - t)
            engine.abort(rid)
        lens.append(n)
        secs.append(statistics.median(times[1:]))          # the first warms caches
    A = np.column_stack([np.ones(len(lens)), np.array(lens, dtype=np.float64)])
    w = _nnls(A, np.array(secs))
    return {"per_request": float(w[0]), "per_token": float(w[1])}


def fit_engine(target: Any, *, source: str, admission: bool = True, **shapes: Any) -> CostModel:
    """profile_engine (and profile_admission), then CostModel.fit."""
    adm = profile_admission(target) if admission else None
    engine = _engine_of(target)
    return CostModel.fit(profile_engine(target, **shapes), source=source, admission=adm,
                         graph_tokens=engine.runner.graph_tokens,
                         moe=moe_routing(getattr(engine.model, "config", None)))

"""Profile the real engine over step shapes and fit the simulator's cost model.

    samples = profile_engine(llm, decode=[(32, 512)], prefill=[256, 1024], mixed=[(32, 512, 256)])
    cost = CostModel.fit(samples, source="my GPU, my model")
    cost.save("my-gpu/my-model")          # toolkit/simulator/data/cost_models.json (or path=)

Each shape is a run of identical steps through the public engine (`add_request`, `step`):
- decode (B, L): B sequences with L-token prompts, all prefilled, then decode steps;
- prefill P: one new P-token prompt per step (max_tokens=1), nothing else running;
- mixed (B, L, P): the B decodes plus one new P-token prompt per step.
One sample per shape: the mean wall time of `engine.step()` over `steps` calls (after
`warmup`), with the mean features of the steps the observer saw. The mean, not the median:
a simulated run's length is the sum of its steps, so occasional slow steps (a busy shared
CPU, a collection) count as they do in a real run. The engine's
max_num_batched_tokens must hold P (and B + P), and max_num_seqs B + 1.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any, Sequence

import numpy as np

from toolkit.simulator.cost import CostModel
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
    def __init__(self, engine: Any, steps: int, warmup: int, seed: int) -> None:
        self.engine, self.steps, self.warmup = engine, steps, warmup
        self.rng = random.Random(seed)
        self.vocab = engine.model.vocab_size
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

    def timed(self, prefill: int | None) -> tuple[np.ndarray, float]:
        """Mean features and wall seconds of `steps` steps (after `warmup`), each adding one
        prefill-token prompt first when prefill is set."""
        walls = []
        first = len(self.rec.steps)
        for i in range(self.warmup + self.steps):
            if prefill:
                self.add(prefill, 1)
            t = time.perf_counter()
            self.engine.step()
            if i >= self.warmup:
                walls.append(time.perf_counter() - t)
        feats = [s.features for s in self.rec.steps[first + self.warmup:]] or \
            [s.features for s in self.rec.steps[first:]]
        return np.mean(np.stack(feats), axis=0), statistics.fmean(walls)

    def drain(self, ids: Sequence[str] = ()) -> None:
        self.engine.abort(list(ids))
        while self.engine.has_unfinished():
            self.engine.step()


def profile_engine(target: Any, *, decode: Sequence[tuple[int, int]] = (), prefill: Sequence[int] = (),
                   mixed: Sequence[tuple[int, int, int]] = (), steps: int = 8, warmup: int = 2,
                   seed: int = 0, progress: bool = False) -> list[tuple[np.ndarray, float]]:
    """(features, seconds) samples, one per shape (see the module docstring). The engine
    must be idle; it is left idle."""
    engine = _engine_of(target)
    if engine.has_unfinished():
        raise ValueError("profile_engine needs an idle engine (it aborts what it adds, nothing else)")
    sh = _Shapes(engine, steps, warmup, seed)
    samples: list[tuple[np.ndarray, float]] = []
    shapes = [("decode", b, c, None) for b, c in decode] + [("prefill", 0, 0, p) for p in prefill] + \
        [("mixed", b, c, p) for b, c, p in mixed]
    try:
        for kind, b, c, p in shapes:
            ids = sh.decoders(b, c) if b else []
            x, y = sh.timed(p)
            samples.append((x, y))
            sh.drain(ids)
            if progress:
                print(f"  {kind:7s} B={b:<4d} L={c:<5d} P={p or 0:<5d} {y * 1e3:8.2f} ms", flush=True)
    finally:
        sh.rec.detach()
        sh.drain()
    return samples


def fit_engine(target: Any, *, source: str, **shapes: Any) -> CostModel:
    """profile_engine, then CostModel.fit."""
    return CostModel.fit(profile_engine(target, **shapes), source=source)

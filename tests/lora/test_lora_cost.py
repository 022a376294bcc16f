"""The cost model's LoRA terms: lora_tokens (a step's tokens that run an adapter) and
lora_adapters (the distinct adapters among them), counted from a step's plan, recovered by
the fit, charged by the Simulator (spreading the same tokens over more adapters costs more)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from toolkit.lora.request import LoRARequest
from toolkit.simulator import FEATURES, CostModel, Simulator, step_features
from toolkit.simulator.cost import as_features
from toolkit.simulator.trace import Trace, TraceRequest
from toolkit.types import Request, SamplingParams, ScheduledRequest, SchedulerOutput

TOK, ADA = FEATURES.index("lora_tokens"), FEATURES.index("lora_adapters")


def _chunk(rid: str, prompt: int, start: int, n: int, lora: int | None) -> ScheduledRequest:
    req = Request(rid, list(range(prompt)), SamplingParams(),
                  lora_request=LoRARequest(f"a{lora}", lora) if lora else None)
    return ScheduledRequest(req, start, n, [0])


def test_step_features_count_adapter_tokens_and_distinct_adapters():
    out = SchedulerOutput([_chunk("base", 9, 0, 9, None),      # a base prefill: no LoRA work
                           _chunk("p1", 12, 4, 5, 1),           # a prompt chunk of adapter 1
                           _chunk("d1", 6, 6, 1, 1),            # decodes of adapters 1 and 2
                           _chunk("d2", 3, 7, 1, 2)])
    x = step_features(out)
    assert (x[TOK], x[ADA]) == (7.0, 2.0)
    base = step_features(SchedulerOutput([_chunk("b", 9, 0, 9, None)]))
    assert (base[TOK], base[ADA]) == (0.0, 0.0)
    old = as_features(np.ones(9))                              # a vector recorded before the terms
    assert old.shape == (len(FEATURES),) and old[TOK] == old[ADA] == 0.0


def test_fit_recovers_the_lora_terms():
    rng = np.random.default_rng(0)
    n = 40
    X = np.zeros((n, len(FEATURES)))
    X[:, 0] = 1.0
    X[:, FEATURES.index("prefill_tokens")] = rng.integers(0, 2048, n)
    X[:, FEATURES.index("decode_seqs")] = rng.integers(0, 128, n)
    X[:, ADA] = rng.integers(0, 9, n)
    X[:, TOK] = X[:, ADA] * rng.integers(1, 64, n)             # adapters' tokens: none without adapters
    true = {"const": 2e-3, "prefill_tokens": 1e-5, "decode_seqs": 5e-5, "lora_tokens": 3e-6, "lora_adapters": 4e-4}
    y = X @ np.array([true.get(f, 0.0) for f in FEATURES])
    m = CostModel.fit(zip(X, y))
    for f, v in true.items():
        assert m.coef[f] == pytest.approx(v, rel=1e-6)
    assert "lora_adapters=0.0004" in repr(m)


def _trace(adapters: int, n: int = 48, seed: int = 0) -> Trace:
    rng = random.Random(seed)
    return Trace([TraceRequest(str(i), 0.0, [rng.randrange(100) for _ in range(rng.randint(8, 32))],
                               rng.randint(4, 12), lora_id=(i % adapters) + 1 if adapters else None)
                  for i in range(n)])


def test_the_simulator_charges_adapters():
    """One trace (same lengths, same seeds) run as base requests, all on one adapter and spread
    over 8: every request runs an adapter token per step it is in, and 8 adapters per step
    cost more than one."""
    cost = CostModel({"const": 1e-3, "prefill_tokens": 1e-5, "decode_seqs": 2e-5,
                      "lora_tokens": 1e-5, "lora_adapters": 5e-4})
    span = {}
    for adapters in (0, 1, 8):
        run = Simulator("fcfs", cost, num_blocks=512, max_num_seqs=16).run(_trace(adapters))
        assert all(r.finish is not None for r in run.requests.values())
        span[adapters] = run.makespan
    assert span[0] < span[1] < span[8]
    plain = CostModel({k: v for k, v in cost.coef.items() if not k.startswith("lora")})
    assert Simulator("fcfs", plain, num_blocks=512, max_num_seqs=16).run(_trace(8)).makespan == pytest.approx(span[0])

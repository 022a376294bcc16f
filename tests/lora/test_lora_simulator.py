"""The simulator runs the real scheduler with max_loras: a many-adapter trace under FCFS and
under an adapter-aware policy (the one of tests/lora/test_lora_scheduling.py), slot loads
counted and charged."""

from __future__ import annotations

import random

from test_lora_scheduling import AdapterAffinity

from toolkit.simulator.sim import Simulator
from toolkit.simulator.trace import Trace, TraceRequest


def _trace(n: int = 60, adapters: int = 12, seed: int = 0) -> Trace:
    rng = random.Random(seed)
    return Trace([TraceRequest(str(i), i * 0.002, [rng.randrange(100) for _ in range(rng.randint(4, 40))],
                               rng.randint(2, 20), lora_id=rng.choice([None] + list(range(1, adapters + 1))))
                  for i in range(n)], label="many adapters")


def test_many_adapters_two_policies():
    cost = lambda out: 1e-3 + 1e-5 * out.total_num_scheduled_tokens        # noqa: E731
    results = {}
    for name, policy in (("fcfs", "fcfs"), ("affinity", AdapterAffinity())):
        sim = Simulator(policy, cost, num_blocks=256, max_num_seqs=16, max_loras=4, lora_load_s=0.002)
        run = sim.run(_trace())
        assert len(run.requests) == 60 and all(r.finish is not None for r in run.requests.values())
        results[name] = run
    distinct = len({r.lora_id for r in _trace().requests} - {None})
    assert distinct <= results["affinity"].num_lora_loads <= results["fcfs"].num_lora_loads
    plain = Simulator("fcfs", cost, num_blocks=256, max_num_seqs=16).run(_trace())
    assert plain.num_lora_loads == 0

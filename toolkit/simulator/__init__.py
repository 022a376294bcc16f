"""Scheduling research harness: the real scheduler and policies on a virtual clock.

    from toolkit.simulator import Simulator, CostModel, sharegpt_lengths, make_trace
    trace = make_trace(sharegpt_lengths(300), rate=5.0)
    run = Simulator("fcfs", CostModel.load("cpu/tiny-llama")).run(trace)
    run.summary(ttft_slo=1.0, tpot_slo=0.1)

Parts: cost.py (step time model, fitted, JSON data), workloads.py / trace.py (lengths,
arrivals, clients, shared prefixes; traces as data), sim.py (the virtual clock),
replay.py (record a real run, run a trace on the engine), calibrate.py (profile the
engine, fit the cost model), metrics.py, plots.py.
"""

from toolkit.simulator.cost import FEATURES, CostModel, step_features
from toolkit.simulator.metrics import jain_index, summarize, table
from toolkit.simulator.replicas import ReplicaRunResult, ReplicaSimulator, compare_routers
from toolkit.simulator.result import RequestTiming, RunResult, StepLog
from toolkit.simulator.sim import Simulator
from toolkit.simulator.trace import Trace, TraceRequest
from toolkit.simulator.workloads import (
    gamma_arrivals,
    make_trace,
    multi_client_trace,
    poisson_arrivals,
    scaled_lengths,
    sharegpt_lengths,
    synthetic_lengths,
)

__all__ = ["CostModel", "FEATURES", "step_features", "Simulator", "RunResult", "RequestTiming", "StepLog",
           "Trace", "TraceRequest", "summarize", "table", "jain_index", "sharegpt_lengths", "synthetic_lengths",
           "scaled_lengths", "make_trace", "multi_client_trace", "poisson_arrivals", "gamma_arrivals",
           "ReplicaSimulator", "ReplicaRunResult", "compare_routers"]

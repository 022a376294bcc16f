"""Metrics of a run: latency percentiles, throughput, goodput under SLOs, fairness.

    summarize(run, ttft_slo=1.0, tpot_slo=0.1)
    -> {"ttft": {"mean", "p50", "p90", "p99"}, "tpot": ..., "itl": ..., "e2e": ...,
        "throughput_tok_s", "throughput_req_s", "goodput_req_s", "slo_attainment",
        "jain_fairness", "preemptions", "kv_usage_mean", "kv_usage_max", ...}

Goodput: finished requests per second that met every SLO given (TTFT, TPOT, and the
request's own deadline when it has one), over the run's makespan.

Fairness: Jain's index (sum x)^2 / (n sum x^2) over clients of x_c = the service client c
got / its max-min fair share, in the window where every client is still sending (from the
first arrival to the earliest of the clients' last arrivals). Service counts tokens
computed (prompt and output); the fair share water-fills the window's capacity (the tokens
served in it) over the clients' demands (the tokens of their requests that arrived in it).
1.0: each client got its fair share; a starved client pulls it towards 1/n.
"""

from __future__ import annotations

import numpy as np

from toolkit.simulator.result import RunResult

PCTS = (50, 90, 99)


def distribution(values: np.ndarray) -> dict[str, float]:
    if len(values) == 0:
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in PCTS}}
    return {"mean": float(values.mean()), **{f"p{p}": float(np.percentile(values, p)) for p in PCTS}}


def jain_index(x) -> float:
    """Jain's fairness index of non-negative values: 1 = all equal, 1/n = one gets all."""
    x = np.asarray(list(x), dtype=np.float64)
    if len(x) == 0 or not np.any(x):
        return float("nan")
    return float(x.sum() ** 2 / (len(x) * (x ** 2).sum()))


def max_min_shares(demands: dict[str, float], capacity: float) -> dict[str, float]:
    """Water-filling: each client gets min(demand, level), the level set so the shares sum
    to capacity (or to the total demand if that is less)."""
    shares, left, todo = {}, float(capacity), sorted(demands, key=demands.get)
    while todo:
        level = left / len(todo)
        c = todo[0]
        if demands[c] <= level:
            shares[c] = demands[c]
            left -= demands[c]
            todo.pop(0)
        else:
            for c in todo:
                shares[c] = level
            return shares
    return shares


def fairness(run: RunResult) -> float:
    """Jain's index of service / max-min fair share over clients (see the module docstring);
    NaN with fewer than two clients."""
    reqs = list(run.requests.values())
    clients = sorted({r.client_id for r in reqs if r.client_id is not None})
    if len(clients) < 2:
        return float("nan")
    end = min(max(r.arrival for r in reqs if r.client_id == c) for c in clients)
    served = dict.fromkeys(clients, 0.0)
    for s in run.steps:
        if s.time >= end:
            break
        for c, n in s.tokens_by_client.items():
            if c in served:
                served[c] += n
    demand = {c: float(sum(r.prompt_len + r.output_len for r in reqs if r.client_id == c and r.arrival < end))
              for c in clients}
    shares = max_min_shares(demand, sum(served.values()))
    return jain_index(served[c] / shares[c] for c in clients if shares.get(c, 0) > 0)


def summarize(run: RunResult, *, ttft_slo: float | None = None, tpot_slo: float | None = None) -> dict:
    reqs = list(run.requests.values())
    done = [r for r in reqs if r.finish is not None and r.token_times]
    span = max(run.makespan, 1e-12)
    good = [r for r in done if _meets(r, ttft_slo, tpot_slo)]
    kv = np.array([s.kv_usage for s in run.steps]) if run.steps else np.zeros(1)
    return {
        "label": run.label,
        "requests": len(reqs), "finished": len(done),
        "rejected": sum(r.finish_reason == "rejected" for r in reqs),
        "ttft": distribution(run.values("ttft")), "tpot": distribution(run.values("tpot")),
        "itl": distribution(run.values("itl")), "e2e": distribution(run.values("e2e")),
        "makespan_s": run.makespan,
        "throughput_tok_s": sum(len(r.token_times) for r in done) / span,
        "throughput_req_s": len(done) / span,
        "goodput_req_s": len(good) / span,
        "slo_attainment": len(good) / max(len(reqs), 1),
        "jain_fairness": fairness(run),
        "preemptions": run.num_preemptions,
        "kv_usage_mean": float(kv.mean()), "kv_usage_max": float(kv.max()),
        "steps": len(run.steps),
    }


def _meets(r, ttft_slo: float | None, tpot_slo: float | None) -> bool:
    if ttft_slo is not None and (r.ttft is None or r.ttft > ttft_slo):
        return False
    if tpot_slo is not None and r.tpot is not None and r.tpot > tpot_slo:
        return False
    return r.deadline is None or r.e2e <= r.deadline


def table(summaries: list[dict], metrics=("ttft", "tpot", "e2e")) -> str:
    """A plain-text table: one row per run (means and p90s in ms, throughput, goodput, fairness)."""
    head = ["run"] + [f"{m} {k}" for m in metrics for k in ("mean", "p90")] + \
        ["tok/s", "goodput/s", "jain", "preempt"]
    rows = [head]
    for s in summaries:
        rows.append([str(s["label"])[:28]] + [f"{s[m][k] * 1e3:.1f}" for m in metrics for k in ("mean", "p90")]
                    + [f"{s['throughput_tok_s']:.0f}", f"{s['goodput_req_s']:.2f}",
                       "-" if np.isnan(s["jain_fairness"]) else f"{s['jain_fairness']:.3f}",
                       str(s["preemptions"])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)

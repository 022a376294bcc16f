"""Prometheus metrics of a server, fed by the engine's step observers (queues, KV cache,
preemptions, tokens) and by each request's final output (latencies, finish reasons).

Each `ServerMetrics` owns its registry (no global state: two apps in one process, as tests
build them, do not collide). Names follow vLLM's, with the `toolkit_` prefix, and each is
rendered a second time under vLLM's own `vllm:` prefix, so existing vLLM dashboards work.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from toolkit.engine.observe import StepRecord
from toolkit.types import RequestOutput

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        self.model_name = model_name
        self.running = Gauge("toolkit_num_requests_running", "Sequences running on the engine",
                             labels, registry=r)
        self.waiting = Gauge("toolkit_num_requests_waiting", "Sequences waiting to be admitted",
                             labels, registry=r)
        self.kv_usage = Gauge("toolkit_kv_cache_usage_perc", "Fraction of KV blocks in use (0-1)",
                              labels, registry=r)
        self.preemptions = Counter("toolkit_num_preemptions", "Preemptions (recompute)", labels,
                                   registry=r)
        self.prompt_tokens = Counter("toolkit_prompt_tokens", "Prompt tokens of finished requests",
                                     labels, registry=r)
        self.generation_tokens = Counter("toolkit_generation_tokens",
                                         "Output tokens of finished requests", labels, registry=r)
        self.prefix_queries = Counter("toolkit_prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache", labels, registry=r)
        self.prefix_hits = Counter("toolkit_prefix_cache_hits",
                                   "Prompt tokens found in the prefix cache", labels, registry=r)
        self.requests = Counter("toolkit_request_success", "Finished requests by finish reason",
                                labels + ["finished_reason"], registry=r)
        self.ttft = Histogram("toolkit_time_to_first_token_seconds", "Time to first token",
                              labels, buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("toolkit_time_per_output_token_seconds",
                              "Mean time per output token after the first", labels,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("toolkit_e2e_request_latency_seconds", "Arrival to last token",
                             labels, buckets=_LATENCY_BUCKETS, registry=r)
        self.steps = Counter("toolkit_engine_steps", "Engine steps", labels, registry=r)

    def observe_step(self, rec: StepRecord) -> None:
        """A step observer (runs on the engine's loop thread; prometheus_client is thread-safe)."""
        m = self.model_name
        self.running.labels(m).set(rec.num_running)
        self.waiting.labels(m).set(rec.num_waiting)
        self.kv_usage.labels(m).set(rec.kv_usage)
        self.steps.labels(m).inc()
        if rec.num_preempted:
            self.preemptions.labels(m).inc(rec.num_preempted)

    def observe_finished(self, out: RequestOutput) -> None:
        """A request's final output: latencies, tokens, prefix-cache hits, finish reason."""
        m = self.model_name
        reason = out.finish_reason or (out.outputs[0].finish_reason if out.outputs else None)
        self.requests.labels(m, reason or "unknown").inc()
        n_prompt = len(out.prompt_token_ids)
        n_out = sum(len(c.token_ids) for c in out.outputs) if isinstance(out.outputs, list) else 0   # pooling: none
        self.prompt_tokens.labels(m).inc(n_prompt)
        self.generation_tokens.labels(m).inc(n_out)
        met = out.metrics
        if met is None:
            return
        if met.first_scheduled_time is not None:
            self.prefix_queries.labels(m).inc(n_prompt)
            self.prefix_hits.labels(m).inc(met.num_cached_tokens)
        if met.first_token_time is not None:
            self.ttft.labels(m).observe(met.first_token_time - met.arrival_time)
        if met.finished_time is not None:
            self.e2e.labels(m).observe(met.finished_time - met.arrival_time)
            tpot = getattr(out, "time_per_output_token", None)   # a pooling output has none
            if tpot is not None and n_out > 1:
                self.tpot.labels(m).observe(tpot)

    def render(self) -> bytes:
        text = generate_latest(self.registry).decode()
        # the same families under vLLM's names (vllm:num_requests_running, ...)
        vllm = "".join(line.replace("toolkit_", "vllm:", 1) + "\n" for line in text.splitlines())
        return (text + vllm).encode()

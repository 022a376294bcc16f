"""Per-replica Prometheus families of a data-parallel engine (`DPAsyncEngine.replica_stats`),
read when /metrics is scraped. The fleet's totals are the usual families (ServerMetrics,
fed with step records that carry the sums over replicas); these carry a `replica` label:

    toolkit_replica_alive{model_name="m",replica="0"} 1.0
    toolkit_replica_num_requests_running / _waiting, toolkit_replica_kv_cache_usage_perc
    toolkit_replica_requests_routed_total, _retried_total, _failed_total, toolkit_replica_deaths_total,
    toolkit_replica_restarts_total, toolkit_replica_engine_steps_total
"""

from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_GAUGES = {"alive": ("toolkit_replica_alive", "1 while the replica's engine runs"),
           "running": ("toolkit_replica_num_requests_running", "Requests streaming on the replica"),
           "waiting": ("toolkit_replica_num_requests_waiting", "Requests routed to the replica, nothing streamed yet"),
           "kv_usage": ("toolkit_replica_kv_cache_usage_perc", "Fraction of the replica's KV blocks in use (0-1)")}
_COUNTERS = {"routed": ("toolkit_replica_requests_routed", "Requests the router sent to the replica"),
             "retried": ("toolkit_replica_requests_retried", "Requests sent to the replica after theirs died"),
             "failed": ("toolkit_replica_requests_failed", "Streaming requests ended by the replica's death"),
             "deaths": ("toolkit_replica_deaths", "Times the replica's engine was found dead"),
             "steps": ("toolkit_replica_engine_steps", "Engine steps of the replica"),
             "restarts": ("toolkit_replica_restarts", "Times the replica's engine was started again after dying")}


class _Collector:
    def __init__(self, stats: Callable[[], list[dict[str, Any]]], model_name: str) -> None:
        self.stats, self.model_name = stats, model_name

    def collect(self):
        rows = self.stats()
        for key, (name, doc) in _GAUGES.items():
            g = GaugeMetricFamily(name, doc, labels=["model_name", "replica"])
            for r in rows:
                g.add_metric([self.model_name, str(r["replica"])], float(r[key]))
            yield g
        for key, (name, doc) in _COUNTERS.items():
            c = CounterMetricFamily(name, doc, labels=["model_name", "replica"])
            for r in rows:
                c.add_metric([self.model_name, str(r["replica"])], float(r[key]))
            yield c


def replica_metrics(stats: Callable[[], list[dict[str, Any]]], model_name: str) -> Callable[[], bytes]:
    """A function rendering the per-replica families (Prometheus text) from `stats()`."""
    registry = CollectorRegistry()
    registry.register(_Collector(stats, model_name))
    return lambda: generate_latest(registry)

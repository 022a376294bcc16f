"""Routers for data-parallel replicas: which replica serves a request.

    from toolkit.routing import PrefixAffinityRouter, ReplicaView
    router = PrefixAffinityRouter(block_size=16)
    i = router.choose(request, [ReplicaView(0, num_running=3), ReplicaView(1, num_waiting=1)])

The contract is in base.py; by name through the registry: `create_part("router", "least_loaded")`.
The simulator runs them over N simulated replicas (`toolkit.simulator.ReplicaSimulator`);
the server puts them in front of N engines (`toolkit.entrypoints.replicas`).
"""

from toolkit.routing.base import NoReplicaAlive, ReplicaView, Router, RouteRequest, alive_indices
from toolkit.routing.prefix import CacheAwareRouter, PrefixAffinityRouter, load_bound, prompt_hashes
from toolkit.routing.simple import LeastLoadedRouter, PowerOfTwoRouter, RoundRobinRouter

__all__ = ["Router", "ReplicaView", "RouteRequest", "NoReplicaAlive", "alive_indices", "RoundRobinRouter",
           "LeastLoadedRouter", "PowerOfTwoRouter", "PrefixAffinityRouter", "CacheAwareRouter",
           "load_bound", "prompt_hashes"]

"""DPAsyncEngine: N engine replicas behind the AsyncEngine interface (vLLM's
--data-parallel-size), each request routed to one replica by a Router.

    engine = DPAsyncEngine(model, data_parallel_size=2, backend="mp", router="prefix_affinity")
    async for out in engine.generate(ids, SamplingParams(max_tokens=32)):
        ...
    engine.replica_views()          # what the router sees: running, waiting, KV usage, alive

Backends: "mp" (each replica an engine process on this host, `ProcessCore`; with GPUs,
replica r sees GPUs r*tp .. r*tp+tp-1 through CUDA_VISIBLE_DEVICES, wrapping round when
there are fewer, so several replicas can share one GPU), "ray" (each replica a Ray actor
on whatever node the cluster places it, restarted when lost; `pip install toolkit[ray]`),
"thread" (each replica a thread of this process: notebooks and tests, no isolation).
A dead mp or thread replica is started again by the replica set (`max_restarts`, with a
back-off); a Ray one by Ray.
The server's front (`build_app`) takes it like any AsyncEngine; see replica_set.py for the
routing and fault handling and docs/guides/replicas.md.
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any, Callable, Sequence

from toolkit.entrypoints import engine_calls
from toolkit.entrypoints.async_engine import AsyncEngine
from toolkit.entrypoints.replica_set import CoreFactory, ReplicaSetCore
from toolkit.routing.base import ReplicaView

BACKENDS = ("mp", "ray", "thread")


class DPAsyncEngine(AsyncEngine):
    """`model` and `llm_options`: what `LLM(...)` takes, the same for every replica.
    `router`: a registered name ("round_robin", "least_loaded", "power_of_two",
    "prefix_affinity", "cache_aware"), a class or an instance. `devices`: the GPU ids to
    deal out (default: CUDA_VISIBLE_DEVICES, else every GPU torch sees, else none: CPU).
    `ray_options`: for backend="ray" (address, num_gpus per replica...). `max_restarts`:
    how many times each replica is started again after it dies (0: never; with Ray, the
    actor's max_restarts unless ray_options gives one), the mp and thread ones after
    `restart_backoff` s, doubling per attempt (replica_set.py)."""

    def __init__(self, model: Any = None, *, data_parallel_size: int = 2, backend: str = "mp",
                 router: Any = "least_loaded", max_pending: int | None = None,
                 devices: Sequence[str] | None = None, ray_options: dict[str, Any] | None = None,
                 max_restarts: int = 3, restart_backoff: float = 1.0, **llm_options: Any) -> None:
        if not isinstance(data_parallel_size, int) or isinstance(data_parallel_size, bool) or data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be a positive integer, got {data_parallel_size!r}")
        if backend not in BACKENDS:
            raise ValueError(f"data_parallel_backend must be one of {BACKENDS}, got {backend!r}")
        from toolkit.registry import create_part

        block_size = int(llm_options.get("block_size") or 16)
        router_obj = create_part("router", router, block_size=block_size)
        self._front(max_pending)
        self.backend, self.data_parallel_size = backend, data_parallel_size
        ray_options = dict(ray_options or {})
        if backend == "ray":
            ray_options.setdefault("max_restarts", max_restarts)   # Ray restarts its actors itself
        factories = _factories(model, llm_options, data_parallel_size, backend, devices, ray_options)
        self.core = ReplicaSetCore(factories, router_obj, self._on_outputs, self._on_error, block_size=block_size,
                                   max_restarts=0 if backend == "ray" else max_restarts,
                                   restart_backoff=restart_backoff)
        self.engine = None

    @property
    def router(self) -> Any:
        return self.core.router

    @property
    def is_ready(self) -> bool:
        """Every replica is alive (what /health reports); `is_running`: at least one is."""
        return self.core.all_alive

    def replica_views(self) -> list[ReplicaView]:
        return self.core.views()

    def replica_of(self, request_id: str) -> int | None:
        """The replica an unfinished request runs on (None: unknown or finished)."""
        return self.core.replica_of(request_id)

    def replica_stats(self) -> list[dict[str, Any]]:
        """Per replica: alive, running, waiting, KV usage, requests routed and retried there,
        requests failed by its death, deaths, steps, restarts (the /metrics per-replica families)."""
        views = self.core.views()
        s = self.core.stats
        rows = [dict(replica=v.index, alive=v.alive, running=v.num_running, waiting=v.num_waiting,
                     kv_usage=v.kv_usage, **{k: s[k][v.index] for k in s}) for v in views]
        for row, core in zip(rows, self.core.cores):
            row["restarts"] += getattr(core, "restarts", 0)      # a Ray actor's own restarts
        return rows

    # -- sleep mode, weight updates, the prefix cache: every replica, one answer --
    async def sleep(self, level: int = 1) -> None:
        self._every_replica("sleep()")
        await super().sleep(level)

    async def wake_up(self, tags: Sequence[str] | str | None = None) -> None:
        self._every_replica("wake_up()")
        await super().wake_up(tags)

    async def is_sleeping(self) -> bool:
        """True when every live replica sleeps."""
        return all(await self._engine_call(engine_calls.is_sleeping))

    async def update_weights(self, weights: Any) -> int:
        self._every_replica("update_weights()")
        return (await super().update_weights(weights))[0]

    async def reset_prefix_cache(self) -> bool:
        """True when every live replica reset its cache (a busy one refuses); the router's
        memory of their prefixes goes with them."""
        done = all(await self._engine_call(engine_calls.reset_prefix_cache))
        if done:
            self.core.forget_prefixes()
        return done

    def call_one(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        """fn(engine) on one live replica (`call`: on every one, a list)."""
        return self.core.call_one(fn)

    def _every_replica(self, what: str) -> None:
        """A restarting replica comes back from the original checkpoint, awake: changing the
        others alone would leave the replicas serving different weights."""
        down = [v.index for v in self.core.views() if not v.alive]
        if down:
            raise RuntimeError(f"{what} needs every replica alive; replica(s) {down} are down or "
                               "restarting: try again when /health answers 200")

    def __repr__(self) -> str:
        alive = sum(v.alive for v in self.core.views())
        return (f"DPAsyncEngine({self.data_parallel_size} replicas ({alive} alive), backend={self.backend!r}, "
                f"router={self.router!r})")


def replica_devices(n: int, tensor_parallel_size: int = 1, devices: Sequence[str] | None = None
                    ) -> list[str | None]:
    """Each replica's CUDA_VISIBLE_DEVICES (None: leave it alone; no GPU known)."""
    if devices is None:
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        if env is not None:
            devices = [d for d in env.split(",") if d.strip()]
        else:
            import torch

            devices = [str(k) for k in range(torch.cuda.device_count())]   # NVML: no CUDA init here
    devices = list(devices)
    if not devices:
        return [None] * n
    tp = max(int(tensor_parallel_size or 1), 1)
    return [",".join(devices[(r * tp + k) % len(devices)] for k in range(tp)) for r in range(n)]


def _factories(model: Any, opts: dict[str, Any], n: int, backend: str, devices: Sequence[str] | None,
               ray_options: dict[str, Any]) -> list[CoreFactory]:
    if backend == "thread":
        def thread_core(on_outputs, on_error):
            from toolkit.entrypoints.core_thread import ThreadCore
            from toolkit.entrypoints.llm import LLM

            return ThreadCore(LLM(model, **opts), on_outputs, on_error)

        return [thread_core] * n
    if backend == "ray":
        from toolkit.entrypoints.core_ray import ray_factories

        return ray_factories(model, opts, n, **ray_options)
    from toolkit.entrypoints.core_process import ProcessCore

    gpus = replica_devices(n, opts.get("tensor_parallel_size", 1), devices)

    def process_core(r: int) -> CoreFactory:
        env = {"CUDA_VISIBLE_DEVICES": gpus[r]} if gpus[r] is not None else None
        return lambda on_outputs, on_error: ProcessCore((model,), opts, on_outputs, on_error, env=env,
                                                        name=f"toolkit-replica-{r}")

    return [process_core(r) for r in range(n)]

"""/sleep, /wake_up, /is_sleeping, /reset_prefix_cache: vLLM's development routes, added only
when the server runs with --enable-sleep-mode (without it they are 404, as in vLLM without
VLLM_SERVER_DEV_MODE). A refusal (requests in flight, a bad level or tag) is 400 with the
engine's message; weights are not updated over HTTP (a trainer calls update_weights on an
AsyncEngine or LLM in its own process)."""

from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse, Response


def add_sleep_routes(app: FastAPI, engine: Any, dependencies: list,
                     error: Callable[..., JSONResponse]) -> None:
    async def run(call: Any) -> Response | None:
        try:
            await call
        except (ValueError, TypeError, RuntimeError) as e:
            return error(400, str(e))
        return None

    @app.post("/sleep", dependencies=dependencies)
    async def sleep(level: int = 1) -> Response:
        """Free the weights' and the KV cache's device memory (level 1 or 2); needs an idle engine."""
        return await run(engine.sleep(level)) or Response(status_code=200)

    @app.post("/wake_up", dependencies=dependencies)
    async def wake_up(tags: list[str] | None = Query(default=None)) -> Response:
        """?tags=weights&tags=kv_cache (none: both)."""
        return await run(engine.wake_up(tags)) or Response(status_code=200)

    @app.get("/is_sleeping", dependencies=dependencies)
    async def is_sleeping() -> dict:
        return {"is_sleeping": await engine.is_sleeping()}

    @app.post("/reset_prefix_cache", dependencies=dependencies)
    async def reset_prefix_cache() -> Response:
        if not await engine.reset_prefix_cache():
            return error(400, "the prefix cache cannot be reset while requests are in flight")
        return Response(status_code=200)

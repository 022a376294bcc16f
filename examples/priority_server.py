"""A custom OpenAI-compatible server from the toolkit's parts: each API key has a tier, and
the tier is the request's priority under the scheduler's priority policy (with aging, so
the free tier is never starved). The stock server has one key and no priorities.

    python examples/priority_server.py --keys gold=0,free=5 --port 8000
    curl -H "Authorization: Bearer gold" localhost:8000/v1/completions -d '{"prompt": "Hi"}' ...
"""

from __future__ import annotations

import argparse
import contextlib

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from toolkit import LLM
from toolkit.entrypoints.async_engine import AsyncEngine
from toolkit.schedulers.policies import Priority
from toolkit.serving import protocol as P
from toolkit.serving.handlers import OpenAIHandlers


def build_priority_app(engine: AsyncEngine, tiers: dict[str, int], model_name: str = "toolkit") -> FastAPI:
    """tiers: API key -> priority (lower is served first)."""
    handlers = OpenAIHandlers(engine, model_name)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await engine.shutdown(timeout=2.0)        # finish or abort what runs, free the engine

    app = FastAPI(title="priority-tier server", lifespan=lifespan)

    def tier(request: Request) -> int:
        key = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if key not in tiers:
            raise P.ProtocolError("unknown API key", status=401, type="authentication_error")
        return tiers[key]

    @app.exception_handler(P.ProtocolError)
    async def _error(request: Request, exc: P.ProtocolError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    async def run(prep, chat: bool, stream: bool):
        if stream:
            return StreamingResponse(handlers.stream(prep, chat, include_usage=True),
                                     media_type="text/event-stream")
        return await handlers.complete(prep, chat)

    @app.post("/v1/completions")
    async def completions(body: P.CompletionRequest, priority: int = Depends(tier)):
        return await run(handlers.prepare_completion(body, priority), False, body.stream)

    @app.post("/v1/chat/completions")
    async def chat(body: P.ChatCompletionRequest, priority: int = Depends(tier)):
        return await run(handlers.prepare_chat(body, priority), True, body.stream)

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=None, help="HF folder (default: the embedded SmolLM2)")
    ap.add_argument("--keys", default="gold=0,free=5", help="KEY=PRIORITY,... (lower first)")
    ap.add_argument("--aging", type=float, default=0.5, help="priority levels gained per second waited")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args()
    tiers = {k: int(v) for k, v in (item.split("=") for item in args.keys.split(","))}
    engine = AsyncEngine(LLM(args.model, policy=Priority(aging=args.aging)))
    uvicorn.run(build_priority_app(engine, tiers), host=args.host, port=args.port)


if __name__ == "__main__":
    main()

"""A FastAPI app of the OpenAI API over an AsyncEngine.

    engine = AsyncEngine(LLM(...))
    app = build_app(engine, model_name="smollm2", api_key="sk-...")
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: /v1/completions and /v1/chat/completions (streaming as server-sent events or
not), /v1/models, /health, /metrics (Prometheus). Every error is OpenAI's error body with
a 4xx / 5xx status; past `max_pending` unfinished requests a new one gets 503 with a
Retry-After header; a client that disconnects has its request aborted (its KV blocks
freed). On shutdown the app stops taking requests, lets running ones finish for
`shutdown_timeout` seconds, aborts the rest and closes the engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hmac
import logging
from typing import Any, Awaitable, Callable, Mapping, Sequence

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from toolkit.entrypoints.async_engine import AsyncEngine
from toolkit.serving import protocol as P
from toolkit.serving.errors import REFUSALS, refusal
from toolkit.serving.errors import error_response as error
from toolkit.serving.guard import DEFAULT_MAX_BODY_BYTES, RequestGuard
from toolkit.serving.handlers import OpenAIHandlers
from toolkit.serving.metrics import ServerMetrics
from toolkit.serving.tools.request import ToolConfig
from toolkit.serving.text_check import refuse_lone_surrogates

log = logging.getLogger(__name__)


def build_app(engine: AsyncEngine, *, model_name: str = "toolkit", api_key: str | None = None,
              max_pending: int | None = None, retry_after_s: int = 1,
              shutdown_timeout: float = 5.0, close_engine: bool = True,
              priority_hook: Callable[[Request, Any], int | None] | None = None,
              max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
              allowed_hosts: Sequence[str] | None = None, protect_metrics: bool = False,
              on_engine_dead: Callable[[], None] | None = None,
              tools: ToolConfig | None = None, sampling_defaults: Mapping[str, Any] | None = None,
              log_requests: bool = False, enable_sleep_mode: bool = False,
              lora_modules: Mapping[str, str] | None = None,
              allow_runtime_lora_updating: bool = False) -> FastAPI:
    """The app. `priority_hook(http_request, body) -> int | None` gives each request its
    priority (lower first, for the priority policy) in place of the body's `priority`.
    Before any body is read (guard.py): the Host header against `allowed_hosts` (None: any),
    the API key (every path but /health, and /metrics unless `protect_metrics`), the body
    size (413 past `max_body_bytes`; None: no limit). `on_engine_dead()` is called once if
    the engine stops while the server is not shutting down (`python -m toolkit.serve` then
    exits non-zero, so a supervisor restarts it, instead of answering 503 forever).
    `tools`: the tool-call parser, auto tool choice and reasoning parser (vLLM's flags).
    `sampling_defaults` (--generation-config) fill the sampling fields a request leaves unset;
    `log_requests` (--enable-log-requests) logs each request at INFO.
    `enable_sleep_mode`: the development routes /sleep, /wake_up, /is_sleeping and
    /reset_prefix_cache (sleep_routes.py); 404 without it.
    `lora_modules` {name: PEFT folder}: adapters served by name (the engine needs
    enable_lora); `allow_runtime_lora_updating` adds /v1/load_lora_adapter and
    /v1/unload_lora_adapter (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING)."""
    handlers = OpenAIHandlers(engine, model_name, tools=tools, sampling_defaults=sampling_defaults,
                              log_requests=log_requests)
    if lora_modules or allow_runtime_lora_updating:
        from toolkit.serving.lora import LoRAModules

        handlers.loras = LoRAModules(model_name, lora_modules)
    metrics = ServerMetrics(model_name)
    state = {"draining": False}
    # tokenizing and rendering a request (the chat template) run here, off the event loop:
    # a long prompt never holds the other clients' streams
    prepare_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="toolkit-prepare")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.add_step_observer(metrics.observe_step)
        engine.finished_listeners.append(metrics.observe_finished)
        watch = asyncio.ensure_future(_watch_engine(engine, state, on_engine_dead)) if on_engine_dead else None
        yield
        state["draining"] = True
        if watch is not None:
            watch.cancel()
        prepare_pool.shutdown(wait=False, cancel_futures=True)
        if close_engine:
            await engine.shutdown(timeout=shutdown_timeout)

    app = FastAPI(title="toolkit OpenAI-compatible server", lifespan=lifespan)
    app.add_middleware(RequestGuard, api_key=api_key, max_body_bytes=max_body_bytes,
                       allowed_hosts=allowed_hosts, protect_metrics=protect_metrics)
    app.state.engine, app.state.metrics, app.state.handlers = engine, metrics, handlers

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        kind = first.get("type", "")
        if kind == "json_invalid":
            return error(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', '')}".strip())
        if kind == "extra_forbidden":
            return error(400, f"Unrecognized request argument supplied: {'.'.join(loc)}",
                         param=".".join(loc) or None)
        return error(400, f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid')}",
                     param=".".join(loc) or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own refusals (a body that is not UTF-8 or nests too deep, unknown routes,
        # wrong methods) in OpenAI's error body, not {"detail": ...}
        message = str(exc.detail)
        if exc.status_code == 400 and "parsing the body" in message:
            message = ("the body could not be parsed: it must be a JSON object in UTF-8 "
                       "(and nest less deeply)")
        return error(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        # a bug or a failed engine step: still OpenAI's error body, and the server goes on
        return error(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")

    @app.exception_handler(P.ProtocolError)
    async def _protocol(request: Request, exc: P.ProtocolError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    def authorize(request: Request) -> None:
        """With an api_key: every /v1 route needs `Authorization: Bearer <key>`."""
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise P.ProtocolError("Incorrect API key provided", status=401,
                                  type="authentication_error", code="invalid_api_key")

    v1 = [Depends(authorize)]

    def admit() -> JSONResponse | None:
        """503 while draining or past max_pending (Retry-After says when to come back)."""
        if state["draining"] or not engine.accepting:
            return error(503, "the server is shutting down", type="server_error")
        if max_pending is not None and engine.num_unfinished >= max_pending:
            return error(503, f"the server is busy ({engine.num_unfinished} requests pending); retry "
                         f"in {retry_after_s} s", type="server_error", code="overloaded",
                         headers={"Retry-After": str(retry_after_s)})
        return None

    async def run(request: Request, body: Any, prepare: Callable, chat: bool):
        busy = admit()
        if busy is not None:
            return busy
        priority = priority_hook(request, body) if priority_hook is not None else None
        prep = await asyncio.get_running_loop().run_in_executor(prepare_pool, _checked, prepare, body, priority)
        try:
            if body.stream:
                include = bool(body.stream_options and body.stream_options.include_usage)
                gen = handlers.stream(prep, chat, include)
                first = await gen.__anext__()          # adding may fail: a status, not a stream
                return StreamingResponse(_prepend(first, gen), media_type="text/event-stream")
            return await _until_disconnect(request, handlers.complete(prep, chat))
        except REFUSALS as e:                      # overloaded, dead, asleep, or a bad request
            return refusal(e, retry_after_s)

    @app.post("/v1/completions", dependencies=v1)
    async def completions(request: Request, body: P.CompletionRequest):
        return await run(request, body, handlers.prepare_completion, chat=False)

    @app.post("/v1/chat/completions", dependencies=v1)
    async def chat_completions(request: Request, body: P.ChatCompletionRequest):
        return await run(request, body, handlers.prepare_chat, chat=True)

    from toolkit.serving.pooling import add_pooling_routes

    add_pooling_routes(app, engine, model_name, v1, retry_after_s)     # /v1/embeddings, /v1/score, /v1/rerank

    @app.get("/v1/models", dependencies=v1)
    async def models() -> P.ModelList:
        cards = [P.ModelCard(id=model_name, created=P.now(), max_model_len=handlers.max_model_len,
                             tasks=await app.state.pooling_tasks())]
        for name, lora in handlers.loras.items() if handlers.loras is not None else ():
            cards.append(P.ModelCard(id=name, created=P.now(), max_model_len=handlers.max_model_len,
                                     root=lora.lora_path, parent=model_name))
        return P.ModelList(data=cards)

    if allow_runtime_lora_updating:
        @app.post("/v1/load_lora_adapter", dependencies=v1)
        async def load_lora_adapter(body: P.LoadLoRAAdapterRequest) -> Response:
            try:                       # reads the adapter's weights: off the event loop
                await asyncio.get_running_loop().run_in_executor(
                    None, handlers.loras.load, body.lora_name, body.lora_path)
            except ValueError as e:
                return error(400, str(e))
            return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.", media_type="text/plain")

        @app.post("/v1/unload_lora_adapter", dependencies=v1)
        async def unload_lora_adapter(body: P.UnloadLoRAAdapterRequest) -> Response:
            try:
                handlers.loras.unload(body.lora_name)
            except KeyError as e:
                return error(404, e.args[0], type="not_found_error")
            return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.",
                            media_type="text/plain")

    # data-parallel engines (entrypoints/data_parallel.py): ready when every replica is, and
    # per-replica families beside the fleet's totals
    per_replica = None
    if callable(getattr(engine, "replica_stats", None)):
        from toolkit.serving.replica_metrics import replica_metrics

        per_replica = replica_metrics(engine.replica_stats, model_name)

    @app.get("/health")
    async def health() -> Response:
        ok = getattr(engine, "is_ready", engine.is_running) and not state["draining"]
        return Response(status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        text = metrics.render() + (per_replica() if per_replica is not None else b"")
        return Response(text, media_type="text/plain; version=0.0.4")

    if enable_sleep_mode:
        from toolkit.serving.sleep_routes import add_sleep_routes

        add_sleep_routes(app, engine, v1, error)

    return app


async def _watch_engine(engine: AsyncEngine, state: dict, on_dead: Callable[[], None]) -> None:
    while engine.is_running or state["draining"]:
        if state["draining"]:
            return
        await asyncio.sleep(0.25)
    log.error("the engine stopped (%r) while serving; the server stops", engine.error)
    state["engine_dead"] = True
    on_dead()


def _checked(prepare: Callable, body: Any, priority: int | None) -> Any:
    """prepare(body, priority) once every string of the body is valid Unicode."""
    refuse_lone_surrogates(body)
    return prepare(body, priority)


async def _prepend(first: str, rest) -> Any:
    try:
        yield first
        async for chunk in rest:
            yield chunk
    finally:
        await rest.aclose()          # a client gone mid-stream: its requests abort now, not at GC


async def _until_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Await `work` unless the client goes away first; then cancel it (its requests abort)."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watch = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait([task, watch], return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return Response(status_code=499)                 # nobody reads it; nginx's "client closed"

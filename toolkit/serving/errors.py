"""The server's error responses: OpenAI's error object with a status, and how a request the
engine refused is answered (the completion, chat and pooling routes alike)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from toolkit.engine.sleep import EngineSleepingError
from toolkit.entrypoints.async_engine import EngineDeadError, Overloaded
from toolkit.serving.protocol import error_body

# what adding a request may raise that is the request's or the engine's state, not a bug
REFUSALS = (Overloaded, EngineDeadError, EngineSleepingError, ValueError, TypeError)


def error_response(status: int, message: str, *, type: str | None = None, param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    """type None: "server_error" for a 5xx status, else "invalid_request_error"."""
    type = type or ("server_error" if status >= 500 else "invalid_request_error")
    return JSONResponse(error_body(message, type=type, param=param, code=code), status_code=status,
                        headers=headers)


def refusal(e: BaseException, retry_after_s: int) -> JSONResponse:
    """One of REFUSALS as its answer: 503 with Retry-After while overloaded or without a live
    engine, 503 engine_sleeping while asleep (until /wake_up), else 400."""
    if isinstance(e, (Overloaded, EngineDeadError)):
        return error_response(503, str(e), headers={"Retry-After": str(retry_after_s)})
    if isinstance(e, EngineSleepingError):
        return error_response(503, str(e), code="engine_sleeping")
    return error_response(400, str(e))

"""The proxy in front of a prefill server and a decode server (vLLM's disaggregated proxy).

    python -m toolkit.serve MODEL --port 8100 --kv-role producer --kv-cache-dir /dev/shm/pd
    python -m toolkit.serve MODEL --port 8200 --kv-role consumer --kv-cache-dir /dev/shm/pd
    python -m toolkit.kv_transfer.http_proxy --prefill http://127.0.0.1:8100 \\
        --decode http://127.0.0.1:8200 --port 8000

For each POST to /v1/completions or /v1/chat/completions the proxy gives the request an id
(its own `request_id` if it has one), sends it to the prefill server with max_tokens=1 (not
streamed), then sends the original request with the same id to the decode server and
returns that answer as it comes (streamed when asked). The producer saved the prompt's KV
under the id and the prompt's tokens; the consumer loads all of it but the last prompt
token, computes that one and decodes (the first token is sampled again there: the same
token for greedy sampling). A consumer that finds no handoff (a failed prefill, a race)
computes the prompt itself: slower, never wrong. Other paths go to the decode server.
"""


import argparse
import contextlib
import uuid
from typing import Any

GENERATE = ("/v1/completions", "/v1/chat/completions")


def build_proxy_app(prefill_url: str, decode_url: str, *, timeout_s: float = 600.0) -> Any:
    import httpx
    from fastapi import FastAPI, Request
    from fastapi.responses import Response, StreamingResponse

    client = httpx.AsyncClient(timeout=timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await client.aclose()

    app = FastAPI(title="toolkit prefill/decode proxy", lifespan=lifespan)
    app.state.counts = {"prefill": 0, "decode": 0}

    def headers(request: Request) -> dict:
        h = {"content-type": "application/json"}
        if "authorization" in request.headers:
            h["authorization"] = request.headers["authorization"]
        return h

    async def relay(request: Request, path: str) -> Response:
        body = await request.json()
        if not isinstance(body, dict):
            return Response('{"error": {"message": "the body must be a JSON object"}}', 400,
                            media_type="application/json")
        body["request_id"] = str(body.get("request_id") or f"pd-{uuid.uuid4().hex}")
        first = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        first["max_tokens"] = 1
        if "max_completion_tokens" in first:
            first["max_completion_tokens"] = 1
        r = await client.post(prefill_url + path, json=first, headers=headers(request))
        app.state.counts["prefill"] += 1
        if r.status_code != 200:                   # the prefill's error is the answer
            return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))
        app.state.counts["decode"] += 1
        if body.get("stream"):
            req = client.build_request("POST", decode_url + path, json=body, headers=headers(request))
            resp = await client.send(req, stream=True)

            async def chunks():
                try:
                    async for c in resp.aiter_raw():
                        yield c
                finally:
                    await resp.aclose()

            return StreamingResponse(chunks(), resp.status_code, media_type=resp.headers.get("content-type"))
        r = await client.post(decode_url + path, json=body, headers=headers(request))
        return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await relay(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await relay(request, "/v1/chat/completions")

    @app.get("/{path:path}")
    async def passthrough(path: str, request: Request) -> Response:
        r = await client.get(f"{decode_url}/{path}", headers=headers(request))
        return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))

    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="prefill/decode proxy: prefill server, then decode server")
    p.add_argument("--prefill", required=True, help="URL of the producer server (--kv-role producer)")
    p.add_argument("--decode", required=True, help="URL of the consumer server (--kv-role consumer)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    args = p.parse_args(argv)
    import uvicorn

    uvicorn.run(build_proxy_app(args.prefill.rstrip("/"), args.decode.rstrip("/")), host=args.host, port=args.port)


if __name__ == "__main__":
    main()

"""Pooling routes of the server: OpenAI's /v1/embeddings (encoding_format "float" | "base64",
`dimensions`), vLLM's /v1/score and /v1/rerank. A task the model does not serve is a 400
naming the tasks it does (GET /v1/models lists them per model).

    add_pooling_routes(app, engine, model_name, dependencies)   (build_app calls it)
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from toolkit.pooling.params import PoolingParams
from toolkit.serving import protocol as P
from toolkit.serving.errors import REFUSALS, error_response, refusal


class EmbeddingRequest(BaseModel):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    normalize: bool | None = None          # vLLM's extra
    truncate_prompt_tokens: int | None = None   # vLLM's extra: keep the last k tokens (-1: max_model_len)


class ScoreRequest(BaseModel):
    model: str | None = None
    truncate_prompt_tokens: int | None = None
    text_1: str | list[str] | None = None  # vLLM's names (queries / documents also taken)
    text_2: str | list[str] | None = None
    queries: str | list[str] | None = None
    documents: str | list[str] | None = None


class RerankRequest(BaseModel):
    model: str | None = None
    query: str
    documents: list[str]
    top_n: int | None = Field(default=None, ge=1)
    truncate_prompt_tokens: int | None = None


def engine_tasks(engine: Any) -> list[str]:
    """What the engine serves: "generate" (an LM head) and its pooling tasks."""
    tasks = ["generate"] if getattr(engine.model.spec, "supports_generation", True) else []
    return tasks + (list(engine.pooling.tasks) if engine.pooling is not None else [])


def _encode(v: list[float], fmt: str) -> list[float] | str:
    if fmt == "float":
        return v
    return base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode()   # the openai client's decoding


def add_pooling_routes(app: FastAPI, engine: Any, model_name: str, dependencies: list,
                       retry_after_s: int = 1) -> None:
    cache: dict[str, list[str]] = {}

    async def tasks() -> list[str]:
        if "t" not in cache:
            cache["t"] = await asyncio.wrap_future(engine.call_one(engine_tasks))   # alike on every replica
        return cache["t"]

    def error(message: str, status: int = 400, code: str | None = None, param: str | None = None) -> JSONResponse:
        return error_response(status, message, code=code, param=param)

    async def pool(prompts: list[Any], params: PoolingParams) -> list[Any]:
        outs = await asyncio.gather(*[_final(engine, p, params) for p in prompts])
        return list(outs)

    async def check(task: str, model: str | None) -> JSONResponse | None:
        if model is not None and model != model_name:      # as /v1/completions answers
            return error(f"The model `{model}` does not exist for {task}; this server serves "
                         f"`{model_name}`", 404, code="model_not_found", param="model")
        have = await tasks()
        if task not in have:
            return error(f"model {model_name!r} does not serve task {task!r}; it serves {have}")
        return None

    @app.post("/v1/embeddings", dependencies=dependencies)
    async def embeddings(body: EmbeddingRequest):
        if (refused := await check("embed", body.model)) is not None:
            return refused
        inp = body.input
        prompts = [inp] if isinstance(inp, str) or (inp and isinstance(inp[0], int)) else list(inp)
        if not prompts:
            return error("input must not be empty")
        try:
            outs = await pool(prompts, PoolingParams(task="embed", dimensions=body.dimensions,
                                                     normalize=body.normalize,
                                                     truncate_prompt_tokens=body.truncate_prompt_tokens))
        except REFUSALS as e:                      # as the completion routes answer them
            return refusal(e, retry_after_s)
        n = sum(len(o.prompt_token_ids) for o in outs)
        return {"object": "list", "model": model_name,
                "data": [{"object": "embedding", "index": i,
                          "embedding": _encode(o.outputs.data.tolist(), body.encoding_format)}
                         for i, o in enumerate(outs)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    async def scores(queries: Any, documents: Any, truncate: int | None = None) -> tuple[list[float], int]:
        from toolkit.entrypoints.pooling import _pairs

        pairs = _pairs(queries, documents)
        have = await tasks()
        if "score" in have:                  # a cross-encoder / reranker: the pair in one prompt
            tok = await asyncio.wrap_future(engine.call_one(_pair_ids(pairs)))
            outs = await pool(tok, PoolingParams(task="score", truncate_prompt_tokens=truncate))
            return [float(o.outputs.data[-1]) for o in outs], sum(len(o.prompt_token_ids) for o in outs)
        flat = [x for p in pairs for x in p]
        outs = await pool(flat, PoolingParams(task="embed", truncate_prompt_tokens=truncate))
        import torch

        got = [float(torch.nn.functional.cosine_similarity(outs[2 * i].outputs.data,
                                                           outs[2 * i + 1].outputs.data, dim=0))
               for i in range(len(pairs))]
        return got, sum(len(o.prompt_token_ids) for o in outs)

    @app.post("/v1/score", dependencies=dependencies)
    @app.post("/score", dependencies=dependencies)
    async def score(body: ScoreRequest):
        if (body.text_1 is not None and body.queries is not None) or (body.text_2 is not None and body.documents is not None):
            return error("give text_1 and text_2, or queries and documents, not both names for one side")
        q = body.text_1 if body.text_1 is not None else body.queries
        d = body.text_2 if body.text_2 is not None else body.documents
        if q is None or d is None:
            return error("give text_1 and text_2 (or queries and documents)")
        if (refused := await check("embed" if "score" not in await tasks() else "score", body.model)) is not None:
            return refused
        try:
            got, n = await scores(q, d, body.truncate_prompt_tokens)
        except REFUSALS as e:                      # as the completion routes answer them
            return refusal(e, retry_after_s)
        return {"id": P.new_id("score"), "object": "list", "created": int(time.time()), "model": model_name,
                "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(got)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    @app.post("/v1/rerank", dependencies=dependencies)
    @app.post("/rerank", dependencies=dependencies)
    async def rerank(body: RerankRequest):
        if not body.documents:
            return error("documents must not be empty")
        if (refused := await check("embed" if "score" not in await tasks() else "score", body.model)) is not None:
            return refused
        try:
            got, n = await scores(body.query, body.documents, body.truncate_prompt_tokens)
        except REFUSALS as e:                      # as the completion routes answer them
            return refusal(e, retry_after_s)
        order = sorted(range(len(got)), key=lambda i: -got[i])[: body.top_n or len(got)]
        return {"id": P.new_id("rerank"), "model": model_name, "usage": {"total_tokens": n},
                "results": [{"index": i, "document": {"text": body.documents[i]}, "relevance_score": got[i]}
                            for i in order]}

    app.state.pooling_tasks = tasks


class _pair_ids:
    """engine -> each pair's prompt ids (the tokenizer's text pair); picklable for a process core."""

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.pairs = pairs

    def __call__(self, engine: Any) -> list[list[int]]:
        from toolkit.entrypoints.pooling import _pair_prompt

        return [_pair_prompt(engine, q, d) for q, d in self.pairs]


async def _final(engine: Any, prompt: Any, params: PoolingParams) -> Any:
    out = None
    async for out in engine.generate(prompt, params, output_kind="final"):
        pass
    if out is None or not hasattr(out.outputs, "data"):
        raise ValueError(f"the request was not pooled (finish_reason "
                         f"{getattr(out, 'finish_reason', None)!r}): its prompt cannot fit this engine")
    return out

"""LLM.embed / classify / score / encode: pooling requests through the engine (vLLM's API).

Each runs its prompts to completion as prefill-only requests (they share steps and the
token budget with any generation in flight) and returns vLLM's output types in prompt order.
score(query, documents): with a classifier head (a reranker, e.g. the Qwen3-Reranker recipe),
each pair is one prompt (the tokenizer's text pair, or the ids back to back) and its score the
head's last-class probability; without one, the cosine similarity of the two embeddings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from toolkit.pooling.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    ScoringRequestOutput,
)
from toolkit.pooling.params import PoolingParams


def run_pooling(engine: Any, prompts: list[Any], params: list[PoolingParams]) -> list[PoolingRequestOutput]:
    """All or nothing, as LLM.generate: anything raising aborts every request queued here."""
    order: dict[str, int] = {}
    done: dict[str, Any] = {}
    try:
        for i, (p, pp) in enumerate(zip(prompts, params)):
            order[engine.add_request(p, pp, output_kind="final")] = i
        while engine.has_unfinished() and len(done) < len(order):
            for o in engine.step():
                if o.finished and o.request_id in order:
                    done[o.request_id] = o
    except BaseException:
        engine.abort([rid for rid in order if rid not in done])
        raise
    bad = [o for o in done.values() if not isinstance(o, PoolingRequestOutput)]
    if bad:
        raise ValueError(f"request {bad[0].request_id!r} was not pooled (finish_reason "
                         f"{bad[0].finish_reason!r}): its prompt cannot fit this engine")
    return [done[rid] for rid in sorted(order, key=order.get)]


def params_list(pp: PoolingParams | Sequence[PoolingParams] | None, n: int, task: str,
                truncate_prompt_tokens: int | None = None) -> list[PoolingParams]:
    """One PoolingParams per prompt, each with `task` (a different task given is an error);
    truncate_prompt_tokens, when given, replaces each one's (vLLM's LLM.embed argument)."""
    if pp is None or isinstance(pp, PoolingParams):
        pp = [pp or PoolingParams()] * n
    if not isinstance(pp, Sequence) or len(pp) != n:
        raise ValueError(f"pooling_params must be a PoolingParams or one per prompt ({n})")
    out = []
    for p in pp:
        if not isinstance(p, PoolingParams):
            raise TypeError(f"pooling_params must hold PoolingParams, got {type(p).__name__}")
        if p.task not in (None, task):
            raise ValueError(f"pooling_params.task={p.task!r} given to {task}(); leave it None")
        k = p.truncate_prompt_tokens if truncate_prompt_tokens is None else truncate_prompt_tokens
        out.append(PoolingParams(task=task, normalize=p.normalize, dimensions=p.dimensions,
                                 use_activation=p.use_activation, truncate_prompt_tokens=k))
    return out


def embed(engine: Any, prompts: list[Any], pp: Any, truncate: int | None = None) -> list[EmbeddingRequestOutput]:
    return [EmbeddingRequestOutput.from_base(o)
            for o in run_pooling(engine, prompts, params_list(pp, len(prompts), "embed", truncate))]


def classify(engine: Any, prompts: list[Any], pp: Any, truncate: int | None = None
             ) -> list[ClassificationRequestOutput]:
    return [ClassificationRequestOutput.from_base(o)
            for o in run_pooling(engine, prompts, params_list(pp, len(prompts), "classify", truncate))]


def _pairs(a: Any, b: Any) -> list[tuple[Any, Any]]:
    """vLLM's score pairing: one query with N documents (1:N) or N with N (zip)."""
    one = lambda x: isinstance(x, str) or (isinstance(x, Sequence) and len(x) and isinstance(x[0], int))
    a, b = ([a] if one(a) else list(a)), ([b] if one(b) else list(b))
    if not a or not b:
        raise ValueError("score() needs at least one query and one document")
    if len(a) == 1:
        return [(a[0], d) for d in b]
    if len(a) != len(b):
        raise ValueError(f"score() pairs 1 query with N documents or N with N; got {len(a)} and {len(b)}")
    return list(zip(a, b))


def _pair_prompt(engine: Any, q: Any, d: Any) -> Any:
    """One prompt of a (query, document) pair: the tokenizer's text pair, or ids back to back."""
    if isinstance(q, str) and isinstance(d, str):
        if engine.tokenizer is None:
            raise ValueError("this engine has no tokenizer; give token ids")
        return list(engine.tokenizer(q, d)["input_ids"])
    if isinstance(q, str) or isinstance(d, str):
        raise TypeError("score() takes text with text or token ids with token ids, not both")
    return list(q) + list(d)


def score(engine: Any, data_1: Any, data_2: Any, pp: Any = None, truncate: int | None = None
          ) -> list[ScoringRequestOutput]:
    pairs = _pairs(data_1, data_2)
    if "score" in engine.pooling.tasks:                 # a cross-encoder / reranker head
        prompts = [_pair_prompt(engine, q, d) for q, d in pairs]
        return [ScoringRequestOutput.from_base(o)
                for o in run_pooling(engine, prompts, params_list(pp, len(prompts), "score", truncate))]
    flat = [x for pair in pairs for x in pair]          # a bi-encoder: cosine of the embeddings
    embs = run_pooling(engine, flat, params_list(pp, len(flat), "embed", truncate))
    out = []
    for i in range(len(pairs)):
        a, b = embs[2 * i], embs[2 * i + 1]
        cos = torch.nn.functional.cosine_similarity(a.outputs.data, b.outputs.data, dim=0)
        ids = a.prompt_token_ids + b.prompt_token_ids
        out.append(ScoringRequestOutput.from_base(PoolingRequestOutput(
            f"{a.request_id}_{b.request_id}", PoolingOutput(cos.reshape(1)), ids, task="score")))
    return out

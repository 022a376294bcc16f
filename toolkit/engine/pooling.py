"""The engine's side of pooling requests: validation, the prefill-only Request, and the
PoolingRequestOutput each finished one becomes (the worker's result in StepResult.pooled)."""

from __future__ import annotations

from typing import Any

from toolkit.pooling.outputs import PoolingOutput, PoolingRequestOutput
from toolkit.pooling.params import PoolingParams
from toolkit.pooling.pooler import Pooler, task_of
from toolkit.types import Request, RequestOutput, SamplingParams


class EnginePooling:
    """causal: the model's attention (False: bidirectional, so a prompt runs in one step and
    never shares the prefix cache)."""

    def __init__(self, pooler: Pooler, causal: bool = True, hidden_size: int | None = None) -> None:
        self.pooler, self.causal, self.hidden_size = pooler, causal, hidden_size
        self.live: dict[str, str] = {}              # request id -> task

    @property
    def tasks(self) -> tuple[str, ...]:
        return self.pooler.tasks

    def check(self, params: PoolingParams) -> None:
        task = task_of(params)
        if task not in self.tasks:
            raise ValueError(f"this model serves pooling tasks {list(self.tasks)}; task {task!r} needs "
                             + ("a classifier head (PoolerConfig(classifier_from_token=[...]) or a model "
                                "with one)" if task != "embed" else "a pooler"))
        d = params.dimensions
        if d is not None and self.hidden_size is not None and d > self.hidden_size:
            raise ValueError(f"dimensions={d} is more than this model's embedding size "
                             f"{self.hidden_size}; give at most {self.hidden_size}")

    @staticmethod
    def truncate(ids: list[int], params: PoolingParams, max_model_len: int, keep_first: int = 0) -> list[int]:
        """The prompt's last truncate_prompt_tokens ids (-1: max_model_len; vLLM's left
        truncation); all of them when it is None. keep_first: leading ids that stay (the
        special tokens a tokenizer put before the text, [CLS] or BOS, as vLLM's left-truncating
        tokenizer keeps them: a CLS pooler reads that row)."""
        k = params.truncate_prompt_tokens
        if k is None:
            return ids
        if k > max_model_len:
            raise ValueError(f"truncate_prompt_tokens={k} is more than max_model_len={max_model_len}; "
                             f"give at most {max_model_len}, or -1 for max_model_len")
        k = max_model_len if k == -1 else k
        if len(ids) <= k:
            return ids
        keep = min(keep_first, k - 1)
        return ids[:keep] + ids[len(ids) - (k - keep):]

    def request(self, rid: str, ids: list[int], params: PoolingParams, salt: int, **fields: Any) -> Request:
        """The prefill-only Request. Only a causal LAST pooler may start from a prefix-cache hit
        (the last token is always computed); others get a private salt: every row computed."""
        shared = self.causal and self.pooler.config.pooling_type == "LAST"
        return Request(rid, ids, SamplingParams(max_tokens=1), pooling_params=params,
                       prefill_whole=not self.causal, cache_salt=0 if shared else salt, **fields)

    def convert(self, outputs: list[RequestOutput], pooled: dict[str, Any]) -> list[Any]:
        """Finished pooling requests' outputs as PoolingRequestOutput (a rejected one stays a
        RequestOutput with finish_reason "rejected")."""
        if not self.live:
            return outputs
        out = []
        for o in outputs:
            task = self.live.get(o.request_id)
            if task is None or not o.finished:
                out.append(o)
                continue
            del self.live[o.request_id]
            data = pooled.get(o.request_id)
            out.append(o if data is None else PoolingRequestOutput(
                o.request_id, PoolingOutput(data), o.prompt_token_ids, True, o.prompt, task,
                o.finish_reason, o.metrics))
        return out

    def forget(self, ids: list[str]) -> None:
        for rid in ids:
            self.live.pop(rid, None)

    def __repr__(self) -> str:
        return f"EnginePooling({self.pooler!r}, causal={self.causal})"

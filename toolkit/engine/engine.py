"""Engine: the step loop. It is the only place where the parts meet.

    out = scheduler.schedule()                  # who runs how many tokens
    logits = runner.forward(runner.prepare(out)) # one ragged forward over the paged cache
    tokens = runner.sample(...)                 # logits -> token ids
    outputs = scheduler.update(out, tokens)     # append, token-level stops, free blocks
    outputs = output_processor.process(outputs) # text, stop strings, metrics
"""

from __future__ import annotations

import itertools
import logging
from typing import Iterable, Sequence

import torch

from toolkit.engine.output import OutputProcessor
from toolkit.engine.runner import Runner
from toolkit.types import Request, RequestOutput, SamplingParams

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, model, tokenizer, scheduler, runner: Runner, *, block_size: int,
                 num_blocks: int, max_model_len: int, eos_token_id: int | None) -> None:
        self.model, self.tokenizer, self.scheduler, self.runner = model, tokenizer, scheduler, runner
        self.block_size, self.num_blocks = block_size, num_blocks
        self.max_model_len = max_model_len
        self.eos_token_id = eos_token_id
        self.output_processor = OutputProcessor(tokenizer)
        self._ids = itertools.count()
        self.num_steps = 0
        self.num_preemptions = 0

    # -- requests --
    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, priority: int = 0,
                    arrival_time: float | None = None) -> str:
        """Validate and queue one request; raises ValueError (nothing queued) on bad input."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        text, ids = self._tokenize(prompt)
        if len(ids) == 0:
            raise ValueError("the prompt is empty; give at least one token")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens; with max_model_len={self.max_model_len} "
                             f"at most {self.max_model_len - 1} leave room for one output token")
        vocab = self.model.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab}), got [{min(ids)}, {max(ids)}]")
        if -(-(len(ids) + 1) // self.block_size) > self.num_blocks:
            raise ValueError(f"the prompt needs {-(-(len(ids) + 1) // self.block_size)} KV blocks; the cache "
                             f"has {self.num_blocks} of {self.block_size} tokens")
        rid = request_id if request_id is not None else str(next(self._ids))
        req = Request(rid, ids, params, eos_token_id=self.eos_token_id, priority=priority,
                      max_model_len=self.max_model_len,
                      **({"arrival_time": arrival_time} if arrival_time is not None else {}))
        self.scheduler.add_request(req)
        self.output_processor.add(req, text)
        return rid

    def abort(self, request_ids: str | Iterable[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        self.scheduler.abort(ids)
        for rid in ids:
            self.output_processor.forget(rid)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step --
    def step(self) -> list[RequestOutput]:
        out = self.scheduler.schedule()
        sampled: dict[str, list[int]] = {}
        if out.scheduled:
            batch = self.runner.prepare(out)
            logits = self.runner.forward(batch)
            tokens = self.runner.sample(batch, logits).token_ids.tolist()   # the step's one sync
            for rid, tok in zip(batch.row_owner, tokens):
                sampled.setdefault(rid, []).append(tok)
        self.num_steps += 1
        self.num_preemptions += len(out.preempted_ids)
        outputs, stopped = self.output_processor.process(self.scheduler.update(out, sampled))
        if stopped:
            self.scheduler.abort(stopped)   # a stop string finished these: free their blocks now
        return outputs

    def _tokenize(self, prompt: str | Sequence[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer; pass token ids instead of text")
            return prompt, list(self.tokenizer.encode(prompt))
        return None, [int(t) for t in prompt]

    def close(self) -> None:
        cache = getattr(self.runner, "kv_cache", None)
        if cache is not None:
            cache.close()
        self.runner = None  # type: ignore[assignment]
        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        log.info("engine closed after %d steps", self.num_steps)


"""LLM: the notebook-facing front door. Assemble an engine from named parts, generate, chat."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from toolkit.config import EngineConfig
from toolkit.engine.build import build_engine
from toolkit.engine.progress import progress_bar
from toolkit.types import CompletionOutput, RequestOutput, SamplingParams

Prompt = str | Sequence[int]


class LLM:
    """An inference engine assembled from parts.

    >>> llm = LLM()                                   # the embedded SmolLM2-135M-Instruct
    >>> llm = LLM("path/to/hf-folder", scheduler="static", attention="torch", block_size=32)
    >>> out = llm.generate(["Hello"], SamplingParams(max_tokens=20))

    Each part (allocator, scheduler, sampler, attention) is a registered name, a class or
    an instance; the remaining keyword arguments are EngineConfig fields.
    """

    def __init__(self, model: Any = None, *, tokenizer: Any = None, allocator: Any = None,
                 scheduler: Any = "continuous", sampler: Any = "default", attention: Any = "auto",
                 proposer: Any = None, draft_model: Any = None, load_format: str = "auto",
                 **config: Any) -> None:
        fields = {f.name for f in dataclasses.fields(EngineConfig)}
        unknown = sorted(set(config) - fields)
        if unknown:
            raise ValueError(f"unknown LLM option(s) {unknown}; valid options: {sorted(fields)}")
        self.config = EngineConfig(**config)
        self.engine = build_engine(model, tokenizer=tokenizer, allocator=allocator,
                                   scheduler=scheduler, sampler=sampler, attention=attention,
                                   proposer=proposer, draft_model=draft_model, config=self.config,
                                   load_format=load_format)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 priorities: Sequence[int] | None = None, use_tqdm: bool = True) -> list[RequestOutput]:
        """Run prompts (text or token ids) to completion; outputs in the order of the prompts."""
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompts))
        if priorities is not None and len(priorities) != len(prompts):
            raise ValueError(f"got {len(priorities)} priorities for {len(prompts)} prompts")
        engine = self.engine
        # validate everything before queueing anything
        children: dict[str, tuple[int, int]] = {}   # request id -> (prompt index, sample index)
        queued: list[str] = []
        try:
            for i, (p, sp) in enumerate(zip(prompts, params)):
                first = None
                for j in range(sp.n):
                    # sample j > 0 waits for sample 0's prompt, then shares its blocks
                    rid = engine.add_request(p, _child_params(sp, j), after=first,
                                             priority=priorities[i] if priorities else 0)
                    first = first or rid
                    children[rid] = (i, j)
                    queued.append(rid)
        except ValueError:
            engine.abort(queued)   # all or nothing: the batch is rejected, nothing leaks
            raise
        done: dict[str, RequestOutput] = {}
        with progress_bar(total=len(children), enabled=use_tqdm, desc="generate") as bar:
            while engine.has_unfinished():
                for o in engine.step():
                    if o.finished:
                        done[o.request_id] = o
                        bar.update(1)
        return _merge(prompts, params, children, done)

    def beam_search(self, prompts: Prompt | Sequence[Prompt], beam_width: int, max_tokens: int, *,
                    length_penalty: float = 1.0, ignore_eos: bool = False):
        """Beam search (Hugging Face's rules) on the engine's parts; beams share prefix blocks
        through the allocator. Returns per prompt the beam_width best sequences, best first."""
        from toolkit.engine.beam import beam_search

        ids = [self.engine.tokenize(p)[1] for p in _as_prompt_list(prompts)]
        return beam_search(self.engine, ids, beam_width, max_tokens,
                           length_penalty=length_penalty, ignore_eos=ignore_eos)

    def chat(self, messages: list[dict[str, str]] | list[list[dict[str, str]]],
             sampling_params: SamplingParams | None = None, **kwargs: Any) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, through the chat template."""
        from toolkit.models.chat import apply_chat_template

        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer; this LLM has none")
        ids = [self.tokenizer.encode(apply_chat_template(self.tokenizer, c), add_special_tokens=False)
               for c in convs]
        return self.generate(ids, sampling_params, **kwargs)

    def close(self) -> None:
        """Free the KV cache and the weights (GPU memory goes back to the allocator)."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None  # type: ignore[assignment]

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        e = self.engine
        if e is None:
            return "LLM(closed)"
        r = e.runner
        return (f"LLM(model={type(e.model).__name__}, scheduler={type(e.scheduler).__name__}, "
                f"allocator={type(e.scheduler.allocator).__name__ if hasattr(e.scheduler, 'allocator') else '?'}, "
                f"attention={type(r.attention).__name__}, sampler={type(r.sampler).__name__}, "
                f"kv={r.kv_cache.num_blocks}x{r.kv_cache.block_size} tokens)")


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and isinstance(prompts[0], int):
        return [prompts]  # one prompt of token ids
    if not prompts:
        raise ValueError("no prompts given")
    return prompts


def _as_params_list(sp: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[SamplingParams]:
    if sp is None:
        return [SamplingParams()] * n
    if isinstance(sp, SamplingParams):
        return [sp] * n
    sp = list(sp)
    if len(sp) != n:
        raise ValueError(f"got {len(sp)} SamplingParams for {n} prompts; give one or one per prompt")
    return sp


def _child_params(sp: SamplingParams, j: int) -> SamplingParams:
    """Sample j of n: its own seed (derived from the request's), otherwise the same params."""
    if sp.n == 1:
        return sp
    seed = None if sp.seed is None else (sp.seed * 1_000_003 + j) % 2**63
    return dataclasses.replace(sp, n=1, seed=seed)


def _merge(prompts, params, children, done) -> list[RequestOutput]:
    merged: list[RequestOutput | None] = [None] * len(prompts)
    for rid, (i, j) in sorted(children.items(), key=lambda kv: kv[1]):
        o = done[rid]
        c = o.outputs[0]
        comp = CompletionOutput(j, c.text, c.token_ids, c.finish_reason, c.stop_reason,
                                c.logprobs, c.cumulative_logprob)
        if merged[i] is None:
            merged[i] = RequestOutput(request_id=str(i), finished=True, finish_reason=o.finish_reason,
                                      stop_reason=o.stop_reason, prompt=o.prompt,
                                      prompt_token_ids=o.prompt_token_ids, outputs=[comp],
                                      metrics=o.metrics, prompt_logprobs=o.prompt_logprobs)
        else:
            merged[i].outputs.append(comp)
    return merged  # type: ignore[return-value]

"""LLM: the notebook-facing front door. Assemble an engine from named parts, generate, chat."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from toolkit.config import EngineConfig
from toolkit.engine.build import build_engine
from toolkit.engine.progress import TokenProgress
from toolkit.engine.request_fields import per_prompt_fields
from toolkit.types import RequestOutput, SamplingParams

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
                 priority: int | Sequence[int] | None = None, client_id: Any = None, deadline: Any = None,
                 expected_output_len: Any = None,
                 priorities: Sequence[int] | None = None, use_tqdm: bool = True) -> list[RequestOutput]:
        """Run prompts (text, or token ids as a list, numpy array or tensor) to completion;
        outputs in the order of the prompts, each with its n completions.

        All or nothing: if anything raises (a bad prompt, an error inside a step, Ctrl-C),
        every request this call queued is aborted before the exception leaves, so no block
        stays held and the next call starts clean. The progress bar counts tokens (prompt
        tokens computed and output tokens), so a long prefill shows progress too."""
        engine = self._engine()
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompts))
        # scheduling fields (one value or one per prompt), stored on each request for the policy
        fields = per_prompt_fields(len(prompts), priority=priority, priorities=priorities,
                                   client_id=client_id, deadline=deadline,
                                   expected_output_len=expected_output_len)
        order: dict[str, int] = {}
        done: dict[str, RequestOutput] = {}
        try:
            for i, (p, sp) in enumerate(zip(prompts, params)):
                rid = engine.add_request(p, sp, **fields[i])
                order[rid] = i
            with TokenProgress(engine, order, params, enabled=use_tqdm) as bar:
                while engine.has_unfinished():
                    for o in engine.step():
                        if o.finished and o.request_id in order:
                            done[o.request_id] = o
                            bar.finished(o)
        except BaseException:
            engine.abort([rid for rid in order if rid not in done])   # all or nothing
            raise
        missing = [rid for rid in order if rid not in done]
        if missing:
            raise RuntimeError(f"requests {missing} ended without an output; was the engine used "
                               "from elsewhere during generate?")
        return [done[rid] for rid in sorted(order, key=order.get)]

    def beam_search(self, prompts: Prompt | Sequence[Prompt], beam_width: int, max_tokens: int, *,
                    length_penalty: float = 1.0, ignore_eos: bool = False):
        """Beam search (Hugging Face's rules) on the engine's parts; beams share prefix blocks
        through the allocator. Returns per prompt the beam_width best sequences, best first."""
        from toolkit.engine.beam import beam_search

        engine = self._engine()
        ids = [engine.tokenize(p)[1] for p in _as_prompt_list(prompts)]
        return beam_search(engine, ids, beam_width, max_tokens,
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

    def _engine(self):
        if self.engine is None:
            raise RuntimeError("this LLM is closed (close() freed its KV cache and weights); "
                               "build a new LLM to go on")
        return self.engine

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
    """One prompt (text, or token ids as a list / tuple / 1-d array) or a list of them."""
    if prompts is None:
        raise TypeError("prompts must be text, token ids, or a list of them; got None")
    if isinstance(prompts, str):
        return [prompts]
    if hasattr(prompts, "ndim") and hasattr(prompts, "tolist"):     # numpy array / torch tensor
        if prompts.ndim == 1:
            return [prompts]
        return list(prompts)                    # 2-d: one prompt per row
    if not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be text, token ids, or a list of them; got {type(prompts).__name__}")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts given")
    if not isinstance(prompts[0], (str, Sequence)) and getattr(prompts[0], "ndim", 0) < 1:
        return [prompts]  # one prompt of token ids (its elements are checked by add_request)
    return prompts


def _as_params_list(sp: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[SamplingParams]:
    if sp is None:
        return [SamplingParams()] * n
    if isinstance(sp, SamplingParams):
        return [sp] * n
    if isinstance(sp, dict):
        raise TypeError("sampling_params must be a SamplingParams (or a list of them), got a dict; "
                        "build one with SamplingParams(**d)")
    if not isinstance(sp, Sequence):
        raise TypeError(f"sampling_params must be a SamplingParams or a list of them, got {type(sp).__name__}")
    sp = list(sp)
    if len(sp) != n:
        raise ValueError(f"got {len(sp)} SamplingParams for {n} prompts; give one or one per prompt")
    bad = [type(x).__name__ for x in sp if not isinstance(x, SamplingParams)]
    if bad:
        raise TypeError(f"sampling_params must hold SamplingParams, got {bad[0]}")
    return sp

"""LLM: the notebook-facing front door. Assemble an engine from named parts, generate, chat."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
from typing import Any, Mapping, Sequence

from toolkit.config import EngineConfig
from toolkit.engine.build import build_engine
from toolkit.engine.gc_freeze import frozen_heap
from toolkit.progress import TokenProgress
from toolkit.entrypoints.request_fields import per_prompt_fields
from toolkit.types import BeamSearchParams, RequestOutput, SamplingParams

Prompt = str | Sequence[int] | Mapping[str, Any]    # text, token ids, or vLLM's {"prompt": ...}


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
        config = _vllm_options(config)
        fields = {f.name for f in dataclasses.fields(EngineConfig)}
        unknown = sorted(set(config) - fields)
        if unknown:
            hints = {u: difflib.get_close_matches(u, fields, n=1) for u in unknown}
            said = "; ".join(f"{u!r}: did you mean {h[0]!r}?" for u, h in hints.items() if h)
            raise ValueError(f"unknown LLM option(s) {unknown}{' (' + said + ')' if said else ''}; "
                             f"valid options: {sorted(fields)}")
        self.config = EngineConfig(**config)
        from toolkit.log_setup import configure_logging

        configure_logging()               # start-up lines visible in a plain script (vLLM's habit)
        self.engine = build_engine(model, tokenizer=tokenizer, allocator=allocator,
                                   scheduler=scheduler, sampler=sampler, attention=attention,
                                   proposer=proposer, draft_model=draft_model, config=self.config,
                                   load_format=load_format)
        from toolkit.models.generation_defaults import generation_defaults

        folder = model if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__") else None
        if model is None:
            from toolkit.models import default_model_path

            folder = default_model_path()
        self._sampling_defaults = generation_defaults(self.config.generation_config, folder)

    def get_default_sampling_params(self) -> SamplingParams:
        """The SamplingParams of a generate / chat given none (vLLM's name): SamplingParams'
        own defaults, with the model's generation_config.json sampling fields over them
        (EngineConfig.generation_config: "auto"; "vllm" ignores the file)."""
        return SamplingParams(**self._sampling_defaults)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def get_tokenizer(self):
        """vLLM's spelling of `llm.tokenizer`."""
        return self.engine.tokenizer

    @property
    def llm_engine(self):
        """vLLM's spelling of `llm.engine` (the Engine: add_request, step, abort)."""
        return self.engine

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 priority: int | Sequence[int] | None = None, client_id: Any = None, deadline: Any = None,
                 expected_output_len: Any = None, lora_request: Any = None,
                 priorities: Sequence[int] | None = None, use_tqdm: bool = True,
                 live: bool = False) -> list[RequestOutput]:
        """Run prompts (text, or token ids as a list, numpy array or tensor) to completion;
        outputs in the order of the prompts, each with its n completions.

        All or nothing: if anything raises (a bad prompt, an error inside a step, Ctrl-C),
        every request this call queued is aborted before the exception leaves, so no block
        stays held and the next call starts clean. The progress bar counts tokens (prompt
        tokens computed and output tokens), so a long prefill shows progress too.
        live=True: in Jupyter, a LiveView (KV block map, queues, tokens per step) updates
        while the engine runs, and the recording is plotted at the end.
        lora_request: a LoRARequest for every prompt, or a list of one (or None) per prompt
        (the LLM needs enable_lora=True)."""
        engine = self._engine()
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params if sampling_params is not None
                                 else self.get_default_sampling_params(), len(prompts))
        # scheduling fields (one value or one per prompt), stored on each request for the policy
        fields = per_prompt_fields(len(prompts), priority=priority, priorities=priorities,
                                   client_id=client_id, deadline=deadline,
                                   expected_output_len=expected_output_len, lora_request=lora_request)
        order: dict[str, int] = {}
        done: dict[str, RequestOutput] = {}
        try:
            for i, (p, sp) in enumerate(zip(prompts, params)):
                rid = engine.add_request(p, sp, output_kind="final", **fields[i])
                order[rid] = i
            with _live_view(self, live), TokenProgress(engine, order, params, enabled=use_tqdm) as bar, \
                    frozen_heap():            # no full GC passes over the model's objects mid-loop
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

    def beam_search(self, prompts: Prompt | Sequence[Prompt], params: BeamSearchParams | int | None = None,
                    max_tokens: int | None = None, *, beam_width: int | None = None,
                    length_penalty: float = 1.0, ignore_eos: bool = False, use_tqdm: bool = True):
        """Beam search (Hugging Face's rules) on the engine's parts; beams share prefix blocks
        through the allocator. Returns per prompt the beam width's best sequences, best first.

        vLLM's form `beam_search(prompts, BeamSearchParams(beam_width=4, max_tokens=16))`, or
        `beam_search(prompts, beam_width=4, max_tokens=16, length_penalty=, ignore_eos=)`.
        use_tqdm: a progress bar of the beam steps (one token of every beam each)."""
        from toolkit.entrypoints.beam import beam_search

        if params is None or beam_width is not None:
            if params is not None:
                raise TypeError("give the beam width once: as params or as beam_width=")
            params = beam_width
        if not isinstance(params, BeamSearchParams):
            if params is None or max_tokens is None:
                raise TypeError("beam_search takes a BeamSearchParams, or beam_width and max_tokens")
            params = BeamSearchParams(beam_width=params, max_tokens=max_tokens,
                                      length_penalty=length_penalty, ignore_eos=ignore_eos)
        elif max_tokens is not None:
            raise TypeError("max_tokens is given by the BeamSearchParams; pass it there")
        engine = self._engine()
        ids = [engine.tokenize(p)[1] for p in _as_prompt_list(prompts)]
        return beam_search(engine, ids, params.beam_width, params.max_tokens,
                           length_penalty=params.length_penalty, ignore_eos=params.ignore_eos,
                           use_tqdm=use_tqdm)

    def chat(self, messages: list[dict[str, str]] | list[list[dict[str, str]]],
             sampling_params: SamplingParams | None = None, **kwargs: Any) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, through the chat template."""
        from toolkit.models.chat import apply_chat_template

        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer; this LLM has none")
        texts = [apply_chat_template(self.tokenizer, c) for c in convs]
        ids = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        outs = self.generate(ids, sampling_params, **kwargs)
        for o, text in zip(outs, texts):
            o.prompt = text                         # the rendered conversation, as vLLM fills it
        return outs

    # -- sleep mode and weight updates (vLLM's names; toolkit/engine/sleep.py) --
    def sleep(self, level: int = 1) -> None:
        """Free the GPU memory of the KV cache and the weights until wake_up(): level 1 keeps
        the weights in (pinned) host memory, level 2 discards them (give them again with
        update_weights before generating). Needs enable_sleep_mode=True and no request in flight."""
        self._engine().sleep(level)

    def wake_up(self, tags: Sequence[str] | str | None = None) -> None:
        """Bring back what sleep() freed: tags "weights" and / or "kv_cache" (None: both), e.g.
        the weights first, update_weights, then the KV cache."""
        self._engine().wake_up(tags)

    def is_sleeping(self) -> bool:
        return self._engine().is_sleeping()

    def update_weights(self, weights: Any) -> int:
        """Load new weights in place: (checkpoint name, tensor) pairs, or a dict, as a trainer
        has them (full tensors; each tensor-parallel rank takes its slice). All or nothing: an
        unknown name or a wrong shape raises ValueError and changes no weight. The prefix cache
        is reset. Returns how many tensors were loaded."""
        return self._engine().update_weights(weights)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block; False while requests are in flight."""
        return self._engine().reset_prefix_cache()
    def embed(self, prompts: Prompt | Sequence[Prompt], pooling_params: Any = None, *,
              truncate_prompt_tokens: int | None = None) -> list:
        """Embeddings of the prompts (vLLM's EmbeddingRequestOutput: `.outputs.embedding`);
        pooling_params: a toolkit.pooling.PoolingParams (normalize, dimensions) or one per prompt.
        truncate_prompt_tokens: keep each prompt's last k tokens (-1: max_model_len)."""
        from toolkit.entrypoints import pooling

        return pooling.embed(self._pooling_engine(), [_prompt_of(p) for p in _as_prompt_list(prompts)],
                             pooling_params, truncate_prompt_tokens)

    def classify(self, prompts: Prompt | Sequence[Prompt], pooling_params: Any = None, *,
                 truncate_prompt_tokens: int | None = None) -> list:
        """Class probabilities (ClassificationRequestOutput: `.outputs.probs`) from the
        model's classifier head (PoolerConfig.classifier_from_token, or the model's own)."""
        from toolkit.entrypoints import pooling

        return pooling.classify(self._pooling_engine(), [_prompt_of(p) for p in _as_prompt_list(prompts)],
                                pooling_params, truncate_prompt_tokens)

    def score(self, data_1: Any, data_2: Any, pooling_params: Any = None, *,
              truncate_prompt_tokens: int | None = None) -> list:
        """Relevance of each (query, document) pair, 1:N or N:N (ScoringRequestOutput:
        `.outputs.score`): a reranker head's probability, or the embeddings' cosine."""
        from toolkit.entrypoints import pooling

        return pooling.score(self._pooling_engine(), data_1, data_2, pooling_params, truncate_prompt_tokens)

    def encode(self, prompts: Prompt | Sequence[Prompt], pooling_params: Any = None) -> list:
        """The raw pooling outputs (PoolingRequestOutput, `.outputs.data` a float32 tensor);
        each PoolingParams' task decides what data holds (None: "embed")."""
        from toolkit.entrypoints import pooling
        from toolkit.pooling.params import PoolingParams

        prompts = _as_prompt_list(prompts)
        pp = pooling_params if isinstance(pooling_params, Sequence) else [pooling_params or PoolingParams()] * len(prompts)
        return pooling.run_pooling(self._pooling_engine(), prompts, list(pp))

    def _pooling_engine(self):
        engine = self._engine()
        if engine.pooling is None:
            raise ValueError("this engine cannot pool: its executor does not return hidden states")
        return engine

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
        from toolkit.engine.describe import engine_repr

        return engine_repr(self.engine, "LLM")

    def _repr_html_(self) -> str:
        from toolkit.engine.describe import engine_html

        return engine_html(self.engine, "LLM")


def _live_view(llm: LLM, live: bool) -> Any:
    if not live:
        return contextlib.nullcontext()
    from toolkit.notebook.live import LiveView

    return LiveView(llm)


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """One prompt (text, or token ids as a list / tuple / 1-d array) or a list of them."""
    if prompts is None:
        raise TypeError("prompts must be text, token ids, or a list of them; got None")
    if isinstance(prompts, (str, Mapping)):
        return [_prompt_of(prompts)]
    if hasattr(prompts, "ndim") and hasattr(prompts, "tolist"):     # numpy array / torch tensor
        if prompts.ndim == 1:
            return [prompts]
        return list(prompts)                    # 2-d: one prompt per row
    if not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be text, token ids, or a list of them; got {type(prompts).__name__}")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts given")
    if not isinstance(prompts[0], (str, Sequence, Mapping)) and getattr(prompts[0], "ndim", 0) < 1:
        return [prompts]  # one prompt of token ids (its elements are checked by add_request)
    return [_prompt_of(p) for p in prompts]


def _prompt_of(p: Any) -> Any:
    """vLLM's TextPrompt {"prompt": str} / TokensPrompt {"prompt_token_ids": [...]} as text or
    ids; anything else unchanged."""
    if not isinstance(p, Mapping):
        return p
    keys = set(p)
    if keys == {"prompt"}:
        return p["prompt"]
    if keys == {"prompt_token_ids"} or keys == {"prompt", "prompt_token_ids"}:
        return p["prompt_token_ids"]
    raise ValueError(f"a prompt given as a dict takes 'prompt' (text) or 'prompt_token_ids'; got keys "
                     f"{sorted(keys)} (multi-modal data and the like are not supported)")


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


def _vllm_options(config: dict[str, Any]) -> dict[str, Any]:
    """vLLM's LLM(...) options in this engine's terms: enforce_eager -> cuda_graphs=False,
    swap_space (GiB of CPU swap) -> cpu_cache_gb (the host tier)."""
    config = dict(config)
    if "enforce_eager" in config:
        eager = config.pop("enforce_eager")
        if not isinstance(eager, bool):
            raise TypeError(f"enforce_eager must be True or False, got {eager!r}")
        if eager:
            config.setdefault("cuda_graphs", False)
    if "swap_space" in config:
        config.setdefault("cpu_cache_gb", config.pop("swap_space"))
    return config

"""`GrammarCompiler`: specs -> `CompiledGrammar`s, cached, compiled off the engine's step path.

    compiler = GrammarCompiler(tokenizer, vocab_size=model.spec.vocab_size)
    future = compiler.compile_async(params.structured)  # add_request: cheap checks raise here
    ...                                                 # the request waits while not future.done()
    grammar = future.result().new_grammar()             # ValueError here: reject the request

outlines-core releases the GIL while it builds an Index, so compiles run in parallel with
the engine's steps on a thread pool. The cache maps (vocabulary fingerprint, spec) to the
compile's Future, so concurrent requests with one schema share one compile; it may be
shared by several compilers (several tokenizers never collide: the fingerprint differs).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from toolkit.samplers.grammar.compiled import CompiledGrammar
from toolkit.samplers.grammar.limits import GrammarLimits
from toolkit.samplers.grammar.outlines_backend import OutlinesGrammar
from toolkit.samplers.grammar.spec import Structured
from toolkit.samplers.grammar.vocabulary import TokenizerVocabulary, VocabularyCache

CacheKey = tuple[str, Structured]
SMALL_KINDS = ("choice", "json_object")     # compiled on the small pool


class GrammarCache:
    """Thread-safe LRU of compile futures, at most `max_entries` (an Index of a big schema
    over a 150k vocabulary takes tens of MB, plus its mask cache)."""

    def __init__(self, max_entries: int = 32) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[CacheKey, Future[CompiledGrammar]] = OrderedDict()

    def get_or_submit(self, key: CacheKey,
                      submit: Callable[[], Future[CompiledGrammar]]) -> Future[CompiledGrammar]:
        with self._lock:
            fut = self._entries.get(key)
            if fut is not None and not fut.cancelled():
                self._entries.move_to_end(key)
                return fut
            fut = self._entries[key] = submit()
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return fut

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: CacheKey) -> bool:
        return key in self._entries


class GrammarCompiler:
    def __init__(self, tokenizer: Any = None, *, vocabulary: TokenizerVocabulary | None = None,
                 vocab_size: int | None = None, eos_token_ids: Sequence[int] | None = None,
                 max_workers: int = 2, cache: GrammarCache | None = None,
                 vocabulary_cache: VocabularyCache | None = None,
                 max_mask_cache_bytes: int = 32 << 20, limits: GrammarLimits | None = None) -> None:
        """tokenizer: a transformers tokenizer (or pass a prebuilt `vocabulary`);
        vocab_size: the model's logits width V (default len(tokenizer));
        eos_token_ids: the ids that end a sequence (default [tokenizer.eos_token_id]);
        limits: what a spec may ask to compile (GrammarLimits(); refused in validate)."""
        if vocabulary is None:
            if tokenizer is None:
                raise ValueError("GrammarCompiler needs a tokenizer or a prebuilt vocabulary")
            vcache = vocabulary_cache if vocabulary_cache is not None else VocabularyCache()
            vocabulary = vcache.get(tokenizer, vocab_size, eos_token_ids)
        self.vocab = vocabulary
        self.limits = limits if limits is not None else GrammarLimits()
        self.cache = cache if cache is not None else GrammarCache()
        self.max_mask_cache_bytes = max_mask_cache_bytes
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grammar-compile")
        # choices and json_object (fast, bounded DFAs) compile on a worker of their own: they
        # never queue behind a user's large schema or slow regex
        self._small_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile-small")

    def validate(self, spec: Any) -> Structured:
        """The spec as a `Structured` after the cheap checks; raises ValueError (add_request)."""
        s = Structured.coerce(spec)
        if s is None:
            raise ValueError("no grammar spec given (structured=None)")
        s.validate(self.limits)
        return s

    def compile_async(self, spec: Any) -> Future[CompiledGrammar]:
        """Start (or join, or reuse) the compile of `spec`. Cheap errors raise ValueError now;
        errors only the DFA build finds come out of `future.result()` as ValueError."""
        s = Structured.coerce(spec)
        key = (self.vocab.fingerprint, s)
        if s is None or key not in self.cache:    # a cached spec passed these checks already
            s = self.validate(spec)
        pool = self._small_pool if s.kind in SMALL_KINDS else self._pool
        return self.cache.get_or_submit(
            key,
            lambda: pool.submit(CompiledGrammar.compile, s, self.vocab, self.max_mask_cache_bytes))

    def compile(self, spec: Any, timeout: float | None = None) -> CompiledGrammar:
        """Blocking compile (notebooks, tests)."""
        return self.compile_async(spec).result(timeout)

    def new_grammar(self, spec: Any, max_rollback: int = 32) -> OutlinesGrammar:
        return self.compile(spec).new_grammar(max_rollback)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._small_pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> GrammarCompiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GrammarCompiler(V={self.vocab.vocab_size}, encoding={self.vocab.encoding}, "
                f"eos={list(self.vocab.eos_token_ids)}, {len(self.cache)} grammars cached)")

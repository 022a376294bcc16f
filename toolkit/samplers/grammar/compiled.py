"""`CompiledGrammar`: one spec's outlines-core Index for one vocabulary, plus its mask cache.

Shared by every request with the same (spec, tokenizer); immutable except the cache, which
maps a DFA state to its packed mask int32 [W] (W = ceil(V/32)). outlines-core writes a mask
by walking the state's allowed tokens, about 1 ms for a "free string" state of a 150k
vocabulary; the cache turns every later visit into a 4W-byte copy.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import outlines_core
import torch
from torch import Tensor

from toolkit.samplers.grammar.spec import Structured
from toolkit.samplers.grammar.vocabulary import TokenizerVocabulary

if TYPE_CHECKING:
    from toolkit.samplers.grammar.outlines_backend import OutlinesGrammar


class CompiledGrammar:
    def __init__(self, spec: Structured, regex: str, index: outlines_core.Index,
                 vocab: TokenizerVocabulary, compile_seconds: float,
                 max_cache_bytes: int = 32 << 20) -> None:
        self.spec = spec
        self.regex = regex
        self.index = index
        self.vocab = vocab
        self.compile_seconds = compile_seconds
        self.width = vocab.bitmask_width                                   # W words per row
        self.max_cached_states = max(max_cache_bytes // (4 * self.width), 1)
        self._masks: dict[int, Tensor] = {}                                # state -> int32 [W]
        self._words: dict[int, np.ndarray] = {}                  # state -> numpy view of its mask
        self._alive: dict[tuple[int, bool], bool] = {}    # (state, allow_eos) -> some bit set
        self._eos0 = vocab.eos_token_ids[0]
        self._extra_eos = np.asarray(vocab.eos_token_ids[1:], dtype=np.int64)

    @classmethod
    def compile(cls, spec: Structured, vocab: TokenizerVocabulary,
                max_cache_bytes: int = 32 << 20) -> CompiledGrammar:
        """Build the Index (seconds for a big schema; outlines-core releases the GIL meanwhile).

        Raises ValueError naming the spec when outlines-core cannot compile it."""
        t0 = time.perf_counter()
        regex = spec.to_regex()
        try:
            index = outlines_core.Index(regex, vocab.vocabulary)
        except (ValueError, RuntimeError) as e:
            raise ValueError(f"{spec.describe()} cannot be compiled for this tokenizer: {e}") from None
        return cls(spec, regex, index, vocab, time.perf_counter() - t0, max_cache_bytes)

    def new_grammar(self, max_rollback: int = 32) -> OutlinesGrammar:
        """A fresh per-request grammar at the start state. max_rollback bounds `rollback(n)`
        (use >= the number of speculative tokens + 1)."""
        from toolkit.samplers.grammar.outlines_backend import OutlinesGrammar

        return OutlinesGrammar(self, max_rollback)

    def state_mask(self, state: int, guide: outlines_core.Guide) -> Tensor:
        """int32 [W] mask of `state`; `guide` must stand at `state` (it writes a missing mask)."""
        mask = self._masks.get(state)
        if mask is not None:
            return mask
        mask = torch.empty(self.width, dtype=torch.int32)
        guide.write_mask_into(mask.data_ptr(), self.width, 4)
        words = mask.numpy().view(np.uint32)
        if self._extra_eos.size and (words[self._eos0 // 32] >> np.uint32(self._eos0 % 32)) & 1:
            # every EOS id of the model stops where outlines-core's one EOS may
            np.bitwise_or.at(words, self._extra_eos // 32,
                             np.left_shift(np.uint32(1), (self._extra_eos % 32).astype(np.uint32)))
        if len(self._masks) < self.max_cached_states:
            self._masks[state] = mask
        return mask

    def state_words(self, state: int, guide: outlines_core.Guide) -> np.ndarray:
        """`state_mask` as a numpy view (cached with it): row copies through numpy are cheapest."""
        words = self._words.get(state)
        if words is None:
            words = self.state_mask(state, guide).numpy()
            if state in self._masks:
                self._words[state] = words
        return words

    def state_alive(self, state: int, guide: outlines_core.Guide, allow_eos: bool = True) -> bool:
        """Some token is allowed at `state`; with allow_eos=False, some token other than EOS
        (the request cannot stop yet: min_tokens, ignore_eos). False = a dead end."""
        key = (state, allow_eos)
        alive = self._alive.get(key)
        if alive is None:
            mask = self.state_mask(state, guide)
            if not allow_eos:
                mask = mask.clone()
                words = mask.numpy().view(np.uint32)
                for e in self.vocab.eos_token_ids:
                    words[e // 32] &= ~np.uint32(1 << (e % 32))
            alive = self._alive[key] = bool(mask.any())
        return alive

    @property
    def num_cached_states(self) -> int:
        return len(self._masks)

    def __repr__(self) -> str:
        return (f"CompiledGrammar({self.spec.describe()}, V={self.vocab.vocab_size}, "
                f"compiled in {self.compile_seconds:.2f}s, {len(self._masks)} masks cached)")

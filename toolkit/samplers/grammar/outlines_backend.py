"""`OutlinesGrammar`: the `Grammar` of one request over an outlines-core Guide.

The Guide holds the DFA state and the rollback window; EOS is tracked here because
outlines-core has no transition on it (an accepted EOS just terminates the grammar).
"""

from __future__ import annotations

from collections.abc import Sequence

import outlines_core
from torch import Tensor

from toolkit.samplers.grammar.compiled import CompiledGrammar


class OutlinesGrammar:
    def __init__(self, compiled: CompiledGrammar, max_rollback: int = 32) -> None:
        if max_rollback < 1:
            raise ValueError(f"max_rollback must be >= 1, got {max_rollback}")
        self.compiled = compiled
        self.max_rollback = max_rollback
        self._guide = outlines_core.Guide(compiled.index, max_rollback)
        self._eos = frozenset(compiled.vocab.eos_token_ids)
        self._history: list[bool] = []     # per accepted token: True = moved the guide, False = EOS
        self._terminated = False

    @property
    def state(self) -> int:
        return self._guide.get_state()

    def validate(self, tokens: Sequence[int]) -> int:
        index, state = self.compiled.index, self._guide.get_state()
        for i, t in enumerate(tokens):
            if self._terminated:
                return i
            if t in self._eos:
                return i + 1 if index.is_final_state(state) else i     # nothing counts after EOS
            nxt = index.get_next_state(state, int(t))
            if nxt is None:
                return i
            state = nxt
        return len(tokens)

    def accept(self, tokens: Sequence[int]) -> bool:
        if len(tokens) == 1 and not self._terminated and tokens[0] not in self._eos:
            # the engine's call, one token a step: the Guide checks it (and raises, unmoved,
            # when no transition exists), so the validate walk is not needed
            try:
                self._guide.advance(int(tokens[0]), return_tokens=False)
            except ValueError:
                return False
            self._history.append(True)
            if len(self._history) > self.max_rollback:
                del self._history[0]
            return True
        if self.validate(tokens) < len(tokens):
            return False
        for t in tokens:
            if t in self._eos:
                self._terminated = True
                self._history.append(False)
            else:
                self._guide.advance(int(t), return_tokens=False)
                self._history.append(True)
        if len(self._history) > self.max_rollback:
            del self._history[:-self.max_rollback]
        return True

    def rollback(self, n: int) -> None:
        if n < 0 or n > len(self._history):
            raise ValueError(f"can roll back 0..{len(self._history)} tokens now "
                             f"(max_rollback={self.max_rollback}), got {n}")
        if n == 0:
            return
        undone = self._history[-n:]
        del self._history[-n:]
        moved = sum(undone)
        if moved:
            self._guide.rollback_state(moved)
        if not all(undone):
            self._terminated = False

    def fill_bitmask(self, bitmask: Tensor, row: int) -> None:
        # bitmask: int32 [N, W] on the CPU (pinned is best: the engine copies it to the GPU)
        if self._terminated:
            bitmask.numpy()[row] = 0
            return
        # through numpy: a row assignment costs a third of torch's indexing + copy_
        bitmask.numpy()[row] = self.compiled.state_words(self._guide.get_state(), self._guide)

    def mask_key(self) -> tuple[CompiledGrammar, int]:
        # equal keys write equal rows: every request of one compiled grammar shares its
        # states' rows (-1: terminated, all zeros)
        return self.compiled, -1 if self._terminated else self._guide.get_state()

    def is_terminated(self) -> bool:
        return self._terminated

    def can_continue(self, allow_eos: bool = True) -> bool:
        if self._terminated:
            return False
        return self.compiled.state_alive(self._guide.get_state(), self._guide, allow_eos)

    def __repr__(self) -> str:
        return (f"OutlinesGrammar({self.compiled.spec.describe()}, state={self.state}, "
                f"terminated={self._terminated})")

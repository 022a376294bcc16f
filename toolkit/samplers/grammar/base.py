"""The `Grammar` contract (DESIGN.md): one object per constrained request, driven by the engine.

Per step: `fill_bitmask` writes the row of the request's next token (bit set = allowed) while
the GPU runs the forward; after sampling, `accept` advances over the sampled token(s).
Speculative decoding accepts drafts and `rollback`s the rejected ones. A grammar that no
token can continue (`can_continue() is False` before it terminated) ends the request with
finish reason "grammar".

Optional: `mask_key() -> Hashable` names the row `fill_bitmask` would write now (equal keys,
equal rows; e.g. (compiled grammar, DFA state)). The engine then keeps each distinct row on
the device once (`MaskTable`) instead of filling and uploading every row every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class Grammar(Protocol):
    def accept(self, tokens: Sequence[int]) -> bool:
        """Advance over `tokens` if the grammar allows all of them (then True); otherwise
        change nothing and return False. An EOS token is allowed in final states only and
        terminates the grammar."""
        ...

    def validate(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` the grammar would accept; the state does not change."""
        ...

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens (rejected speculative tokens). Raises ValueError
        if fewer than n tokens can be rolled back."""
        ...

    def fill_bitmask(self, bitmask: Tensor, row: int) -> None:
        """Write the allowed next tokens into bitmask[row]: int32 [N, ceil(V/32)], bit v%32 of
        word v//32 set = token v allowed. A terminated grammar writes an all-zero row."""
        ...

    def is_terminated(self) -> bool:
        """True once an EOS token was accepted."""
        ...

    def can_continue(self, allow_eos: bool = True) -> bool:
        """Some token is allowed now (EOS counts only if allow_eos: pass False while the request
        may not stop, min_tokens / ignore_eos). False once terminated or at a dead end."""
        ...

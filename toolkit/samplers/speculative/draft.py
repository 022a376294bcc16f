"""Draft-model proposer: a smaller model with the target's tokenizer drafts k tokens per request.

Its KV lives in its own KVCache indexed by the TARGET's block ids (same num_blocks, same
block_size), so it needs no allocator: a block the target allocator gave a request holds
that request's draft KV too. Per request it remembers how many leading positions of its
cache are valid; on the next call that count grows over the drafts the target accepted and
shrinks to the first block whose id changed (copy-on-write, re-admission) or to 0 after a
preemption, and everything past it is recomputed. Rollback is therefore implicit: rejected
drafts' KV is simply overwritten.

One call = one ragged forward over every request's uncomputed tokens (catch-up + its last
token), then k - 1 single-token forwards. Draft j of a request is written at position
L + j (L = its length), so its block table must reach position L + k - 2: the scheduler
should allocate k lookahead slots (vLLM's num_lookahead_tokens). Where the table is shorter,
k is cut to fit and nothing is written outside the table.

temperature 0: greedy drafts, Draft.probs None (one-hot q). temperature > 0: drafts sampled
from softmax(logits / temperature), Draft.probs = those distributions (float32 [k, V]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from functools import partial

import torch

from toolkit import registry
from toolkit.attention.layerwise import build_attention
from toolkit.models.base import check_model
from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout
from toolkit.samplers.speculative.base import Draft, draft_budget
from toolkit.types import Request


@dataclass
class _DraftState:
    num_computed: int                  # positions [0, num_computed) hold valid draft KV
    length: int                        # the sequence length at the last proposal
    drafts: list[int]                  # its drafts; drafts[:-1] are in the cache at length + j
    table: list[int] = field(default_factory=list)   # block ids those positions were written to
    num_preemptions: int = 0


class DraftModelProposer:
    def __init__(self, model: Any, *, num_blocks: int, block_size: int, attention: Any = "torch",
                 temperature: float = 0.0, seed: int = 0, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        """model: the interface of docs/interfaces.md; num_blocks, block_size: the TARGET's cache
        geometry; attention: a backend name or class, built over the draft's own cache."""
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy drafts), got {temperature}")
        self.model, self.temperature = model, float(temperature)
        self.block_size = block_size
        spec = check_model(model)
        self.dtype = dtype or spec.dtype
        self.device = torch.device(device or getattr(model, "device", None) or next(model.parameters()).device)
        self.kv_cache = KVCache(spec.num_layers, num_blocks, block_size, spec.num_kv_heads,
                                spec.head_dim, self.dtype, self.device)
        cls = registry.lookup("attention", attention) if isinstance(attention, str) else attention
        if not isinstance(cls, type):
            raise ValueError(f"attention must be a backend name {sorted(registry.REGISTRY['attention'])} "
                             f"or class (it is built over the draft's own cache), got {attention!r}")
        self.attention = build_attention(spec, partial(cls, kv_cache=self.kv_cache))
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._state: dict[str, _DraftState] = {}

    def __repr__(self) -> str:
        return (f"DraftModelProposer({type(self.model).__name__}, layers={self.model.spec.num_layers}, "
                f"temperature={self.temperature}, tracked={len(self._state)})")

    def remove(self, request_ids: Sequence[str]) -> None:
        """Forget finished or aborted requests (their blocks may go to others)."""
        for rid in request_ids:
            self._state.pop(rid, None)

    # ------------------------------------------------------------------ bookkeeping
    def _valid_prefix(self, r: Request, tokens: list[int]) -> int:
        """Leading positions of r whose draft KV is still valid (<= len(tokens) - 1)."""
        st = self._state.get(r.request_id)
        if st is None or st.num_preemptions != r.num_preemptions:
            return 0
        c = st.num_computed
        for j, d in enumerate(st.drafts[:-1]):        # accepted drafts keep their KV
            if st.length + j < len(tokens) and tokens[st.length + j] == d:
                c += 1
            else:
                break
        bs = self.block_size
        for i in range(-(-c // bs)):                  # a block moved: recompute from it
            if i >= len(r.block_ids) or i >= len(st.table) or r.block_ids[i] != st.table[i]:
                c = min(c, i * bs)
                break
        return min(c, len(tokens) - 1)

    # ------------------------------------------------------------------ drafting
    @torch.inference_mode()
    def propose(self, requests: Sequence[Request], k: int) -> list[Draft]:
        drafts: list[Draft] = [Draft([]) for _ in requests]
        work = []                                     # (index, request, tokens, valid prefix, k_b)
        for i, r in enumerate(requests):
            tokens = r.all_token_ids
            capacity = len(r.block_ids) * self.block_size
            kb = min(draft_budget(r, k), capacity - len(tokens) + 1)   # writes stay in the table
            if kb > 0:
                work.append((i, r, tokens, self._valid_prefix(r, tokens), kb))
        if not work:
            return drafts
        # step 0: every request's uncomputed tokens [c, L) in one ragged forward
        ids = torch.tensor([t for _, _, tok, c, _ in work for t in tok[c:]], dtype=torch.int64)
        pos = torch.cat([torch.arange(c, len(tok)) for _, _, tok, c, _ in work])
        q_lens = [len(tok) - c for _, _, tok, c, _ in work]
        last = torch.tensor(q_lens).cumsum(0) - 1                           # [B] row of each last token
        logits = self._forward(ids, pos, [r.block_ids for _, r, _, _, _ in work],
                               [len(tok) for _, _, tok, _, _ in work], q_lens, last)   # [B, V]
        out_tok, out_probs = [], []                                          # per step: [B_j], [B_j, V]
        tok_j, probs_j = self._sample(logits)
        out_tok.append(tok_j)
        out_probs.append(probs_j)
        # steps 1 .. k_max-1: one token for the requests that still draft
        for j in range(1, max(kb for *_, kb in work)):
            alive = [b for b, w in enumerate(work) if w[4] > j]
            prev = out_tok[-1]                                              # [B_{j-1}] in work order
            rank = {b: n for n, b in enumerate(self._alive(work, j - 1))}
            ids = prev[torch.tensor([rank[b] for b in alive], device=prev.device)]
            pos = torch.tensor([len(work[b][2]) - 1 + j for b in alive], dtype=torch.int64)
            logits = self._forward(ids, pos, [work[b][1].block_ids for b in alive],
                                   [len(work[b][2]) + j for b in alive], [1] * len(alive),
                                   torch.arange(len(alive)))
            tok_j, probs_j = self._sample(logits)
            out_tok.append(tok_j)
            out_probs.append(probs_j)
        host = [t.tolist() for t in out_tok]                               # the proposer's one sync point
        for b, (i, r, tokens, c, kb) in enumerate(work):
            toks, rows = [], []
            for j in range(kb):
                n = self._alive(work, j).index(b)
                toks.append(int(host[j][n]))
                if out_probs[j] is not None:
                    rows.append(out_probs[j][n])
            drafts[i] = Draft(toks, torch.stack(rows) if rows else None)
            n_blocks = -(-(len(tokens) + kb - 1) // self.block_size)
            self._state[r.request_id] = _DraftState(len(tokens), len(tokens), toks,
                                                    list(r.block_ids[:n_blocks]), r.num_preemptions)
        return drafts

    @staticmethod
    def _alive(work: list, j: int) -> list[int]:
        return [b for b, w in enumerate(work) if w[4] > j]

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, tables: list[list[int]],
                 kv_lens: list[int], q_lens: list[int], rows: torch.Tensor) -> torch.Tensor:
        """One ragged forward of the draft over its cache -> float32 logits [len(rows), V]."""
        layout = PagedKVLayout.build(tables, kv_lens, q_lens, self.block_size, self.device)
        self.attention.plan(layout)
        hidden = self.model.forward(ids.to(self.device), pos.to(self.device), self.attention)
        return self.model.compute_logits(hidden[rows.to(self.device)])

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Greedy: argmax (lowest id on ties), no probs. Else a sample and its distribution."""
        if self.temperature == 0.0:
            return torch.argmax(logits, dim=-1), None
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)   # [B, V]
        return torch.multinomial(probs, 1, generator=self.generator)[:, 0], probs

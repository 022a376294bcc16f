"""What the engine does so that a vLLM user's SamplingParams mean the same here:
bad words given as text, and `best_of` (sample best_of, return the n most likely).

The scheduler and the sampler never see either: the engine rewrites the params when the
request is added (words -> token ids, n -> best_of with the sampled tokens' logprobs) and
picks the n best completions when the request finishes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from toolkit.types import RequestOutput, SamplingParams


def tokenize_bad_words(tokenizer: Any, words: Iterable[list[int] | str]) -> list[list[int]]:
    """Bad words as token-id sequences; a word given as text is banned as written and, as
    vLLM does, with a leading space where that tokenizes to a different sequence of the
    same length."""
    out: list[list[int]] = []
    for w in words:
        if not isinstance(w, str):
            out.append(list(w))
            continue
        if tokenizer is None:
            raise ValueError(f"bad_words as text ({w!r}) need a tokenizer; this engine has none, "
                             "give token-id lists instead")
        plain = list(tokenizer.encode(w.lstrip(), add_special_tokens=False))
        spaced = list(tokenizer.encode(" " + w.lstrip(), add_special_tokens=False))
        if not plain:
            raise ValueError(f"bad word {w!r} tokenizes to no tokens")
        out.append(plain)
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    return out


def resolve_words(params: SamplingParams, tokenizer: Any) -> SamplingParams:
    """params with every bad word as token ids (the same object when none was text)."""
    if not params.has_text_bad_words:
        return params
    return dataclasses.replace(params, bad_words=tokenize_bad_words(tokenizer, params.bad_words))


class BestOf:
    """Requests with best_of > n: run best_of samples, report only the finished request,
    with the n completions of highest cumulative logprob (vLLM's best_of)."""

    def __init__(self) -> None:
        self._wanted: dict[str, tuple[int, bool]] = {}   # request id -> (n, keep logprobs)

    def expand(self, request_id: str, params: SamplingParams) -> SamplingParams:
        """The params the engine runs: n = best_of, logprobs of the sampled token at least."""
        if params.best_of is None or params.best_of <= params.n:
            return params
        self._wanted[request_id] = (params.n, params.logprobs is not None)
        return dataclasses.replace(params, n=params.best_of, best_of=None,
                                   logprobs=params.logprobs if params.logprobs is not None else 0)

    def forget(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self._wanted.pop(rid, None)

    def filter(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """outputs with best_of requests' partial outputs dropped and finished ones cut to n."""
        if not self._wanted:
            return outputs
        kept = []
        for o in outputs:
            want = self._wanted.get(o.request_id)
            if want is None:
                kept.append(o)
            elif o.finished:
                del self._wanted[o.request_id]
                kept.append(_best(o, *want))
        return kept


def _best(o: RequestOutput, n: int, keep_logprobs: bool) -> RequestOutput:
    ranked = sorted(o.outputs, key=lambda c: -(c.cumulative_logprob or 0.0))[:n]
    comps = [dataclasses.replace(c, index=i, logprobs=c.logprobs if keep_logprobs else None)
             for i, c in enumerate(ranked)]
    return dataclasses.replace(o, outputs=comps, new_token_ids=comps[0].token_ids if comps else [],
                               finish_reason=comps[0].finish_reason if comps else o.finish_reason,
                               stop_reason=comps[0].stop_reason if comps else o.stop_reason)

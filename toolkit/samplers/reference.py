"""The reference sampler: the oracle. Plain torch float64, one row at a time, one function per
stage, applied in the fixed order

    penalties -> logit_bias -> allowed_token_ids -> bad_words -> min_tokens -> grammar bitmask
    -> temperature -> min_p -> top_k -> top_p -> sample.

It reads only the host copies in the metadata (params, token lists), never the fast path's
tensors. Rules it pins down: greedy (temperature 0) = argmax with ties to the LOWEST token
id; top_k keeps every token tied with the k-th largest; top_p keeps the smallest set of most
likely tokens whose mass reaches top_p plus everything tied with its least likely member; a
row with no finite logit left has all-zero probabilities and yields token 0. Logprobs are
the raw logits' log_softmax (before any stage). `probs(logits, meta)` gives the exact final
distribution; sampling uses torch.multinomial with a generator seeded from (seed, step).
"""

from __future__ import annotations

import torch
from torch import Tensor

from toolkit.samplers.base import (SamplerOutput, SamplingMetadata, banned_bad_words,
                                   min_tokens_banned, seed_key)
from toolkit.samplers.bitmask import unpack_token_bitmask
from toolkit.types import MIN_P_FLOOR, SamplingParams

NEG_INF = float("-inf")


def apply_penalties(x: Tensor, p: SamplingParams, prompt: list[int], output: list[int]) -> Tensor:
    x = x.clone()
    if p.repetition_penalty != 1.0:
        for t in set(prompt) | set(output):
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(output):
        x[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return x


def apply_logit_bias(x: Tensor, p: SamplingParams) -> Tensor:
    x = x.clone()
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    return x


def apply_allowed(x: Tensor, p: SamplingParams) -> Tensor:
    if p.allowed_token_ids is None:
        return x
    keep = torch.zeros_like(x, dtype=torch.bool)
    keep[list(p.allowed_token_ids)] = True
    return x.masked_fill(~keep, NEG_INF)


def apply_bans(x: Tensor, tokens: list[int]) -> Tensor:
    x = x.clone()
    x[tokens] = NEG_INF
    return x


def apply_temperature(x: Tensor, p: SamplingParams) -> Tensor:
    return x if p.greedy else x / p.temperature


def softmax(x: Tensor) -> Tensor:
    if not torch.isfinite(x).any():
        return torch.zeros_like(x)
    return torch.softmax(x, dim=-1)


def apply_min_p(x: Tensor, p: SamplingParams) -> Tensor:
    if p.min_p < MIN_P_FLOOR:                    # below float32's range: off (toolkit.types)
        return x
    pr = softmax(x)
    return x.masked_fill(pr < p.min_p * pr.max(), NEG_INF)


def apply_top_k(x: Tensor, p: SamplingParams) -> Tensor:
    if p.top_k <= 0 or p.top_k >= x.numel():
        return x
    kth = x.sort(descending=True).values[p.top_k - 1]
    return x.masked_fill(x < kth, NEG_INF)


def apply_top_p(x: Tensor, p: SamplingParams) -> Tensor:
    if p.top_p >= 1.0:
        return x
    pr = softmax(x)
    srt = pr.sort(descending=True).values
    cum = srt.cumsum(0)
    j = min(int((cum < p.top_p).sum()), x.numel() - 1)                  # first index reaching top_p
    return x.masked_fill(pr < srt[j], NEG_INF)


def argmax_lowest(x: Tensor) -> int:
    """Index of the maximum, the lowest one among ties (0 for a row of only -inf)."""
    return int((x == x.max()).nonzero()[0]) if torch.isfinite(x).any() else 0


class ReferenceSampler:
    def __init__(self, generator: torch.Generator | None = None) -> None:
        """generator: a CPU generator for unseeded rows (None: torch's default one)."""
        self.generator = generator

    def __repr__(self) -> str:
        return "ReferenceSampler()"

    def process_row(self, logits: Tensor, meta: SamplingMetadata, i: int) -> Tensor:
        """Processed logits float64 [V] of row i (-inf = excluded), every stage in order."""
        p, out = meta.params[i], meta.output_token_ids[i]
        x = logits.detach().to("cpu", torch.float64)
        x = apply_penalties(x, p, meta.prompt_token_ids[i], out)
        x = apply_logit_bias(x, p)
        x = apply_allowed(x, p)
        x = apply_bans(x, banned_bad_words(p.bad_words or [], out))
        x = apply_bans(x, min_tokens_banned(p, len(out), meta.eos_token_ids[i]))
        if meta.bitmask is not None:
            r = i if meta.bitmask_rows is None else int(meta.bitmask_rows[i])
            allowed = unpack_token_bitmask(meta.bitmask[r:r + 1].cpu(), x.numel())[0]
            x = x.masked_fill(~allowed, NEG_INF)
        x = apply_temperature(x, p)
        if p.greedy:
            return x
        x = apply_min_p(x, p)
        x = apply_top_k(x, p)
        return apply_top_p(x, p)

    def probs(self, logits: Tensor, meta: SamplingMetadata) -> Tensor:
        """The exact final distribution float64 [N, V] (greedy rows: one-hot at the argmax)."""
        rows = []
        for i in range(meta.num_rows):
            x = self.process_row(logits[i], meta, i)
            if meta.params[i].greedy:
                r = torch.zeros_like(x)
                if torch.isfinite(x).any():
                    r[argmax_lowest(x)] = 1.0
                rows.append(r)
            else:
                rows.append(softmax(x))
        return torch.stack(rows) if rows else torch.zeros(0, meta.vocab_size, dtype=torch.float64)

    def __call__(self, logits: Tensor, meta: SamplingMetadata) -> SamplerOutput:
        tokens = []
        for i in range(meta.num_rows):
            p = meta.params[i]
            x = self.process_row(logits[i], meta, i)
            if p.greedy or not torch.isfinite(x).any():
                tokens.append(argmax_lowest(x))
                continue
            gen = self.generator
            if p.seed is not None:
                gen = torch.Generator().manual_seed(seed_key(p.seed, len(meta.output_token_ids[i])))
            tokens.append(int(torch.multinomial(softmax(x), 1, generator=gen)))
        tok = torch.tensor(tokens, dtype=torch.int64)
        if meta.max_num_logprobs is None:
            return SamplerOutput(tok.to(logits.device))
        k = min(meta.max_num_logprobs, meta.vocab_size)
        vals, ids, ranks = [], [], []
        for i in range(meta.num_rows):
            raw = logits[i].detach().to("cpu", torch.float64)
            lp = torch.log_softmax(raw, dim=-1)
            order = raw.sort(descending=True, stable=True).indices[:k]        # ties: lowest id first
            t = tokens[i]
            vals.append(torch.cat([lp[t:t + 1], lp[order]]))
            ids.append(torch.cat([torch.tensor([t]), order]))
            ranks.append(int((raw >= raw[t]).sum()))
        dev = logits.device
        return SamplerOutput(tok.to(dev), torch.stack(vals).float().to(dev),
                             torch.stack(ids).to(dev), torch.tensor(ranks).to(dev))

"""Pure-torch twins of the sampling kernels (same names and signatures as the Triton ops).

`top_k_top_p_threshold` (kernels/top_k_top_p.py), `gumbel_sample` (kernels/gumbel_sample.py),
`truncated_sample` (kernels/truncated_sample.py), `kth_largest` (kernels/kth_largest.py),
`apply_penalties` (kernels/penalties.py), `gather_logprobs` (kernels/logprobs.py) and
`apply_token_bitmask` (kernels/apply_bitmask.py). They are the oracle of the kernels'
tests and the CPU path of the sampler. The noise hash is written out here exactly as in
the Triton kernel, so a seeded row draws the same token on either path.
"""

from __future__ import annotations

import torch
from torch import Tensor

_M32 = 0xFFFFFFFF


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32) held in int64, without int64 overflow."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _M32


def _fmix32(x: Tensor) -> Tensor:
    """MurmurHash3's 32-bit finalizer: a bijection of [0, 2**32) with full avalanche."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def hash_uniform_bits(keys: Tensor, token_ids: Tensor) -> Tensor:
    """32 random bits per (key, token): keys int64 [N, 1], token_ids int64 [1, V] -> int64 [N, V].

    A counter-based generator: the bits depend on the row's key and the token id only, never on
    the batch, the vocabulary size or the device.
    """
    k1 = keys & _M32
    k2 = (keys >> 32) & _M32
    x = _fmix32((_mul32(token_ids, 0x9E3779B9) + k1) & _M32)
    return _fmix32(x ^ k2)


def gumbel_noise(keys: Tensor, vocab_size: int) -> Tensor:
    """Gumbel(0, 1) noise float32 [N, V] from keys int64 [N] (computed in float64, then rounded).

    u = (bits + 0.5) / 2**32 lies in (0, 1); float64 keeps u's 32 bits exactly, so the small
    Exp(1) values that decide the race (-log u for u near 1) keep their resolution.
    """
    ids = torch.arange(vocab_size, device=keys.device, dtype=torch.int64)[None, :]
    bits = hash_uniform_bits(keys[:, None], ids)                       # [N, V]
    u = (bits.to(torch.float64) + 0.5) * (1.0 / 4294967296.0)
    return (-torch.log(-torch.log(u))).to(torch.float32)


def gumbel_sample(logits: Tensor, keys: Tensor, greedy: Tensor) -> Tensor:
    """Exponential race / Gumbel-max: argmax(logits + G) per row; greedy rows: argmax(logits).

    logits float32 [N, V] (processed, -inf = excluded), keys int64 [N], greedy bool [N]
    -> token ids int64 [N]. Ties go to the lowest token id; a row of only -inf gives 0.
    """
    noise = gumbel_noise(keys, logits.shape[1])                        # [N, V]
    noise = torch.where(greedy[:, None], torch.zeros_like(noise), noise)
    return torch.argmax(logits.float() + noise, dim=-1)                # first max = lowest id


def top_k_top_p_threshold(logits: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Per-row logit threshold t such that {logits >= t} is the top-k then top-p set.

    logits float32 [N, V]; top_k int [N] (<= 0 or >= V: off); top_p float32 [N] (1: off)
    -> t float32 [N] (-inf: keep all). Ties at a cut are all kept:
      t_k = the k-th largest logit;
      t   = the largest logit value v >= t_k with  sum_{l >= v} e^l >= top_p * sum_{l >= t_k} e^l.
    Sorting twin of the bisection kernel; sums in float32 like the kernel.
    """
    n, v = logits.shape
    srt = logits.float().sort(dim=-1, descending=True).values           # [N, V]
    k = top_k.to(torch.int64)
    off_k = ((k <= 0) | (k >= v))[:, None]                              # [N, 1]
    k = torch.where((k <= 0) | (k > v), torch.full_like(k, v), k)
    t_k = srt.gather(1, (k - 1)[:, None])                               # [N, 1]
    t_k = torch.where(off_k, torch.full_like(t_k, float("-inf")), t_k)
    m = srt[:, :1]
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(srt - m) * (srt >= t_k)                                # [N, V] kept mass
    total = e.sum(dim=-1, keepdim=True)
    cum = e.cumsum(dim=-1)
    target = top_p.float()[:, None] * total
    # first index whose running mass reaches the target; later ties only add mass
    idx = (cum < target).sum(dim=-1, keepdim=True).clamp(max=v - 1)
    t_p = torch.maximum(srt.gather(1, idx), t_k)
    off = (top_p.float() >= 1.0)[:, None]
    return torch.where(off, t_k, t_p).squeeze(1)


def kth_largest(x: Tensor, top_k: Tensor, rows: Tensor, max_k: int) -> Tensor:
    """float32 [N]: the top_k[r]-th largest value of x[r] for r in rows (-inf elsewhere).
    torch.topk(max_k) over the listed rows; twin of `kernels.kth_largest` (the group filter,
    or the radix select `kth_largest_radix` for wide k)."""
    sub = x.index_select(0, rows).topk(max_k, dim=1).values              # [R, max_k], descending
    vals = sub.gather(1, (top_k.index_select(0, rows).long() - 1)[:, None]).squeeze(1)
    return torch.full((x.shape[0],), float("-inf"), device=x.device).index_copy_(0, rows, vals)


def truncated_sample(logits: Tensor, temperature: Tensor, greedy: Tensor, min_p: Tensor | None,
                     top_k: Tensor | None, top_p: Tensor | None, keys: Tensor,
                     kth_largest: Tensor | None = None) -> Tensor:
    """The sampler's tail materialised: y = logits / T (greedy rows: T = 1), min-p cut
    (y < max y + log min_p -> -inf), the top-k then top-p threshold, then `gumbel_sample`.

    Same signature as the fused kernel `truncated_sample` (None: no row uses that cut;
    kth_largest is a hint for the kernel: the twin finds the cut itself).
    """
    n = logits.shape[0]
    t = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    y = logits.float() / t[:, None]                                      # [N, V]
    if min_p is not None:
        cut = y.amax(dim=-1) + torch.log(min_p.float())
        y = y.masked_fill(y < cut[:, None], float("-inf"))
    if top_k is not None or top_p is not None:
        k = top_k if top_k is not None else torch.zeros(n, dtype=torch.int64, device=y.device)
        p = top_p if top_p is not None else torch.ones(n, device=y.device)
        y = y.masked_fill(y < top_k_top_p_threshold(y, k, p)[:, None], float("-inf"))
    return gumbel_sample(y, keys, greedy)


def apply_penalties(logits: Tensor, prompt_tokens: Tensor, output_tokens: Tensor,
                    repetition: Tensor, frequency: Tensor, presence: Tensor,
                    rows: Tensor | None = None) -> Tensor:
    """In place on logits float32 [N, V] (returned): repetition (prompt + output tokens; divide
    positive logits, multiply negative ones), then frequency (x count in the output) and
    presence (once if in the output). Token lists int64 [R, L] padded with V, list row r for
    logits row rows[r] (None: R = N, row r). Sparse: only listed tokens are read and written
    (a sort and two searchsorted count them in the output)."""
    if rows is not None:                                  # the listed rows, then back in place
        sub = apply_penalties(logits.index_select(0, rows), prompt_tokens, output_tokens,
                              repetition[rows], frequency[rows], presence[rows])
        return logits.index_copy_(0, rows, sub)
    v = logits.shape[1]
    toks = torch.cat([prompt_tokens, output_tokens], dim=1)              # [N, L], pad = V
    first = toks.amin(dim=1, keepdim=True)                               # a real token, if any
    seen = first < v                                                     # [N, 1]
    # pads repeat one of the row's tokens, so a duplicate index writes the same value
    toks = torch.where(seen, torch.where(toks < v, toks, first), torch.zeros_like(toks))
    srt = output_tokens.sort(dim=1).values
    counts = (torch.searchsorted(srt, toks, right=True)
              - torch.searchsorted(srt, toks)).float()                   # [N, L] in the output
    x = logits.gather(1, toks)
    rep = repetition.float()[:, None]
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    x = x - frequency.float()[:, None] * counts
    x = x - presence.float()[:, None] * (counts > 0).float()
    return logits.scatter_(1, toks, x)


def apply_token_bitmask(logits: Tensor, bitmask: Tensor, rows: Tensor | None = None) -> None:
    """In place: logits[r, v] = -inf where bit v of mask row r (or rows[r]) is 0.

    logits float [N, V]; bitmask int32 [N, ceil(V/32)], or [M, ceil(V/32)] with rows int [N]
    in [0, M) (bit v%32 of word v//32 set = allowed).
    """
    n, v = logits.shape
    if rows is not None:
        bitmask = bitmask[rows.long()]                                   # [N, W]
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    bits = (bitmask[:, :, None] >> shifts) & 1                          # [N, W, 32]
    allowed = bits.reshape(n, -1)[:, :v].bool()                          # [N, V]
    logits.masked_fill_(~allowed, float("-inf"))


def gather_logprobs(logits: Tensor, token_ids: Tensor, k: int, rows: Tensor | None = None,
                    *, saved: Tensor | None = None, saved_rows: Tensor | None = None
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """logits float [N, V] (raw), token_ids int64 [N], k >= 0 -> (logprobs float32 [N, k+1],
    ids int64 [N, k+1], ranks int64 [N]).

    Column 0 is the given token, columns 1..k the k most likely tokens (k capped at V; ties to
    the lowest id, by a stable sort); rank = #{tokens whose logit >= the given token's}
    (1-based; vLLM's rule, so a tie shares the worse rank). Ranks and the top-k come from the
    logits themselves, not from rounded logprobs, so they are exact. Usable for prompt
    logprobs too (token_ids = the next token). rows int64 [R]: compute only these rows (the
    others get logprob NaN, id -1, rank 0). saved float [S, V] with saved_rows int64 [S]: the
    raw logits of those rows, read instead of logits' rows (which a stage changed in place).
    """
    if (saved is None) != (saved_rows is None):
        raise ValueError(f"saved and saved_rows go together (the raw rows, and which rows they "
                         f"are): pass both or neither; got saved={saved is not None}, "
                         f"saved_rows={saved_rows is not None}")
    if saved is not None and saved_rows.numel():
        logits = logits.index_copy(0, saved_rows, saved.to(logits.dtype))
    if rows is not None:
        n, k = token_ids.shape[0], min(k, logits.shape[1])
        sub = gather_logprobs(logits.index_select(0, rows), token_ids.index_select(0, rows), k)
        full = (torch.full((n, k + 1), float("nan"), device=logits.device),
                torch.full((n, k + 1), -1, dtype=torch.int64, device=logits.device),
                torch.zeros(n, dtype=torch.int64, device=logits.device))
        return tuple(f.index_copy_(0, rows, s) for f, s in zip(full, sub))  # type: ignore[return-value]
    x = logits.to(torch.float32)
    m = x.amax(dim=-1, keepdim=True)                                      # [N, 1]
    lse = torch.logsumexp(x - m, dim=-1, keepdim=True)                    # as log_softmax rounds
    k = min(k, x.shape[1])
    ranks = (x >= x.gather(1, token_ids[:, None])).sum(dim=-1)            # [N]
    ids = token_ids[:, None]
    if k:
        top = x.sort(dim=-1, descending=True, stable=True).indices[:, :k]   # lowest id on ties
        ids = torch.cat([ids, top], dim=1)                                # [N, k+1]
    return (x.gather(1, ids) - m) - lse, ids, ranks

"""The sampler contract: logits [N, V] + per-row SamplingMetadata -> SamplerOutput.

One metadata row per logits row; a request may own several rows (n > 1, speculative
positions), each row carrying its own prompt and output token lists. Everything a stage
needs is built here once per step, on the host, from host data only; the fast sampler
then runs with no host synchronisation.

Logprobs are those of the raw model logits (log_softmax before penalties, bans and
temperature: vLLM V1's default "raw_logprobs"). Column 0 is the sampled token, columns
1..k the top-k; ranks are 1-based, rank = #{tokens with logprob >= the sampled one's}.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from toolkit.samplers.bitmask import pack_token_bitmask
from toolkit.transfer import to_device, upload
from toolkit.types import MIN_P_FLOOR, SamplingParams

_M64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def seed_key(seed: int, step: int) -> int:
    """The 63-bit noise key of a seeded row at output position `step` (tokens so far)."""
    return _splitmix64(_splitmix64(seed & _M64) ^ step) >> 1


@runtime_checkable
class Sampler(Protocol):
    """logits float32 [N, V] -> tokens [N]; no host sync on the GPU path.

    Optional capabilities, declared (the engine reads them once, when it is assembled):
    - `can_consume_logits: bool` (default False): __call__ takes consume_logits=True and may
      then overwrite the logits it is given (the engine's own, used once).
    - `process(logits, meta) -> processed logits` (the distribution it samples from, -inf =
      excluded): needed by speculative decoding's rejection sampler; an engine with a
      proposer refuses a sampler without it when it is built.
    - `graph_tail(meta, generator=None) -> (fn, rows) | None`: this step's sampling as
      `fn(logits, **rows)` over per-row tensors [N] (keys drawn now), a fixed sequence of
      kernels with no host decision, or None; the engine captures the LM head and fn in a
      CUDA graph per row bucket and replays it (worker/sample_graphs.py).
    """

    def __call__(self, logits: Tensor, meta: "SamplingMetadata") -> "SamplerOutput": ...


@dataclass
class SamplerOutput:
    token_ids: Tensor                    # int64 [N]
    logprobs: Tensor | None = None       # float32 [N, k+1]: sampled token, then top-k (raw)
    logprob_token_ids: Tensor | None = None   # int64 [N, k+1]
    ranks: Tensor | None = None          # int64 [N]: 1-based rank of the sampled token


def _pad(rows: Sequence[Sequence[int]], pad: int) -> Tensor:
    """int64 [N, max len] (at least one column), rows left-aligned, padded with `pad`.
    Rows may be lists or int64 numpy arrays (copied as blocks, not converted token by token)."""
    lens = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    width = max(int(lens.max(initial=0)), 1)
    out = np.full((len(rows), width), pad, dtype=np.int64)
    if any(isinstance(r, np.ndarray) for r in rows):
        lists = []
        for i, r in enumerate(rows):
            if isinstance(r, np.ndarray):
                out[i, : len(r)] = r
            else:
                lists.append(i)
        if lists:                                   # the list rows, by the scatter below
            sub = _pad([rows[i] for i in lists], pad).numpy()
            out[lists, : sub.shape[1]] = sub[:, : width]
        return torch.from_numpy(out)
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lens.sum()))
    # row i's tokens go to out[i, :lens[i]]: one scatter instead of a copy per row
    row_of = np.repeat(np.arange(len(rows)), lens)
    col_of = np.arange(flat.size) - np.repeat(np.cumsum(lens) - lens, lens)
    out[row_of, col_of] = flat
    return torch.from_numpy(out)


def _coo(pairs: list[tuple[int, int]]) -> tuple[Tensor, Tensor]:
    t = torch.tensor(pairs, dtype=torch.int64)                         # [B, 2]
    return t[:, 0].contiguous(), t[:, 1].contiguous()


def _check_ids(ids: Sequence[int], vocab_size: int, where: str, field: str) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{where}{field} has token ids {bad[:5]} outside the vocabulary "
                         f"[0, {vocab_size})")


def check_token_ids(p: SamplingParams, vocab_size: int, where: str = "") -> None:
    """ValueError if a token id of `p` (logit_bias, allowed_token_ids, bad_words,
    stop_token_ids) lies outside [0, vocab_size). The engine calls it at add_request, so a bad
    request is refused before it is queued rather than failing a step."""
    _check_ids(p.logit_bias or {}, vocab_size, where, "logit_bias")
    _check_ids(p.allowed_token_ids or [], vocab_size, where, "allowed_token_ids")
    _check_ids([t for w in p.bad_words or [] for t in w], vocab_size, where, "bad_words")
    _check_ids(p.stop_token_ids or [], vocab_size, where, "stop_token_ids")


def banned_bad_words(bad_words: Sequence[Sequence[int]], output: Sequence[int]) -> list[int]:
    """Tokens that would complete a bad word now (vLLM V1: matched against output tokens)."""
    out = []
    for w in bad_words:
        prefix = list(w[:-1])
        if len(prefix) > len(output):
            continue
        if not prefix or list(output[len(output) - len(prefix):]) == prefix:
            out.append(w[-1])
    return out


def min_tokens_banned(p: SamplingParams, num_output: int, eos: int | None) -> list[int]:
    """Stop tokens banned while fewer than min_tokens outputs exist (EOS unless ignore_eos)."""
    if num_output >= p.min_tokens:
        return []
    ids = list(p.stop_token_ids or [])
    if eos is not None and not p.ignore_eos:
        ids.append(eos)
    return ids


@dataclass
class SamplingMetadata:
    """Per-row tensors of one step (None = no row uses that stage) plus the host inputs."""

    num_rows: int
    vocab_size: int
    device: torch.device
    temperature: Tensor                  # float32 [N], 0 = greedy
    greedy: Tensor                       # bool [N]
    all_greedy: bool
    top_k: Tensor | None                 # int64 [N], 0 = off
    top_p: Tensor | None                 # float32 [N], 1 = off
    top_k_rows: Tensor | None            # int64 [R]: sampled rows with top-k on (0 < k < V)
    max_top_k: int                       # the largest k among those rows (0: none)
    min_p: Tensor | None                 # float32 [N], 0 = off
    repetition_penalty: Tensor | None    # float32 [N] } all three set when any row penalises
    presence_penalty: Tensor | None      # float32 [N] }
    frequency_penalty: Tensor | None     # float32 [N] }
    prompt_tokens: Tensor | None         # int64 [R, Lp], padded with vocab_size (repetition rows)
    output_tokens: Tensor | None         # int64 [R, Lo], padded with vocab_size (penalising rows)
    penalty_rows: Tensor | None          # int64 [R]: the rows those lists belong to (None: all N)
    bias: tuple[Tensor, Tensor, Tensor] | None        # rows int64 [B], tokens int64 [B], values f32 [B]
    allowed_bitmask: Tensor | None       # int32 [N, ceil(V/32)], rows without a list: all ones
    bad_words: tuple[Tensor, Tensor] | None           # (rows, tokens) int64 [B] banned now
    min_tokens: tuple[Tensor, Tensor] | None          # (rows, tokens) int64 [B] banned now
    bitmask: Tensor | None               # int32 [N, ceil(V/32)] from a grammar (bit set = allowed),
                                         # or [M, ceil(V/32)], a table read through bitmask_rows
    bitmask_rows: Tensor | None          # int32 [N]: row i's mask is bitmask[bitmask_rows[i]]
    seeded: Tensor                       # bool [N]
    seed_keys: Tensor                    # int64 [N], seed_key(seed, len(output)); 0 if unseeded
    any_seeded: bool
    max_num_logprobs: int | None         # k of the widest logprobs request; None = none asked
    logprob_rows: Tensor | None          # int64 [R]: the rows that ask, when not all of them do
    logprob_changed_rows: Tensor | None  # int64 [S]: asking rows a built-in stage may change
                                         # (penalties, bias, allowed, bans, bitmask); None: none
    # host views (the caller's lists, read-only, this step only), for the reference sampler and users' stages
    params: list[SamplingParams]
    prompt_token_ids: list[Sequence[int]]   # lists, or int64 numpy arrays (the engine's)
    output_token_ids: list[list[int]]
    eos_token_ids: list[int | None]

    @classmethod
    def build(cls, params: list[SamplingParams], prompt_token_ids: Sequence[Sequence[int]],
              output_token_ids: list[list[int]], vocab_size: int, device: Any,
              eos_token_ids: list[int | None] | None = None,
              bitmask: Tensor | None = None, check_ids: bool = True,
              bitmask_rows: Sequence[int] | None = None,
              penalty_lists: Callable[[list[int]], tuple[Tensor, Tensor]] | None = None,
              ) -> "SamplingMetadata":
        """One row per logits row. Token ids outside [0, vocab_size) raise ValueError
        (check_ids=False: the params' ids were checked already, as the engine does at
        add_request; this is per-step host time at large batches).

        bitmask: a grammar's int32 [N, ceil(V/32)] (row i for logits row i), or with
        bitmask_rows (one index a row) a table [M, ceil(V/32)] whose row bitmask_rows[i] is
        logits row i's (`MaskTable`: rows in the same grammar state share one).

        penalty_lists: given the penalising rows (indices, in row order), their prompt ids
        (blank where repetition is off) and output ids as device tensors, exactly as built
        here from prompt_token_ids / output_token_ids (the engine keeps them on the device
        between steps, worker/penalty_history.py); None: built here from the lists."""
        n = len(params)
        device = torch.device(device)
        if len(prompt_token_ids) != n or len(output_token_ids) != n:
            raise ValueError(f"params, prompt_token_ids and output_token_ids need one entry per "
                             f"row; got {n}, {len(prompt_token_ids)}, {len(output_token_ids)}")
        if eos_token_ids is None:
            eos_token_ids = [None] * n
        if len(eos_token_ids) != n:
            raise ValueError(f"eos_token_ids needs one entry (int or None) per row: {n}, "
                             f"got {len(eos_token_ids)}")
        if not (isinstance(vocab_size, int) and vocab_size >= 1):
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        if bitmask_rows is not None and bitmask is None:
            raise ValueError("bitmask_rows index a bitmask table: pass bitmask too")
        if bitmask is not None:
            words = (vocab_size + 31) // 32
            m = bitmask.shape[0] if bitmask_rows is not None and bitmask.dim() == 2 else n
            if bitmask.dtype != torch.int32 or tuple(bitmask.shape) != (m, words):
                raise ValueError(f"bitmask must be int32 of shape ({n if bitmask_rows is None else 'M'}, "
                                 f"{words}) (bit set = allowed), got {bitmask.dtype} "
                                 f"{tuple(bitmask.shape)}")
            if bitmask_rows is not None and (len(bitmask_rows) != n or (
                    n and not 0 <= min(bitmask_rows) <= max(bitmask_rows) < m)):
                raise ValueError(f"bitmask_rows needs one index in [0, {m}) per row ({n} rows), "
                                 f"got {len(bitmask_rows)} in "
                                 f"[{min(bitmask_rows, default=0)}, {max(bitmask_rows, default=0)}]")
            bitmask = to_device(bitmask, device)     # pinned by the engine: no host wait
        checked: set[int] = set()      # rows usually share a few params objects: check each once
        for i, p in enumerate(params):
            if not isinstance(p, SamplingParams):
                raise ValueError(f"row {i}: params must be SamplingParams, got {type(p).__name__}")
            eos = eos_token_ids[i]
            if eos is not None and not 0 <= eos < vocab_size:
                _check_ids([eos], vocab_size, f"row {i}: ", "eos_token_id")
            if not check_ids or id(p) in checked:
                continue
            checked.add(id(p))
            check_token_ids(p, vocab_size, f"row {i}: ")

        # every per-row tensor is made on the CPU, then all go to the device in one copy
        cpu: dict[str, Tensor] = {}

        def f32(vals: Sequence[float] | np.ndarray) -> Tensor:   # rounded as torch rounds
            return torch.from_numpy(np.asarray(vals, dtype=np.float32))

        # the per-row numbers in one pass over the params, as columns [N] (float64 holds each
        # value exactly, top_k included)
        cols = np.array([(p.temperature, p.top_p, p.min_p, p.top_k, p.repetition_penalty,
                          p.presence_penalty, p.frequency_penalty) for p in params],
                        dtype=np.float64).reshape(n, 7).T
        temp, top_p, min_p, top_k, rep, pres, freq = cols
        min_p = np.where(min_p < MIN_P_FLOOR, 0.0, min_p)   # below float32's range: off (see types)
        greedy = temp == 0.0
        sampled = ~greedy                               # top-k/p, min_p only matter when sampling
        cpu["temperature"] = f32(temp)
        cpu["greedy"] = torch.from_numpy(greedy)
        k_on = sampled & (top_k > 0) & (top_k < vocab_size)
        if k_on.any():
            cpu["top_k"] = torch.from_numpy(np.where(top_k < vocab_size, top_k, 0).astype(np.int64))
        if (sampled & (top_p < 1.0)).any():
            cpu["top_p"] = f32(top_p)
        if (sampled & (min_p > 0.0)).any():
            cpu["min_p"] = f32(min_p)
        k_rows = np.flatnonzero(k_on)
        if k_rows.size:
            cpu["top_k_rows"] = torch.from_numpy(k_rows.astype(np.int64))

        penalised = (rep != 1.0) | (pres != 0.0) | (freq != 0.0)
        if penalised.any():
            cpu["repetition_penalty"] = f32(rep)
            cpu["presence_penalty"] = f32(pres)
            cpu["frequency_penalty"] = f32(freq)
            # only penalising rows need their tokens (repetition: prompt + output; the others:
            # output), so the lists copied each step hold those rows alone
            rows = np.flatnonzero(penalised).tolist()
            if len(rows) < n:
                cpu["penalty_rows"] = torch.tensor(rows, dtype=torch.int64)
            if penalty_lists is None:
                cpu["prompt_tokens"] = _pad([prompt_token_ids[i] if rep[i] != 1.0 else [] for i in rows],
                                            vocab_size)
                cpu["output_tokens"] = _pad([output_token_ids[i] for i in rows], vocab_size)

        bias_pairs = [(i, t, b) for i, p in enumerate(params)
                      for t, b in (p.logit_bias or {}).items()]
        if bias_pairs:
            cpu["bias_rows"], cpu["bias_tokens"] = _coo([(i, t) for i, t, _ in bias_pairs])
            cpu["bias_values"] = f32([b for _, _, b in bias_pairs])
        if any(p.allowed_token_ids is not None for p in params):
            cpu["allowed_bitmask"] = pack_token_bitmask([p.allowed_token_ids for p in params],
                                                        vocab_size)
        bad = [(i, t) for i, (p, out) in enumerate(zip(params, output_token_ids))
               if p.bad_words for t in banned_bad_words(p.bad_words, out)]
        if bad:
            cpu["bad_rows"], cpu["bad_tokens"] = _coo(bad)
        min_tok = [(i, t) for i, (p, out, e)
                   in enumerate(zip(params, output_token_ids, eos_token_ids))
                   if len(out) < p.min_tokens for t in min_tokens_banned(p, len(out), e)]
        if min_tok:
            cpu["min_rows"], cpu["min_tokens"] = _coo(min_tok)

        seeds = [p.seed for p in params]
        seeded_l = [s is not None for s in seeds]
        cpu["seeded"] = torch.tensor(seeded_l, dtype=torch.bool)
        keys = np.zeros(n, dtype=np.int64)                       # 63-bit keys: int64 holds them
        for i in (i for i, s in enumerate(seeded_l) if s):
            keys[i] = seed_key(seeds[i], len(output_token_ids[i]))
        cpu["seed_keys"] = torch.from_numpy(keys)
        lp = [p.logprobs for p in params]
        asked = [k for k in lp if k is not None]
        if asked and len(asked) < n:
            cpu["logprob_rows"] = torch.tensor([i for i, k in enumerate(lp) if k is not None],
                                               dtype=torch.int64)
        if asked:                # their raw logits are saved before the stages change them
            changed = penalised.copy() if bitmask is None else np.ones(n, dtype=bool)
            allowed = (i for i, p in enumerate(params) if p.allowed_token_ids is not None)
            for i in itertools.chain((i for i, _, _ in bias_pairs), (i for i, _ in bad),
                                     (i for i, _ in min_tok), allowed):
                changed[i] = True
            changed_rows = [i for i, k in enumerate(lp) if k is not None and changed[i]]
            if changed_rows:
                cpu["logprob_changed_rows"] = torch.tensor(changed_rows, dtype=torch.int64)
        if bitmask_rows is not None:
            cpu["bitmask_rows"] = torch.tensor(bitmask_rows, dtype=torch.int32)
        dev = upload(cpu, device)
        if penalty_lists is not None and penalised.any():
            dev["prompt_tokens"], dev["output_tokens"] = penalty_lists(np.flatnonzero(penalised).tolist())
        pair = lambda a, b: (dev[a], dev[b]) if a in dev else None  # noqa: E731
        return cls(
            num_rows=n, vocab_size=vocab_size, device=device,
            temperature=dev["temperature"], greedy=dev["greedy"], all_greedy=not sampled.any(),
            top_k=dev.get("top_k"), top_p=dev.get("top_p"), min_p=dev.get("min_p"),
            top_k_rows=dev.get("top_k_rows"),
            max_top_k=int(top_k[k_rows].max()) if k_rows.size else 0,
            repetition_penalty=dev.get("repetition_penalty"),
            presence_penalty=dev.get("presence_penalty"),
            frequency_penalty=dev.get("frequency_penalty"),
            prompt_tokens=dev.get("prompt_tokens"), output_tokens=dev.get("output_tokens"),
            penalty_rows=dev.get("penalty_rows"),
            bias=(dev["bias_rows"], dev["bias_tokens"], dev["bias_values"]) if bias_pairs else None,
            allowed_bitmask=dev.get("allowed_bitmask"), bad_words=pair("bad_rows", "bad_tokens"),
            min_tokens=pair("min_rows", "min_tokens"), bitmask=bitmask,
            bitmask_rows=dev.get("bitmask_rows"),
            seeded=dev["seeded"], seed_keys=dev["seed_keys"], any_seeded=any(seeded_l),
            max_num_logprobs=max(asked) if asked else None, logprob_rows=dev.get("logprob_rows"),
            logprob_changed_rows=dev.get("logprob_changed_rows"),
            # the caller's lists, not copies (copying 256 prompts costs milliseconds a step):
            # read-only for stages, and valid for this step only
            params=list(params), prompt_token_ids=list(prompt_token_ids),
            output_token_ids=list(output_token_ids), eos_token_ids=list(eos_token_ids),
        )

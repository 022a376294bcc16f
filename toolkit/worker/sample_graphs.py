"""The LM head and the sampler's fused tail as one CUDA graph per row bucket.

After the forward, a plain step still launched the LM head and the sampler from Python: about
twenty kernels (eight of them Triton, each 20-40 us of host time) for 0.1-0.3 ms of GPU work.
That is most of a millisecond of host time in every step (`benchmarks/host_parts.py`
measures it without a profiler), and the nano workload's decode steps wait on the host.

When the sampler says a step's sampling is its fused tail alone (`Sampler.graph_tail`: a
fixed sequence of kernels over per-row tensors, no host decision), the rows are padded to a
bucket Bp and the LM head and that tail replay from a graph captured once per (Bp, which
per-row tensors are present). Static buffers, shared by every bucket (they replay one at a
time on one stream):
- hidden [R, H] (R: the largest bucket), filled by one index_select of the rows that sample;
- logits [R, V] float32, written by the LM head inside the graph;
- one [R] buffer per per-row tensor (temperature, greedy, min_p, top_k, top_p, keys), copied
  in when the step's metadata object changes; the keys every step.
Padding rows read whatever an earlier step left there: finite hidden states and valid
parameters, whose tokens nobody reads. A step the tail does not cover (logprobs, penalties,
a grammar, top-k, all greedy) samples as before.
"""

from __future__ import annotations

import logging
import time

import torch

from toolkit.worker.cuda_graphs import buckets, capture_graph

log = logging.getLogger(__name__)

# what a padding row holds before any step wrote it (a valid sampling row)
_PAD = {"temperature": 1.0, "greedy": True, "min_p": 0.0, "top_k": 0, "top_p": 1.0, "keys": 0}


class SampleGraphs:
    """One job: a plain step's tokens from its hidden states, by graph replay (module doc)."""

    def __init__(self, model, sampler, max_rows: int, device: torch.device) -> None:
        self.model, self.sampler, self.device = model, sampler, device
        self.sizes = buckets(max_rows)
        most = self.sizes[-1]
        self.hidden = torch.zeros(most, model.spec.hidden_size, dtype=model.spec.dtype, device=device)
        self.logits = torch.zeros(most, model.spec.vocab_size, dtype=torch.float32, device=device)
        self.rows: dict[str, torch.Tensor] = {}     # per-row tensor name -> static [R]
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.failed: set[tuple] = set()
        self.pool = torch.cuda.graph_pool_handle()
        self._filled = None                # the metadata whose rows the buffers hold
        self.num_replays = 0
        self.capture_s = 0.0

    @torch.inference_mode()
    def sample(self, hidden: torch.Tensor, logits_indices: torch.Tensor, meta,
               generator: torch.Generator | None = None) -> torch.Tensor | None:
        """Tokens int64 [N] of the rows hidden[logits_indices] (hidden [T, H]), or None when
        the sampler's tail does not cover this step (nothing launched) or its capture failed
        (then the caller samples eagerly; the static buffers' new rows are harmless)."""
        n = meta.num_rows
        if n > self.sizes[-1]:
            return None
        tail = self.sampler.graph_tail(meta, generator)
        if tail is None:
            return None
        fn, rows = tail
        bp = next(b for b in self.sizes if b >= n)
        key = (bp, fn) + tuple(name for name, t in rows.items() if t is not None)
        if key in self.failed:
            return None
        torch.index_select(hidden, 0, logits_indices, out=self.hidden[:n])
        if meta is not self._filled:       # a steady decode reuses its metadata object
            for name, t in rows.items():
                if t is not None and name != "keys":
                    self._buffer(name, t)[:n].copy_(t)
            self._filled = meta
        self._buffer("keys", rows["keys"])[:n].copy_(rows["keys"])
        graph = self.graphs.get(key) or self._capture(key, bp, fn, rows)
        if graph is None:
            self._filled = None
            return None
        graph[0].replay()
        self.num_replays += 1
        return graph[1][:n].clone()       # the next replay overwrites the graph's output

    def _buffer(self, name: str, like: torch.Tensor) -> torch.Tensor:
        buf = self.rows.get(name)
        if buf is None:                    # allocated once: a captured graph keeps its address
            buf = torch.full((self.sizes[-1],), _PAD[name], dtype=like.dtype, device=self.device)
            self.rows[name] = buf
        return buf

    def _capture(self, key: tuple, bp: int, fn, rows: dict) -> tuple | None:
        """Capture LM head + fn over bucket bp's static rows (run once eagerly first: it
        compiles, and capture itself executes nothing)."""
        start = time.perf_counter()
        args = {name: (self.rows[name][:bp] if t is not None else None) for name, t in rows.items()}
        hidden, logits = self.hidden[:bp], self.logits[:bp]

        def run() -> torch.Tensor:                          # [bp] tokens
            self.model.compute_logits(hidden, out=logits)
            return fn(logits, **args)

        run()
        try:
            self.graphs[key] = capture_graph(run, self.pool)
        except Exception as e:           # stay eager for this key, say why
            log.warning("CUDA-graph capture of the LM head and sampler for %d rows failed (%s); "
                        "those steps sample eagerly", bp, e)
            self.failed.add(key)
            return None
        self.capture_s += time.perf_counter() - start
        return self.graphs[key]

"""Piecewise CUDA graphs for small steps (vLLM's approach, without a compiler).

A decode step launches a few hundred small kernels; from Python that takes far longer than
the GPU needs to run them. Everything but attention is per token, so for a step of T tokens
(padded up to a bucket size Bp with one-token pad sequences that write nothing) the model's
forward is captured once as L + 1 graphs: everything between two attention calls is one
graph, and attention itself runs eagerly between replays, because its work table depends on
the step's sequence layout (planned once per step, as always). Decodes, draft verification
(1 + k tokens per request) and small prefill chunks all replay the same graphs.

Capture trick: while the forward is captured, the model sees a proxy attention whose
write_kv launches the cache writer on a static slot buffer (so it is captured), and whose
run() ends the current graph, remembers (layer, q, out) and begins the next graph. Replay:
graph 0, attention(0), graph 1, ..., attention(L-1), graph L.

Memory: every bucket's pieces are captured into one pool, on one side stream, and what a
piece allocates and drops is reused by the pieces and buckets captured after it (they never
replay at the same time). Two per-layer tensors outlive their piece: q, which attention reads
after the piece, and attention's output, which the next piece reads. Kept as they were (one
of each per layer per bucket), they would cost 224 KiB a token of every bucket for
Qwen3-0.6B (28 layers x 8 KiB): 0.8 GiB for the buckets to 512 tokens, 11.5 GiB to 8192.
So each attention output is a view of one buffer shared by every layer and bucket (a piece
has read it before the next attention writes it), and the call keeps a weak view of q
(`weak_view`): its memory goes back to the pool once the model drops q (inside the next
piece's capture), for what is allocated after that, which runs after attention has read it.
With both, graphs to 8192 tokens reserve about half a GiB more than graphs to 512
(docs/decisions/0002-cuda-graphs-for-every-step.md; `benchmarks/capture_size.py`).

Full graphs: a backend that declares `supports_static_decode` (Triton) can also run a decode
step's attention over fixed-capacity tables (attention/static_plan.py), so each bucket gets
a second capture of the whole forward, attention included: one replay per step. A step uses
it when its schedule fits the bucket's tables (every sequence in the decode class: decodes,
draft verification, short chunks); otherwise the pieces replay as above.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from toolkit.kernels.reference_model import KVWrite

log = logging.getLogger(__name__)


def supports_graphs(attention) -> bool:
    """Graphs need an attention backend whose run() writes into a given `out` buffer: one that
    declares `supports_run_out = True` (AttentionBackend, attention/base.py; default False)."""
    return bool(getattr(attention, "supports_run_out", False))


def capture_graph(fn, pool, stream: torch.cuda.Stream | None = None) -> tuple[torch.cuda.CUDAGraph, object]:
    """fn() captured as one CUDA graph in `pool`, on a side stream (`stream`, or a new one),
    synchronized before and after; returns (the graph, what fn returned: its static outputs).
    Raises what the capture raised (the side stream is joined either way)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = stream if stream is not None else torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=pool)
            try:
                out = fn()
            except BaseException:
                end_failed_capture(graph)
                raise
            graph.capture_end()
    finally:
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
    return graph, out


def end_failed_capture(graph: torch.cuda.CUDAGraph) -> None:
    """After an op inside graph's capture raised (one CUDA cannot capture, e.g. a host sync):
    end the capture, which CUDA has invalidated, and stop the caching allocator from routing
    the stream's allocations to the graph's pool. torch's capture_end raises on an invalid
    capture before it does the second, and the pool would then refuse every later capture
    ("beginAllocateToPool: already recording to mempool_id")."""
    if torch.cuda.is_current_stream_capturing():
        try:
            graph.capture_end()
        except RuntimeError:               # the invalidated capture: ended, the pool not released
            pass
    try:
        torch._C._cuda_endAllocateToPool(torch.cuda.current_device(), graph.pool())
    except RuntimeError:                   # capture_end released it already
        pass


def weak_view(t: torch.Tensor) -> torch.Tensor:
    """A CUDA tensor over t's memory that does not keep that memory allocated (what vLLM's
    piecewise graphs call a weak-ref tensor), made through the CUDA array interface, which
    wraps a device pointer without owning it. t: contiguous. Use it only while something
    else guarantees the memory's contents: here, the replay order of one stream."""
    if not t.is_cuda or not t.is_contiguous():
        raise ValueError(f"weak_view needs a contiguous CUDA tensor, got {t.device} with strides "
                         f"{t.stride()}")

    class _Memory:                      # the interface's owner object: a pointer and a size
        __cuda_array_interface__ = {"shape": (t.numel() * t.element_size(),), "typestr": "|u1",
                                    "data": (t.data_ptr(), False), "version": 2}

    return torch.as_tensor(_Memory(), device=t.device).view(t.dtype).view(t.shape)


def buckets(max_tokens: int) -> list[int]:
    """Token-count buckets: fine steps where decode batches live (16 apart to 256, 64 apart to
    512), then four a doubling (a step pads by at most a quarter of its size below 512 more
    tokens: 1024 + 256 k to 2048, 2048 + 512 k to 4096, ...), and max_tokens itself."""
    sizes = [1, 2, 4, 8] + list(range(16, 257, 16)) + list(range(320, 513, 64))
    lo = 512
    while lo < max_tokens:
        sizes += list(range(lo + lo // 4, 2 * lo + 1, lo // 4))
        lo *= 2
    return sorted({b for b in sizes if b < max_tokens} | {max_tokens})


def whole_forward_buckets(sizes: list[int], full_tokens: int | None) -> list[int]:
    """The buckets that get whole-forward graphs: up to the first that holds full_tokens (a
    decode step of full_tokens tokens pads into it), all of them for None."""
    last = sizes[-1] if full_tokens is None else next((b for b in sizes if b >= full_tokens), sizes[-1])
    return [b for b in sizes if b <= last]


@dataclass
class _Graph:
    ids: torch.Tensor                      # int64 [Bp]  static inputs
    positions: torch.Tensor                # int64 [Bp]
    slots: torch.Tensor                    # int64 [Bp]
    pieces: list = field(default_factory=list)        # L + 1 CUDAGraphs
    calls: list = field(default_factory=list)         # (layer, q, out) between pieces
    hidden: torch.Tensor | None = None     # [Bp, hidden] output of the last piece
    # the whole forward over the static decode tables, per launch shape ("direct", "split"):
    # (graph, its output hidden [Bp, hidden])
    full: dict = field(default_factory=dict)


class _StaticSlots:
    """The cache writes of a capture proxy (self.real: the backend, self.graph: the _Graph): on
    the graph's static slot buffer, through write_kv or the rotary launch (an fp8 cache: with
    the layer's scales). The captured attention reads the cache only, so kv_written keeps
    nothing."""

    supports_fused_kv_write = True

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        from toolkit.kernels import dispatch

        cache = self.real.kv_cache
        dispatch.write_kv(k, v, cache[layer], self.graph.slots, *cache.scales(layer))

    def kv_target(self, layer: int, v: torch.Tensor) -> KVWrite:
        cache = self.real.kv_cache
        return KVWrite(v, cache[layer], self.graph.slots, *cache.scales(layer))

    def kv_written(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        pass


class _CaptureProxy(_StaticSlots):
    """Stands in for the attention backend while the forward is being captured. shared_out(q):
    the view of the attention output every layer and bucket shares (module doc)."""

    def __init__(self, real, graph: _Graph, pool, shared_out) -> None:
        self.real, self.graph, self.pool, self.shared_out = real, graph, pool, shared_out
        self.num_heads, self.num_kv_heads, self.head_dim = real.num_heads, real.num_kv_heads, real.head_dim
        self.current = torch.cuda.CUDAGraph()
        self.current.capture_begin(pool=pool)

    def run(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        self.current.capture_end()
        self.graph.pieces.append(self.current)
        out = self.shared_out(q)
        # q's memory goes back to the pool when the model drops q (its attention layer returns,
        # inside the next piece's capture); attention reads it before that piece replays
        self.graph.calls.append((layer, weak_view(q), out))
        self.current = torch.cuda.CUDAGraph()
        self.current.capture_begin(pool=self.pool)
        return out

    def finish(self, hidden: torch.Tensor) -> None:
        self.current.capture_end()
        self.graph.pieces.append(self.current)
        self.graph.hidden = hidden


class _FullProxy(_StaticSlots):
    """Stands in for the attention backend while a whole forward is captured: attention over
    the bucket's static decode tables, captured like every other kernel."""

    def __init__(self, real, graph: _Graph, plans, bucket: int, mode: str) -> None:
        self.real, self.graph, self.plans, self.bucket, self.mode = real, graph, plans, bucket, mode
        self.num_heads, self.num_kv_heads, self.head_dim = real.num_heads, real.num_kv_heads, real.head_dim

    def run(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        self.real.run_static(layer, q, out, self.plans, self.bucket, self.mode)
        return out


class StepGraphs:
    def __init__(self, model, attention, max_tokens: int, device: torch.device,
                 full_tokens: int | None = None) -> None:
        """Buckets up to max_tokens; whole-forward graphs (decode attention inside) for the
        buckets up to the first that holds full_tokens (None: all of them). A bucket above
        the largest decode step never holds a step whose every sequence decodes: pieces alone
        there."""
        self.model, self.attention, self.device = model, attention, device
        self.sizes = buckets(max_tokens)
        self.graphs: dict[int, _Graph] = {}
        self.failed: set[int] = set()      # buckets whose capture raised: they run eagerly
        self.pool = torch.cuda.graph_pool_handle()
        # every capture on one side stream: the caching allocator hands a freed block of the
        # pool again only to allocations on the stream that freed it (torch.cuda.graph, too,
        # captures on one stream)
        self.stream = torch.cuda.Stream()
        # decode attention inside the graph: tables for the whole-forward buckets, allocated
        # before any capture (a graph bakes in their addresses); None: the backend cannot
        full = whole_forward_buckets(self.sizes, full_tokens)
        self.full_tokens = full[-1] if full else 0     # the decode-sized buckets end here
        self.static = (attention.static_decode_plans(full)
                       if full and getattr(attention, "supports_static_decode", False) else None)
        self._out: torch.Tensor | None = None    # [max_tokens, H, D], made at the first capture
        self.num_full_replays = 0          # steps that replayed a whole-forward graph
        self.num_piecewise_replays = 0
        self.capture_s = 0.0               # seconds in capture(), its kernel compiles excluded

    @torch.inference_mode()
    def capture(self, bp: int) -> None:
        """Capture the forward for bucket bp. Call after an eager forward of the same padded
        shape ran (it compiles the kernels; capture itself executes nothing)."""
        from toolkit.kernels.compiles import triton_compiles

        start = time.perf_counter()
        with triton_compiles(strict=False) as compiled:    # the static attention's, if any
            self._capture(bp)
        self.capture_s += time.perf_counter() - start - sum(s for _, s in compiled.values())

    def bucket(self, batch: int) -> int | None:
        """The smallest bucket that holds `batch` tokens (None: too big, or its capture failed)."""
        bp = next((b for b in self.sizes if b >= batch), None)
        return None if bp in self.failed else bp

    def captured(self, bp: int) -> bool:
        return bp in self.graphs

    def _capture(self, bp: int) -> None:
        z = dict(dtype=torch.int64, device=self.device)
        g = _Graph(torch.zeros(bp, **z), torch.zeros(bp, **z), torch.full((bp,), -1, **z))
        torch.cuda.synchronize()
        # the eager run's freed blocks back to the driver: the graphs' pool cannot take blocks
        # from the regular cache, so near a full card they would leave it nothing to allocate
        torch.cuda.empty_cache()
        stream = self.stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            proxy = None
            try:
                proxy = _CaptureProxy(self.attention, g, self.pool, self._shared_out)
                hidden = self.model.forward(g.ids, g.positions, proxy)
                proxy.finish(hidden)
            except Exception as e:   # a model op that cannot be captured: stay eager, say why
                if proxy is not None:
                    end_failed_capture(proxy.current)
                log.warning("CUDA-graph capture of a %d-token step failed (%s); it runs eagerly",
                            bp, e)
                self.failed.add(bp)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        if bp in self.failed:
            return
        if self.static is not None and bp in self.static.buckets:
            for mode in ("direct", "split"):
                self._capture_full(bp, g, mode)
        self.graphs[bp] = g
        log.info("captured CUDA graphs for %d-token steps (%d pieces; whole: %s)", bp,
                 len(g.pieces), ", ".join(g.full) or "none")

    def _shared_out(self, q: torch.Tensor) -> torch.Tensor:
        """q's rows of the attention output every layer of every bucket writes (module doc):
        [T, H, D] of one [max_tokens, H, D] buffer, made for the first q captured."""
        if self._out is None:
            self._out = torch.empty(self.sizes[-1], *q.shape[1:], dtype=q.dtype, device=self.device)
        out = self._out[: q.shape[0]]
        if out.shape != q.shape or out.dtype != q.dtype:
            raise RuntimeError(f"the shared attention output is {tuple(self._out.shape)} "
                               f"{self._out.dtype}; this capture's q is {tuple(q.shape)} {q.dtype}")
        return out

    def _capture_full(self, bp: int, g: _Graph, mode: str) -> None:
        """The whole forward of bucket bp, attention over its static tables in launch shape
        `mode`, as one graph (a failure leaves the pieces alone)."""
        tables = self.static.buckets[bp]
        tables.table.zero_()               # no-op rows: the compile run below writes nothing
        h = self.attention
        q = torch.zeros(bp, h.num_heads, h.head_dim, dtype=g.hidden.dtype, device=self.device)
        h.run_static(0, q, torch.empty_like(q), self.static, bp, mode)   # compiles outside the capture
        try:
            g.full[mode] = capture_graph(lambda: self.model.forward(
                g.ids, g.positions, _FullProxy(h, g, self.static, bp, mode)), self.pool, self.stream)
        except Exception as e:            # stay piecewise, say why
            log.warning("whole-forward CUDA-graph capture (%s) of a %d-token step failed (%s); "
                        "its decode steps replay the pieces", mode, bp, e)

    @torch.inference_mode()
    def replay(self, bp: int, ids: torch.Tensor, positions: torch.Tensor,
               slots: torch.Tensor) -> torch.Tensor:
        """ids, positions, slots: [Bp] of the padded step (attention planned for it)."""
        g = self.graphs[bp]
        g.ids.copy_(ids, non_blocking=True)
        g.positions.copy_(positions, non_blocking=True)
        g.slots.copy_(slots, non_blocking=True)
        mode = self.attention.use_static(self.static, bp) if g.full else None
        if mode in g.full:
            graph, hidden = g.full[mode]
            graph.replay()
            self.num_full_replays += 1
            return hidden
        self.num_piecewise_replays += 1
        for piece, (layer, q, out) in zip(g.pieces, g.calls):
            piece.replay()
            self.attention.run(layer, q, out=out)
        g.pieces[-1].replay()
        return g.hidden

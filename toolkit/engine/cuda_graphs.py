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
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field

import torch

log = logging.getLogger(__name__)


def supports_graphs(attention) -> bool:
    """Graphs need an attention backend whose run() writes into a given `out` buffer."""
    return "out" in inspect.signature(attention.run).parameters


def buckets(max_tokens: int) -> list[int]:
    """Token-count buckets: fine steps where decode batches live, coarser above 256."""
    sizes = [1, 2, 4, 8] + list(range(16, 257, 16)) + list(range(320, max_tokens + 1, 64))
    sizes = [b for b in sizes if b < max_tokens] + [max_tokens]
    return sorted(set(sizes))


@dataclass
class _Graph:
    ids: torch.Tensor                      # int64 [Bp]  static inputs
    positions: torch.Tensor                # int64 [Bp]
    slots: torch.Tensor                    # int64 [Bp]
    pieces: list = field(default_factory=list)        # L + 1 CUDAGraphs
    calls: list = field(default_factory=list)         # (layer, q, out) between pieces
    hidden: torch.Tensor | None = None     # [Bp, hidden] output of the last piece


class _CaptureProxy:
    """Stands in for the attention backend while the forward is being captured."""

    def __init__(self, real, graph: _Graph, pool) -> None:
        self.real, self.graph, self.pool = real, graph, pool
        for name in ("num_heads", "num_kv_heads", "head_dim", "scale", "sliding_window", "soft_cap"):
            setattr(self, name, getattr(real, name))
        self.current = torch.cuda.CUDAGraph()
        self.current.capture_begin(pool=pool)

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        from toolkit.kernels import dispatch

        dispatch.write_kv(k, v, self.real.kv_cache[layer], self.graph.slots)

    def run(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        self.current.capture_end()
        self.graph.pieces.append(self.current)
        out = torch.empty_like(q)          # outside any capture: an ordinary static buffer
        self.graph.calls.append((layer, q, out))
        self.current = torch.cuda.CUDAGraph()
        self.current.capture_begin(pool=self.pool)
        return out

    def finish(self, hidden: torch.Tensor) -> None:
        self.current.capture_end()
        self.graph.pieces.append(self.current)
        self.graph.hidden = hidden


class StepGraphs:
    def __init__(self, model, attention, max_tokens: int, device: torch.device) -> None:
        self.model, self.attention, self.device = model, attention, device
        self.sizes = buckets(max_tokens)
        self.graphs: dict[int, _Graph] = {}
        self.failed: set[int] = set()      # buckets whose capture raised: they run eagerly
        self.pool = torch.cuda.graph_pool_handle()

    def bucket(self, batch: int) -> int | None:
        """The smallest bucket that holds `batch` tokens (None: too big, or its capture failed)."""
        bp = next((b for b in self.sizes if b >= batch), None)
        return None if bp in self.failed else bp

    def captured(self, bp: int) -> bool:
        return bp in self.graphs

    @torch.inference_mode()
    def capture(self, bp: int) -> None:
        """Capture the forward for bucket bp. Call after an eager forward of the same padded
        shape ran (it compiles the kernels; capture itself executes nothing)."""
        z = dict(dtype=torch.int64, device=self.device)
        g = _Graph(torch.zeros(bp, **z), torch.zeros(bp, **z), torch.full((bp,), -1, **z))
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            proxy = None
            try:
                proxy = _CaptureProxy(self.attention, g, self.pool)
                hidden = self.model.forward(g.ids, g.positions, proxy)
                proxy.finish(hidden)
            except Exception as e:   # a model op that cannot be captured: stay eager, say why
                if proxy is not None and torch.cuda.is_current_stream_capturing():
                    try:
                        proxy.current.capture_end()
                    except Exception:  # noqa: BLE001 - the capture is invalid either way
                        pass
                log.warning("CUDA-graph capture of a %d-token step failed (%s); it runs eagerly",
                            bp, e)
                self.failed.add(bp)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        if bp in self.failed:
            return
        self.graphs[bp] = g
        log.info("captured CUDA graphs for %d-token steps (%d pieces)", bp, len(g.pieces))

    @torch.inference_mode()
    def replay(self, bp: int, ids: torch.Tensor, positions: torch.Tensor,
               slots: torch.Tensor) -> torch.Tensor:
        """ids, positions, slots: [Bp] of the padded step (attention planned for it)."""
        g = self.graphs[bp]
        g.ids.copy_(ids, non_blocking=True)
        g.positions.copy_(positions, non_blocking=True)
        g.slots.copy_(slots, non_blocking=True)
        for piece, (layer, q, out) in zip(g.pieces, g.calls):
            piece.replay()
            self.attention.run(layer, q, out=out)
        g.pieces[-1].replay()
        return g.hidden

"""TritonPagedAttention: the fast path over the paged KV cache.

plan() reads the step's small index arrays once (one device->host copy per step, not per
layer), builds the tile schedule (decode vs prefill, split-KV) and preallocates the split
buffers; run() launches the decode tiles (+ the LSE merge when split) and the prefill tiles,
and allocates nothing but its output. On a CPU without TRITON_INTERPRET=1 it runs the kernels'
pure-torch twins (toolkit.kernels.reference_attention) on the same schedule.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from toolkit.attention.common import check_geometry, check_layout, check_qkv
from toolkit.attention.schedule import Schedule, TileConfig, build_schedule, max_decode_splits
from toolkit.attention.static_plan import StaticDecodePlans
from toolkit.attention.tuning import KernelConfig, default_config
from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout
from toolkit.kernels import dispatch as kernel_dispatch
from toolkit.kernels import reference_attention
from toolkit.kernels.reference_model import KVWrite
from toolkit.transfer import to_device


def _heads_contiguous(*xs: torch.Tensor) -> bool:
    """What the TMA descriptors need: each token's heads contiguous, 16-byte aligned rows."""
    return all(x.stride(2) == 1 and x.stride(1) == x.shape[2]
               and (x.stride(0) * x.element_size()) % 16 == 0 and x.data_ptr() % 16 == 0 for x in xs)


class TritonPagedAttention:
    def __init__(self, kv_cache: KVCache, num_heads: int, head_dim: int, scale: float | None = None,
                 sliding_window: int | None = None, soft_cap: float | None = None, *,
                 config: KernelConfig | None = None, impl: str = "auto", causal: bool = True) -> None:
        """impl: "triton" (CUDA, or the CPU under TRITON_INTERPRET=1), "reference" (the kernels'
        torch twins on the same schedule) or "auto" (Triton where it can run). causal=False:
        bidirectional (encoders): a query sees every key of its sequence; each step must hold
        whole prompts (no cached prefix, no chunk: the engine's prefill_whole requests), and
        there is no sliding window."""
        check_geometry(kv_cache, num_heads, head_dim)
        if not causal and sliding_window is not None:
            raise ValueError(f"bidirectional attention (causal=False) has no sliding window, got {sliding_window}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be None or >= 1, got {sliding_window}")
        if soft_cap is not None and not soft_cap > 0:
            raise ValueError(f"soft_cap must be None or > 0, got {soft_cap}")
        self.kv_cache = kv_cache
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, kv_cache.num_kv_heads, head_dim
        self.group = num_heads // kv_cache.num_kv_heads
        self.scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
        self.sliding_window = sliding_window
        self.soft_cap = soft_cap
        self.causal = causal
        dev = kv_cache.device
        # an fp8 cache's tiles are converted to q's dtype (bf16 on CUDA): the bf16 tiles
        tile_dtype = torch.bfloat16 if kv_cache.dtype == torch.float8_e4m3fn else kv_cache.dtype
        self.config = config or default_config(tile_dtype, head_dim, self.group, dev)
        if impl not in ("auto", "triton", "reference"):
            raise ValueError(f"impl must be 'auto', 'triton' or 'reference', got {impl!r}")
        can_triton = dev.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
        if impl == "triton" and not can_triton:
            raise ValueError("impl='triton' needs a CUDA KV cache or TRITON_INTERPRET=1")
        use_triton = impl == "triton" or (impl == "auto" and can_triton)
        self._attn, self._merge = self._kernels(use_triton)
        self._use_triton = use_triton
        # prefills may attend over the step's own K/V by TMA loads (and their cached prefix, if
        # any, page by page): half types, no window / soft cap, a power-of-two head size, Triton
        own = self.config.self_prefill
        self._self_tile = own if (own is not None and use_triton and sliding_window is None
                                  and soft_cap is None and head_dim & (head_dim - 1) == 0
                                  and kv_cache.dtype in (torch.float16, torch.bfloat16)) else None
        self._plan_id = 0
        self._fresh_kv: tuple | None = None    # (layer, plan id, k, v) of this step's write_kv
        self.num_self_prefill_launches = 0     # how often run() took that path (tests, notebooks)
        self.layout: PagedKVLayout | None = None
        self.schedule: Schedule | None = None
        self._work: dict[str, torch.Tensor] | None = None
        self._counters: torch.Tensor | None = None   # int32, the fused merge's (see _tables)

    @staticmethod
    def _kernels(use_triton: bool) -> tuple[Callable[..., None], Callable[..., None]]:
        if not use_triton:
            return reference_attention.paged_attention, reference_attention.merge_attention_states
        from toolkit.kernels.merge_attention_states import merge_attention_states
        from toolkit.kernels.paged_attention import paged_attention
        return paged_attention, merge_attention_states

    def plan(self, layout: PagedKVLayout) -> None:
        check_layout(layout, self.kv_cache)
        cfg = self.config
        host = layout.host                 # the CPU copy build() kept: no device->host sync
        qo, kvp, kv = host.qo_indptr.numpy(), host.kv_indptr.numpy(), host.kv_lens.numpy()
        if not self.causal and not np.array_equal(qo[1:] - qo[:-1], kv):
            bad = int(np.flatnonzero(qo[1:] - qo[:-1] != kv)[0])
            raise ValueError(f"bidirectional attention needs whole prompts in one step; sequence {bad} has "
                             f"{int(qo[bad + 1] - qo[bad])} query tokens over {int(kv[bad])} keys "
                             f"(a chunk or a cached prefix)")
        prefill_kv = kv[(qo[1:] - qo[:-1]) > cfg.decode.block_q]
        self._prefill_tile = cfg.prefill_tile(int(prefill_kv.max()) if prefill_kv.size else 0)
        self.schedule = build_schedule(qo, kv, kvp, num_kv_heads=self.num_kv_heads, decode=cfg.decode,
                                       prefill=self._prefill_tile, window=self.sliding_window,
                                       target_programs=cfg.target_programs,
                                       min_split_tokens=cfg.min_split_tokens, max_splits=cfg.max_splits,
                                       busy_min_split_tokens=cfg.busy_min_split_tokens,
                                       causal=self.causal)
        self._work = None                  # device tables: uploaded by the first run() (a step
        self.kv_indices = layout.kv_indices   # replayed as a whole CUDA graph needs none)
        self.layout = layout
        self._plan_self_prefill(qo, kv, kvp)

    def _plan_self_prefill(self, qo: np.ndarray, kv: np.ndarray, kvp: np.ndarray) -> None:
        """Split the prefill tiles: prompts with no cached prefix, and chunks of at least one
        TMA tile (self_prefill.block_q tokens) after a cached prefix, get TMA tiles
        (`_self_rows`: own keys by TMA, the prefix gathered page by page); `_rest_rows` are the
        paged rows of the others (decodes, short chunks such as speculative verification, whose
        GQA-packed paged tiles read each prefix page once per KV head). Both are used only when
        run() has this step's k / v from write_kv; otherwise (a CUDA-graph replay, whose
        write_kv was captured) every prefill row takes the paged kernel."""
        self._plan_id += 1
        self._fresh_kv = None
        self._self_rows = self._rest_rows = None
        self._self_prefix = False
        if self._self_tile is None or not len(self.schedule.prefill):
            return
        q_lens = qo[1:] - qo[:-1]
        prefix = kv - q_lens
        own = (q_lens > self.config.decode.block_q) & ((prefix == 0) | (q_lens >= self._self_tile.block_q))
        if not own.any():
            return
        from toolkit.kernels.self_attention import tile_rows

        rows = np.asarray(self.schedule.prefill, dtype=np.int32).reshape(-1, reference_attention.WORK_COLS)
        seq = np.searchsorted(qo, rows[:, 0], side="right") - 1            # each row's sequence
        self._rest_rows = rows[~own[seq]]
        self._self_rows = tile_rows(q_lens[own], self._self_tile.block_q, starts=qo[:-1][own],
                                    prefix_lens=prefix[own], page_base=kvp[:-1][own])
        # the kernel's prefix loop is compiled in only for steps that have a cached prefix
        self._self_prefix = bool(prefix[own].any())

    def _tables(self) -> dict[str, torch.Tensor]:
        """The step's work tables on the device, and the split buffers: one host->device copy
        of [decode W | prefill W | merge rows (pairs)], staged through pinned memory (a
        pageable copy would wait for the GPU's queue: with async scheduling, for the whole
        step before; see toolkit/transfer.py)."""
        if self._work is not None:
            return self._work
        sched, dev = self.schedule, self.kv_cache.device
        merge = np.asarray(sched.merge_rows if sched.split else [], dtype=np.int32)   # not split: written directly
        own = self._self_rows is not None
        extra = (self._rest_rows, self._self_rows) if own else ([], [])
        parts = [np.asarray(x, dtype=np.int32).reshape(-1)
                 for x in (sched.decode, sched.prefill, merge, *extra)]
        # each part at a 16-byte boundary: Triton specializes a kernel on its pointers'
        # alignment, so a part at a step-dependent offset would compile a variant mid-run
        at = np.cumsum([0] + [-(-p.size // 4) * 4 for p in parts])
        flat = np.zeros(at[-1], dtype=np.int32)
        for p, a in zip(parts, at):
            flat[a:a + p.size] = p
        table = to_device(torch.from_numpy(flat), dev)
        cols = reference_attention.WORK_COLS
        self._work = {
            "decode": table[at[0]:at[0] + parts[0].size].view(-1, cols),
            "prefill": table[at[1]:at[1] + parts[1].size].view(-1, cols),
            "merge": table[at[2]:at[2] + parts[2].size].view(-1, 2),
            "prefill_rest": table[at[3]:at[3] + parts[3].size].view(-1, cols),
            "self": table[at[4]:at[4] + parts[4].size].view(-1, reference_attention.SELF_TILE_COLS),
        }
        if len(merge):
            r, s = len(merge), sched.num_splits
            self._part_out = torch.empty(r, self.num_heads, s, self.head_dim, dtype=torch.float32,
                                         device=dev)                       # [R, H, S, D]
            self._part_lse = torch.empty(r, self.num_heads, s, dtype=torch.float32, device=dev)
            if self._counters is None or self._counters.numel() < r * self.num_kv_heads:
                # the fused merge's done-counters: every launch leaves them zero, so they are
                # allocated (zeroed) only when a step needs more than any before
                self._counters = torch.zeros(2 * r * self.num_kv_heads, dtype=torch.int32, device=dev)
        else:
            self._part_out = self._part_lse = None
        return self._work

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.layout is None:
            raise RuntimeError("call plan(layout) before write_kv()")
        check_qkv(None, k, self.kv_cache[layer], self.num_heads, self.layout.num_tokens)
        check_qkv(None, v, self.kv_cache[layer], self.num_heads, self.layout.num_tokens)
        # Triton cache writer on CUDA tensors, its torch twin otherwise
        kernel_dispatch.write_kv(k, v, self.kv_cache[layer], self.layout.slot_mapping,
                                 *self.kv_cache.scales(layer))
        if self._self_rows is not None:   # this step's own K/V, for the no-prefix prefills' TMA tiles
            self._fresh_kv = (layer, self._plan_id, k, v)

    # declared capability (AttentionBackend: default False): the model's rotary launch may store
    # this step's K/V itself, at the slots kv_target hands out, and then calls kv_written
    supports_fused_kv_write = True

    def kv_target(self, layer: int, v: torch.Tensor) -> KVWrite:
        """Where this step's K/V go: layer `layer`'s cache at the step's slots, with v [T, H_kv, D]
        (the rotary kernel stores the rotated k and v there in its own launch)."""
        if self.layout is None:
            raise RuntimeError("call plan(layout) before kv_target()")
        check_qkv(None, v, self.kv_cache[layer], self.num_heads, self.layout.num_tokens)
        return KVWrite(v, self.kv_cache[layer], self.layout.slot_mapping, *self.kv_cache.scales(layer))

    def kv_written(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """The step's K/V of `layer` are in the cache (a KVWrite from kv_target): what write_kv
        keeps besides the write, this step's own k / v for the prefills' TMA tiles."""
        if self._self_rows is not None:
            self._fresh_kv = (layer, self._plan_id, k, v)

    supports_run_out = True            # declared capability: run(out=) (AttentionBackend: default False)

    def run(self, layer: int, q: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """q [T, H, D] -> out [T, H, D] (written into `out` when given: q's shape and dtype,
        last dim contiguous)."""
        if self.layout is None or self.schedule is None:
            raise RuntimeError("call plan(layout) before run()")
        cache = self.kv_cache[layer]
        check_qkv(q, None, cache, self.num_heads, self.layout.num_tokens)
        if q.stride(-1) != 1:
            raise ValueError("q's last dimension must be contiguous")
        if out is None:
            out = torch.empty_like(q)
        elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
            raise ValueError(f"out must be {tuple(q.shape)} {q.dtype} with a contiguous last dim, "
                             f"got {tuple(out.shape)} {out.dtype}")
        cfg = self.config
        k_scale, v_scale = self.kv_cache.scales(layer)
        common: dict[str, Any] = {"scale": self.scale, "soft_cap": self.soft_cap,
                                  "sliding_window": self.sliding_window, "num_q_per_kv": self.group,
                                  "k_scale": k_scale, "v_scale": v_scale, "causal": self.causal}
        work = self._tables()
        if len(self.schedule.decode):
            # the tile by launch size, split launches included (their rows are the splits);
            # warm_up() compiles the split variant of decode_many, which short warm-up steps
            # never launch (otherwise the first long decode inside generate compiles it)
            t = cfg.decode_tile(len(self.schedule.decode) * self.num_kv_heads)
            fused = self._part_out is not None and cfg.fused_merge
            merge = dict(merge_rows=work["merge"], counters=self._counters) if fused else {}
            self._attn(q, cache, self.kv_indices, work["decode"], out, self._part_out,
                       self._part_lse, block_q=t.block_q, block_n=t.block_n,
                       num_warps=t.num_warps, num_stages=t.num_stages, **common, **merge)
            if self._part_out is not None and not fused:
                self._merge(self._part_out, self._part_lse, work["merge"], out)
        fresh, self._fresh_kv = self._fresh_kv, None
        own = fresh is not None and fresh[:2] == (layer, self._plan_id) and _heads_contiguous(q, *fresh[2:])
        rows = work["prefill_rest"] if own else work["prefill"]
        if len(rows):
            t = self._prefill_tile
            self._attn(q, cache, self.kv_indices, rows, out, None, None,
                       block_q=t.block_q, block_n=t.block_n, num_warps=t.num_warps,
                       num_stages=t.num_stages, **common)
        if own:
            from toolkit.kernels.self_attention import self_attention

            t = self._self_tile
            paged = dict(kv_cache=cache, kv_indices=self.kv_indices) if self._self_prefix else {}
            self_attention(q, fresh[2], fresh[3], work["self"], out, scale=self.scale, **paged,
                           block_m=t.block_q, block_n=t.block_n, num_warps=t.num_warps,
                           num_stages=t.num_stages, causal=self.causal)
            self.num_self_prefill_launches += 1
        return out

    def warm_up(self, dtype: torch.dtype) -> None:
        """Compile what short warm-up steps cannot reach (declared; AttentionBackend: optional):
        split decode launches of each decode tile, and, when the merge is a launch of its own,
        the merge for every split count a decode may get (a long context alone in a step
        splits up to max_decode_splits ways; each power of two is its own kernel variant).
        dtype: the queries' (the model's activations)."""
        if not self._use_triton or self.kv_cache.device.type != "cuda":
            return
        from toolkit.kernels.merge_attention_states import precompile

        cfg, cache = self.config, self.kv_cache
        if not cfg.fused_merge:
            bound = max_decode_splits(target_programs=cfg.target_programs,
                                      num_kv_heads=self.num_kv_heads,
                                      min_split_tokens=cfg.min_split_tokens, max_splits=cfg.max_splits,
                                      max_tokens_per_seq=cache.num_blocks * cache.block_size)
            precompile(self.num_heads, self.head_dim, bound, dtype, cache.device)
        for t in dict.fromkeys(x for x in (cfg.decode, cfg.decode_many) if x is not None):
            self._precompile_split_decode(t, dtype)
        if self._self_tile is not None:
            self._precompile_self_prefill(dtype)

    def _precompile_split_decode(self, t: TileConfig, dtype: torch.dtype) -> None:
        """The split-mode decode kernel with tile `t` (and the fused merge, when configured), on
        one query row over one key: a long decode splits into launches of many programs
        (decode_many) or few (the default tile), and the warm-up's short decodes never split."""
        h, d, dev = self.num_heads, self.head_dim, self.kv_cache.device
        work = torch.zeros(1, reference_attention.WORK_COLS, dtype=torch.int32, device=dev)
        work[0, 1], work[0, 7] = 1, 1                      # one query token, keys [0, 1)
        q = torch.zeros(1, h, d, dtype=dtype, device=dev)
        k_scale, v_scale = self.kv_cache.scales(0)
        merge = {}
        if self.config.fused_merge:                        # row 0 (token 0) has one split
            merge = dict(merge_rows=torch.tensor([[0, 1]], dtype=torch.int32, device=dev),
                         counters=torch.zeros(self.num_kv_heads, dtype=torch.int32, device=dev))
        self._attn(q, self.kv_cache[0], torch.zeros(4, dtype=torch.int32, device=dev), work,
                   torch.empty_like(q), torch.zeros(1, h, 2, d, device=dev), torch.zeros(1, h, 2, device=dev),
                   scale=self.scale, soft_cap=self.soft_cap, sliding_window=self.sliding_window,
                   num_q_per_kv=self.group, k_scale=k_scale, v_scale=v_scale, block_q=t.block_q,
                   block_n=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages, **merge,
                   causal=self.causal)

    def _precompile_self_prefill(self, dtype: torch.dtype) -> None:
        """The TMA prefill kernel on dummy tensors laid out as the model passes them (q and k
        contiguous, v a view of the QKV projection), at token counts of both divisibilities,
        without and with the cache (steps with no cached prefix, and steps with one)."""
        from toolkit.kernels.self_attention import self_attention, tile_table

        t, h, h_kv, d = self._self_tile, self.num_heads, self.num_kv_heads, self.head_dim
        dev = self.kv_cache.device
        paged = dict(kv_cache=self.kv_cache[0], kv_indices=torch.zeros(4, dtype=torch.int32, device=dev))
        for n in (2 * t.block_q, 2 * t.block_q + 1):
            qkv = torch.zeros(n, (h + 2 * h_kv) * d, dtype=dtype, device=dev)
            q, k = torch.zeros(n, h, d, dtype=dtype, device=dev), torch.zeros(n, h_kv, d, dtype=dtype, device=dev)
            v = qkv[:, (h + h_kv) * d:].view(n, h_kv, d)
            for cache in ({}, paged) if self.causal else ({},):   # bidirectional: never a prefix
                self_attention(q, k, v, tile_table([n], t.block_q, dev), torch.empty_like(q),
                               scale=self.scale, **cache, block_m=t.block_q, block_n=t.block_n,
                               num_warps=t.num_warps, num_stages=t.num_stages, causal=self.causal)

    # -- decode attention inside a CUDA graph (attention/static_plan.py) --
    supports_static_decode = True      # declared capability (AttentionBackend: default False)

    def static_decode_plans(self, sizes: list[int]) -> StaticDecodePlans:
        """Fixed tables for CUDA-graph buckets of these token counts (allocated now, once)."""
        cfg, cache = self.config, self.kv_cache
        return StaticDecodePlans(
            sizes, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            decode_block_q=cfg.decode.block_q, target_programs=cfg.target_programs,
            min_split_tokens=cfg.min_split_tokens, max_splits=cfg.max_splits,
            max_pages=cache.num_blocks + max(sizes),
            max_tokens_per_seq=cache.num_blocks * cache.block_size,
            windowed=self.sliding_window is not None, device=cache.device)

    def use_static(self, plans: StaticDecodePlans, bucket: int) -> str | None:
        """After plan(): copy this step's schedule into the bucket's tables; returns the launch
        shape that holds it ("direct" or "split", for run_static), or None when it does not
        fit (then run() as usual)."""
        if self.schedule is None:
            raise RuntimeError("call plan(layout) before use_static()")
        return plans.fill(bucket, self.schedule, self.kv_indices)

    def run_static(self, layer: int, q: torch.Tensor, out: torch.Tensor, plans: StaticDecodePlans,
                   bucket: int, mode: str) -> None:
        """Decode attention over the bucket's tables into `out` [T, H, D]: fixed grids and
        buffers, so it can be captured. mode "direct": one work row per token's sequence,
        written directly; "split": every work row in split mode, then the merge (a sequence
        with one split is merged from one partial)."""
        if mode not in ("direct", "split"):
            raise ValueError(f"mode must be 'direct' or 'split', got {mode!r}")
        b = plans.buckets[bucket]
        split = mode == "split"
        # a fixed grid a capture bakes in: direct mode launches one row per token; split mode's
        # rows are mostly padding (work_cap), so it keeps the default tile
        t = self.config.decode if split else self.config.decode_tile(b.tokens * self.num_kv_heads)
        k_scale, v_scale = self.kv_cache.scales(layer)
        work = b.work if split else b.work[: b.tokens]
        fused = split and self.config.fused_merge
        merge = dict(merge_rows=b.merge, counters=plans.counters) if fused else {}
        self._attn(q, self.kv_cache[layer], plans.kv_indices, work, out,
                   b.part_out if split else None, b.part_lse if split else None,
                   scale=self.scale, soft_cap=self.soft_cap, sliding_window=self.sliding_window,
                   num_q_per_kv=self.group, k_scale=k_scale, v_scale=v_scale, block_q=t.block_q,
                   block_n=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages, **merge,
                   causal=self.causal)
        if split and not fused:
            self._merge(b.part_out, b.part_lse, b.merge, out)

    def __repr__(self) -> str:
        s = self.schedule
        plan = (f"{len(s.decode)} decode items x {s.num_splits} splits max, {len(s.prefill)} "
                f"prefill tiles" if s else "not planned")
        if s and self._self_rows is not None:
            plan += f" ({len(self._self_rows)} TMA prefill tiles)"
        mode = "" if self.causal else "bidirectional, "
        return (f"TritonPagedAttention(heads={self.num_heads}/{self.num_kv_heads}, d={self.head_dim}, "
                f"{mode}window={self.sliding_window}, soft_cap={self.soft_cap}, {plan})")

    def _repr_html_(self) -> str:
        from toolkit.attention.describe import attention_html

        s = self.schedule
        plan = (f"{len(s.decode)} decode items x {s.num_splits} splits max, {len(s.prefill)} "
                f"prefill tiles" if s else "not planned")
        if s and self._self_rows is not None:
            plan += f" ({len(self._self_rows)} TMA prefill tiles)"
        return attention_html(self, {"tile schedule": plan})

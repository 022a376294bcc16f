"""Paged attention on the GPU: decode bandwidth against a device copy and torch SDPA (cuDNN,
flash) on contiguous K/V; causal prefill TFLOP/s against SDPA flash and cuDNN. One process,
same inputs, random data, a correctness check of every configuration before it is timed.

    python -m benchmarks attention [--quick] [--no-sweep] [--parts prefix,decode]

Decode bytes = K/V of every visible token + q + out (what the kernel must move at least);
bandwidth = bytes / median kernel time (triton.testing.do_bench, L2 flushed between runs),
timed two ways: one call in a CUDA graph ("flush"), and a model's worth of calls in one
graph, each over its own layer of the cache, timed together and divided by the layers
("layers": rotating buffers, as a decode step's graph runs them; up to 32 layers and 4 GiB
of KV; one call's fixed cost of starting a graph and recording events is spread over them);
copy = a 4 GiB device-to-device copy, bytes read + written. Prefill FLOPs = 2 matmuls x
2 FLOP x B x H x S^2 x D / 2 (causal).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from toolkit.attention.schedule import TileConfig
from toolkit.attention.torch_ref import paged_attention_ref
from toolkit.attention.triton_paged import TritonPagedAttention
from toolkit.attention.tuning import KernelConfig, default_config
from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout

MODELS = {"llama3-8b": (32, 8, 128), "qwen3-0.6b": (16, 8, 128)}   # (H, H_kv, D)
BATCHES, CONTEXTS, BLOCK = [1, 16, 64, 256], [512, 4096, 16384], 16
PREFILL_SHAPES = [(1, 4096), (8, 1024)]             # (batch, tokens per sequence)
# chunked prefill after a long cached prefix (#21): (batch, cached prefix, new chunk); the
# chunk attends to the whole prefix and causally to itself (the mask SDPA calls lower-right)
PREFIX_SHAPES = [(1, 4096, 512), (1, 8192, 1024), (4, 2048, 512), (8, 4096, 64)]
DTYPE = torch.bfloat16
DEVICE = "cuda"
PEERS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def bench_ms(fn: Callable[[], Any]) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def graph_ms(fn: Callable[[], Any]) -> float:
    """Median GPU time of fn replayed from a CUDA graph (no Python/launch gaps), L2 flushed."""
    fn()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return bench_ms(graph.replay)


def copy_bandwidth() -> float:
    x = torch.randn(2**31 // 2, device=DEVICE, dtype=DTYPE)                # 2 GiB read, 2 GiB written
    y = torch.empty_like(x)
    ms = bench_ms(lambda: y.copy_(x))
    return 2 * x.numel() * x.element_size() / (ms * 1e-3)


def paged_case(h: int, h_kv: int, d: int, kv_lens: list[int], q_lens: list[int], seed: int,
               num_layers: int = 1):
    """Shuffled (non-contiguous) block tables over a cache of exactly the needed blocks."""
    rng = random.Random(seed)
    need = [-(-n // BLOCK) for n in kv_lens]
    cache = KVCache(num_layers, sum(need), BLOCK, h_kv, d, DTYPE, DEVICE)
    for layer in cache.layers:
        layer.normal_()
    ids = list(range(sum(need)))
    rng.shuffle(ids)
    tables, i = [], 0
    for n in need:
        tables.append(ids[i:i + n])
        i += n
    layout = PagedKVLayout.build(tables, kv_lens, q_lens, BLOCK, device=DEVICE)
    q = torch.randn(layout.num_tokens, h, d, device=DEVICE, dtype=DTYPE)
    return cache, layout, q, tables


def check_against_reference(out: torch.Tensor, q: torch.Tensor, cache: KVCache, tables: list[list[int]],
                            kv_lens: list[int], q_lens: list[int], scale: float) -> float:
    """Relative error of up to 4 sequences (first, last, two random) against the reference."""
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    picks = sorted({0, len(kv_lens) - 1, *random.Random(0).sample(range(len(kv_lens)), min(2, len(kv_lens)))})
    num = den = 0.0
    for b in picks:
        rows = slice(starts[b], starts[b + 1])
        ref = paged_attention_ref(q[rows], cache[0], tables[b], kv_lens[b], scale)
        num += float((out[rows].float() - ref).norm() ** 2)
        den += float(ref.norm() ** 2)
    err = (num / den) ** 0.5
    if not err < 2e-2:
        raise AssertionError(f"paged attention differs from the reference: rel err {err:.2e}")
    return err


def time_paged(cache, layout, q, h: int, d: int, config: KernelConfig | None) -> tuple[float, Any]:
    attn = TritonPagedAttention(cache, h, d, config=config)
    attn.plan(layout)
    out = torch.full_like(q, float("nan"))
    attn.run(0, q, out=out)
    eager = bench_ms(lambda: attn.run(0, q, out=out))
    return graph_ms(lambda: attn.run(0, q, out=out)), (attn, out, eager)


LAYERS, LAYERS_BYTES = 32, 4 << 30      # the "layers" timing: a model's calls, at most 4 GiB of KV


def num_layers_for(kv_bytes: int) -> int:
    return max(1, min(LAYERS, LAYERS_BYTES // kv_bytes))


def time_paged_layers(attn: TritonPagedAttention, q: torch.Tensor, out: torch.Tensor) -> float:
    """Per-layer time of one graph that runs every layer of the planned attention's cache in
    turn (each its own KV: nothing of the layer before is in L2)."""
    n = attn.kv_cache.num_layers

    def step() -> None:
        for layer in range(n):
            attn.run(layer, q, out=out)
    return graph_ms(step) / n


def time_sdpa_layers(q4: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor) -> dict[str, float | None]:
    """SDPA's per-layer time over L contiguous K/V layers ks, vs [L, B, H_kv, S, D] in one graph."""
    res: dict[str, float | None] = {}
    for name, backend in PEERS.items():
        try:
            with sdpa_kernel(backend):
                res[name] = graph_ms(lambda: [F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)
                                              for k, v in zip(ks, vs)]) / ks.shape[0]
        except RuntimeError as e:
            res[name] = None
            print(f"    sdpa {name} (layers): n/a ({str(e).splitlines()[0][:90]})")
    return res


TMA_TILES = {f"tma_m{m}_n{n}_w{w}_s{st}": (m, n, w, st) for m, n, w, st in
             [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (64, 64, 4, 3),
              (128, 64, 8, 4), (128, 32, 4, 4)]}


def time_self_attention(q, k, v, ref, seq_lens, h, d, bm, bn, nw, st) -> tuple[float, float]:
    """toolkit.kernels.self_attention (TMA loads of contiguous K/V) on the case's q and the same
    K/V laid out [T, H_kv, D]; its time and error against SDPA flash."""
    from toolkit.kernels.self_attention import self_attention, tile_table

    kt, vt = k.flatten(0, 1), v.flatten(0, 1)                          # [B*S, H_kv, D]
    tiles = tile_table(seq_lens, bm, DEVICE)
    out = torch.full_like(q, float("nan"))
    run = lambda: self_attention(q, kt, vt, tiles, out, scale=d ** -0.5, block_m=bm, block_n=bn,
                                 num_warps=nw, num_stages=st)
    run()
    err = float((out.float() - ref.float()).norm() / ref.float().norm())
    assert err < 2e-2, f"self_attention m{bm} n{bn} differs from SDPA flash: rel err {err:.2e}"
    return graph_ms(run), err


def time_sdpa(q4: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              mask: Any = None) -> dict[str, float | None]:
    res: dict[str, float | None] = {}
    for name, backend in PEERS.items():
        try:
            with sdpa_kernel(backend):
                if mask is not None:    # a CausalBias (lower-right) instead of is_causal
                    fn = lambda: F.scaled_dot_product_attention(q4, k, v, attn_mask=mask, enable_gqa=True)
                else:
                    fn = lambda: F.scaled_dot_product_attention(q4, k, v, is_causal=causal, enable_gqa=True)
                res[name] = graph_ms(fn)
        except RuntimeError as e:               # backend refuses the shape (recorded, not hidden)
            res[name] = None
            print(f"    sdpa {name}: n/a ({str(e).splitlines()[0][:90]})")
    return res


def pct_of_copy(ms: float | None, moved: int, copy_bw: float) -> float | None:
    return None if ms is None else 100 * moved / (ms * 1e-3) / copy_bw


def tflops(ms: float | None, flops: float) -> float | None:
    return None if ms is None else flops / (ms * 1e-3) / 1e12


def decode_variants(base: KernelConfig, sms: int, names: set[str] | None = None) -> dict[str, KernelConfig]:
    """The sweep's launch configs by name (all, or those in `names`; "default" always)."""
    out = _decode_variants(base, sms)
    return {k: v for k, v in out.items() if names is None or k == "default" or k in names}


def _decode_variants(base: KernelConfig, sms: int) -> dict[str, KernelConfig]:
    out = {"default": base, "nosplit": replace(base, target_programs=0),
           "unfused": replace(base, fused_merge=False),            # the split merge as its own launch
           "old_split_rule": replace(base, max_splits=0, busy_min_split_tokens=0),   # before 2026-12-02 (c)
           "split2x": replace(base, target_programs=2 * sms), "split8x": replace(base, target_programs=8 * sms),
           "minsplit128": replace(base, min_split_tokens=128), "minsplit512": replace(base, min_split_tokens=512)}
    # short contexts run few key steps a program: shallower tiles leave shared memory for a
    # second program per SM (128 keys x 3 stages of K and V take ~192 KB of the SM's 228)
    # 2 warps: a 16-row decode tile is one mma.sync row block per warp, where 4 warps make a
    # Hopper warpgroup whose wgmma needs 64 rows (b64 c512: 48.5 us vs 56.2, 2026-12-02)
    for bn, st, nw in [(64, 2, 4), (128, 2, 4), (128, 4, 4), (64, 3, 4), (64, 4, 4), (32, 4, 4),
                       (32, 6, 4), (64, 3, 2), (64, 2, 2), (64, 4, 2), (128, 2, 2), (128, 3, 2),
                       (32, 4, 2), (32, 6, 2), (64, 3, 1), (32, 4, 1),
                       # b64 c512 is 512 programs, and at 3 per SM (32 keys x 4 stages of K and V,
                       # ~64 KB of shared memory) they take 1.3 waves: 3 stages or 16-key steps
                       # fit 4+ per SM, so the grid runs in one wave (#21: 66% of copy there)
                       (32, 3, 1), (32, 2, 1), (16, 4, 1), (16, 6, 1), (16, 8, 1), (32, 3, 2)]:
        # decode_many off: the variant's tile is what every decode launch takes
        out[f"bn{bn}_s{st}_w{nw}"] = replace(base, decode=TileConfig(base.decode.block_q, bn, nw, st),
                                             decode_many=None)
    # small batches (#21): shorter splits, more programs, shorter key steps
    for bn, min_split, target in [(64, 64, 4), (64, 128, 4), (64, 64, 8), (32, 32, 8), (64, 128, 8)]:
        out[f"bn{bn}_min{min_split}_t{target}x"] = replace(
            base, target_programs=target * sms, min_split_tokens=min_split,
            decode=TileConfig(base.decode.block_q, bn, 4, 2), decode_many=None)
    return out


def prefill_variants(base: KernelConfig, group: int) -> dict[str, KernelConfig]:
    out = {"default": base}
    for rows, bn, nw, st in [(128, 64, 4, 3), (128, 128, 8, 3), (128, 128, 4, 3), (128, 64, 8, 3),
                             (128, 128, 8, 4), (128, 32, 4, 4)]:
        out[f"m{rows}_n{bn}_w{nw}_s{st}"] = replace(
            base, prefill=TileConfig(max(1, rows // group), bn, nw, st), prefill_long=None)
    return out


def ragged_lens(batch: int, ctx: int) -> list[int]:
    """`batch` contexts uniform in [ctx / 4, 7 ctx / 4] (mean about ctx), fixed per (batch, ctx):
    the spread a running batch has (nano: prompts and outputs uniform in 100-1024), which a
    launch of equal contexts never shows (RESULTS engine core (q): its tail of long programs)."""
    rng = random.Random(batch * 7919 + ctx)
    return [rng.randint(max(1, ctx // 4), max(1, ctx * 7 // 4)) for _ in range(batch)]


def run_decode(results: dict, copy_bw: float, sweep: bool, deadline: float, batches, contexts,
               names: set[str] | None = None, ragged: bool = False) -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for model, (h, h_kv, d) in MODELS.items():
        for batch in batches:
            for ctx in contexts:
                lens = ragged_lens(batch, ctx) if ragged else [ctx] * batch
                kv_bytes = 2 * sum(lens) * h_kv * d * 2
                free, _ = torch.cuda.mem_get_info()
                if 2.2 * kv_bytes > free:
                    print(f"  skip {model} b{batch} c{ctx}: {kv_bytes / 2**30:.1f} GiB x2 does not fit")
                    continue
                n_layers = num_layers_for(kv_bytes)
                cache, layout, q, tables = paged_case(h, h_kv, d, lens, [1] * batch, batch * ctx,
                                                      num_layers=n_layers)
                scale = d ** -0.5
                moved = kv_bytes + 2 * q.numel() * q.element_size()
                base = default_config(DTYPE, d, h // h_kv, torch.device(DEVICE))
                swept = (batch, ctx) in {(64, 4096), (1, 16384), (256, 512), (1, 4096), (64, 512), (16, 4096)}
                variants = decode_variants(base, sms, names) if sweep and (
                    swept or names is not None) and model == "llama3-8b" else {"default": base}
                times = {}
                for name, cfg in variants.items():
                    if time.time() > deadline and name != "default":
                        break
                    ms, (attn, out, eager) = time_paged(cache, layout, q, h, d, cfg)
                    err = check_against_reference(out, q, cache, tables, lens, [1] * batch, scale)
                    times[name] = {"ms": ms, "layers_ms": time_paged_layers(attn, q, out), "eager_ms": eager,
                                   "splits": attn.schedule.num_splits, "err": err}
                del cache, layout, attn, out         # the paged cache's last references
                peers, peers_layers = {}, {}         # ragged: SDPA would pad every sequence, so none
                if not ragged:
                    ks = torch.randn(n_layers, batch, h_kv, ctx, d, device=DEVICE, dtype=DTYPE)
                    vs = torch.randn_like(ks)
                    q4 = q.view(batch, 1, h, d).transpose(1, 2)
                    peers = time_sdpa(q4, ks[0], vs[0], causal=False)
                    peers_layers = time_sdpa_layers(q4, ks, vs)
                    del ks, vs
                row = {"model": model, "batch": batch, "ctx": ctx, "ragged": ragged, "bytes": moved, "copy_bw": copy_bw,
                       "layers": n_layers, "toolkit_ms": times["default"]["ms"],
                       "toolkit_layers_ms": times["default"]["layers_ms"], "splits": times["default"]["splits"],
                       "err": times["default"]["err"], "peers_ms": peers, "peers_layers_ms": peers_layers,
                       "variants": times}
                row["toolkit_pct"] = pct_of_copy(row["toolkit_ms"], moved, copy_bw)
                row["toolkit_layers_pct"] = pct_of_copy(row["toolkit_layers_ms"], moved, copy_bw)
                row["peers_pct"] = {k2: pct_of_copy(v2, moved, copy_bw) for k2, v2 in peers.items()}
                row["peers_layers_pct"] = {k2: pct_of_copy(v2, moved, copy_bw) for k2, v2 in peers_layers.items()}
                results["decode"].append(row)
                pct = lambda x: "n/a" if x is None else f"{x:5.1f}%"
                print(f"  {model:11s} b{batch:<4d} c{ctx:<6d} (splits {row['splits']}, err {row['err']:.1e})  "
                      f"flush: toolkit {row['toolkit_ms'] * 1e3:7.1f} us {pct(row['toolkit_pct'])} "
                      + " ".join(f"{k2} {pct(v2)}" for k2, v2 in row["peers_pct"].items())
                      + f" | {n_layers} layers: toolkit {row['toolkit_layers_ms'] * 1e3:7.1f} us "
                      f"{pct(row['toolkit_layers_pct'])} "
                      + " ".join(f"{k2} {pct(v2)}" for k2, v2 in row["peers_layers_pct"].items()), flush=True)
                for name, t in times.items():
                    if name != "default":
                        print(f"      {name:22s} flush {pct(pct_of_copy(t['ms'], moved, copy_bw))} "
                              f"layers {pct(pct_of_copy(t['layers_ms'], moved, copy_bw))}", flush=True)
                torch.cuda.empty_cache()


def run_prefill(results: dict, sweep: bool, deadline: float) -> None:
    for model, (h, h_kv, d) in MODELS.items():
        for batch, seq in PREFILL_SHAPES:
            cache, layout, q, tables = paged_case(h, h_kv, d, [seq] * batch, [seq] * batch, seq)
            flops = 4 * batch * h * seq * seq * d / 2
            k = torch.stack([cache[0][0, t].flatten(0, 1) for t in tables])   # [B, S, H_kv, D] same data
            v = torch.stack([cache[0][1, t].flatten(0, 1) for t in tables])
            q4 = q.view(batch, seq, h, d).transpose(1, 2)                    # [B, H, S, D]
            k4, v4 = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                ref = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, enable_gqa=True)
            ref = ref.transpose(1, 2).reshape_as(q)
            base = default_config(DTYPE, d, h // h_kv, torch.device(DEVICE))
            variants = prefill_variants(base, h // h_kv) if sweep and model == "llama3-8b" else {"default": base}
            times = {}
            for name, cfg in variants.items():
                if time.time() > deadline and name != "default":
                    break
                ms, (_, out, eager) = time_paged(cache, layout, q, h, d, cfg)
                err = float((out.float() - ref.float()).norm() / ref.float().norm())
                assert err < 2e-2, f"prefill {name} differs from SDPA flash: rel err {err:.2e}"
                times[name] = {"ms": ms, "eager_ms": eager, "tflops": flops / (ms * 1e-3) / 1e12, "err": err}
            # the chunk's own K/V contiguous (as the step's QKV projection holds them): TMA loads;
            # the engine's own tile (KernelConfig.self_prefill) is always timed
            own = base.self_prefill
            engine_tile = own and f"tma_m{own.block_q}_n{own.block_n}_w{own.num_warps}_s{own.num_stages}"
            tiles = dict(TMA_TILES)
            if own is not None:
                tiles[engine_tile] = (own.block_q, own.block_n, own.num_warps, own.num_stages)
            for name, (bm, bn, nw, st) in tiles.items():
                if time.time() > deadline and name != engine_tile:
                    continue
                ms, err = time_self_attention(q, k, v, ref, [seq] * batch, h, d, bm, bn, nw, st)
                times[name] = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12, "err": err}
            peers = time_sdpa(q4.contiguous(), k4, v4, causal=True)
            row = {"model": model, "batch": batch, "seq": seq, "flops": flops, "toolkit_ms": times["default"]["ms"],
                       "toolkit_tflops": times["default"]["tflops"], "err": times["default"]["err"],
                       "engine_tile": engine_tile,
                       "engine_tflops": times[engine_tile]["tflops"] if engine_tile in times else None,
                       "peers_ms": peers, "peers_tflops": {k2: tflops(v2, flops) for k2, v2 in peers.items()}, "variants": times}
            results["prefill"].append(row)
            best = max(times.items(), key=lambda kv: kv[1]["tflops"])
            eng = row["engine_tflops"]
            print(f"  {model:11s} {batch}x{seq:<5d} paged {row['toolkit_tflops']:6.1f} TFLOP/s (err {row['err']:.1e})  "
                  + (f"engine's TMA tile {eng:6.1f}  " if eng is not None else "")
                  + "  ".join(f"{k2} {'n/a' if v2 is None else f'{v2:6.1f}'}" for k2, v2 in row["peers_tflops"].items())
                  + (f"  best variant {best[0]} {best[1]['tflops']:.1f}" if len(times) > 1 else ""), flush=True)
            del cache, layout, k, v, k4, v4
            torch.cuda.empty_cache()


def time_prefix_tma(q, k, v, tiles, kv_cache, kv_indices, ref, d, bm, bn, nw, st) -> tuple[float, float]:
    """The engine's prefill kernel on chunks after a cached prefix (own K/V by TMA, the prefix
    from the pages): its time and error against SDPA."""
    from toolkit.kernels.self_attention import self_attention

    out = torch.full_like(q, float("nan"))
    run = lambda: self_attention(q, k, v, tiles, out, scale=d ** -0.5, kv_cache=kv_cache,
                                 kv_indices=kv_indices, block_m=bm, block_n=bn, num_warps=nw,
                                 num_stages=st)
    run()
    err = float((out.float() - ref.float()).norm() / ref.float().norm())
    assert err < 2e-2, f"prefix prefill m{bm} n{bn} differs from SDPA: rel err {err:.2e}"
    return graph_ms(run), err


def run_prefix_prefill(results: dict, sweep: bool, deadline: float) -> None:
    """A chunk of new tokens after a long cached prefix: the engine's path (TMA tiles of the
    chunk's own K/V, the prefix gathered from the pages; KernelConfig.self_prefill, plus other
    tilings when sweeping) and the paged kernel alone (what such chunks took before), against
    SDPA on the same keys laid out contiguous, with the lower-right causal mask. FLOPs:
    4 B H D chunk x (prefix + (chunk + 1) / 2)."""
    from torch.nn.attention.bias import causal_lower_right

    from toolkit.kernels.self_attention import tile_table

    for model, (h, h_kv, d) in MODELS.items():
        for batch, prefix, chunk in PREFIX_SHAPES:
            n = prefix + chunk
            cache, layout, q, tables = paged_case(h, h_kv, d, [n] * batch, [chunk] * batch, n + chunk)
            flops = 4 * batch * h * d * chunk * (prefix + (chunk + 1) / 2)
            k = torch.stack([cache[0][0, t].flatten(0, 1)[:n] for t in tables])   # [B, N, H_kv, D]
            v = torch.stack([cache[0][1, t].flatten(0, 1)[:n] for t in tables])
            q4 = q.view(batch, chunk, h, d).transpose(1, 2).contiguous()       # [B, H, C, D]
            k4, v4 = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
            mask = causal_lower_right(chunk, n)
            with sdpa_kernel(SDPBackend.MATH if DEVICE == "cpu" else SDPBackend.FLASH_ATTENTION):
                ref = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, enable_gqa=True)
            ref = ref.transpose(1, 2).reshape_as(q)
            base = default_config(DTYPE, d, h // h_kv, torch.device(DEVICE))
            paged_ms, (_, out, _) = time_paged(cache, layout, q, h, d, base)
            paged_err = float((out.float() - ref.float()).norm() / ref.float().norm())
            assert paged_err < 2e-2, f"prefix prefill (paged) differs from SDPA: rel err {paged_err:.2e}"
            # the chunk's own K/V as the step's projection holds them: contiguous [B*C, H_kv, D]
            kc, vc = k[:, prefix:].flatten(0, 1), v[:, prefix:].flatten(0, 1)
            starts = [b * chunk for b in range(batch)]
            own = base.self_prefill
            engine_tile = f"tma_m{own.block_q}_n{own.block_n}_w{own.num_warps}_s{own.num_stages}"
            tilings = {engine_tile: (own.block_q, own.block_n, own.num_warps, own.num_stages)}
            if sweep:
                tilings.update(TMA_TILES)
            times = {}
            for name, (bm, bn, nw, st) in tilings.items():
                if time.time() > deadline and name != engine_tile:
                    continue
                tiles = tile_table([chunk] * batch, bm, DEVICE, starts, [prefix] * batch,
                                   layout.kv_indptr[:-1].cpu().numpy())
                ms, err = time_prefix_tma(q, kc, vc, tiles, cache[0], layout.kv_indices, ref, d, bm, bn, nw, st)
                times[name] = {"ms": ms, "tflops": tflops(ms, flops), "err": err}
            peers = time_sdpa(q4, k4, v4, causal=False, mask=mask)
            row = {"model": model, "batch": batch, "prefix": prefix, "chunk": chunk, "flops": flops,
                   "engine_tile": engine_tile, "toolkit_ms": times[engine_tile]["ms"],
                   "toolkit_tflops": times[engine_tile]["tflops"], "err": times[engine_tile]["err"],
                   "paged_ms": paged_ms, "paged_tflops": tflops(paged_ms, flops), "variants": times,
                   "peers_ms": peers, "peers_tflops": {k2: tflops(v2, flops) for k2, v2 in peers.items()}}
            results.setdefault("prefix_prefill", []).append(row)
            best = max(times.items(), key=lambda kv: kv[1]["tflops"])
            cudnn = row["peers_tflops"].get("cudnn")
            print(f"  {model:11s} {batch}x({prefix} cached + {chunk}) engine {row['toolkit_tflops']:6.1f} TFLOP/s "
                  f"(err {row['err']:.1e}; {row['toolkit_tflops'] / cudnn if cudnn else float('nan'):.2f}x cudnn)  "
                  f"paged {row['paged_tflops']:6.1f}  "
                  + "  ".join(f"{k2} {'n/a' if v2 is None else f'{v2:6.1f}'}" for k2, v2 in row["peers_tflops"].items())
                  + (f"  best tiling {best[0]} {best[1]['tflops']:.1f}" if len(times) > 1 else ""), flush=True)
            del cache, layout, k, v, k4, v4
            torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "benchmarks/results"), "attention.json"))
    ap.add_argument("--quick", action="store_true", help="batch 1/64, context 512/4096 only")
    ap.add_argument("--no-sweep", action="store_true", help="time only the default tile configs")
    ap.add_argument("--decode-only", action="store_true", help="skip the prefill comparisons")
    ap.add_argument("--parts", default="prefill,prefix,decode",
                    help="comma-separated: prefill (whole prompts), prefix (chunks after a cached prefix), decode")
    ap.add_argument("--budget-s", type=float, default=200.0, help="stop config sweeps after this long")
    ap.add_argument("--decode-batches", default=None, help="comma list of decode batch sizes (default: all)")
    ap.add_argument("--decode-contexts", default=None, help="comma list of decode contexts (default: all)")
    ap.add_argument("--ragged", action="store_true",
                    help="decode contexts uniform in [c/4, 7c/4] instead of all c (toolkit only: no peers)")
    ap.add_argument("--variants", default=None, help="comma list of decode variant names to sweep (default: all)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/attention.py needs a CUDA device")
    t0 = time.time()
    deadline = t0 + args.budget_s
    props = torch.cuda.get_device_properties(0)
    results: dict[str, Any] = {"gpu": props.name, "torch": torch.__version__, "triton": triton.__version__,
                                   "dtype": str(DTYPE), "block_size": BLOCK, "decode": [], "prefill": []}
    copy_bw = copy_bandwidth()
    results["copy_bw"] = copy_bw
    print(f"{props.name}, {props.multi_processor_count} SMs; copy {copy_bw / 1e12:.2f} TB/s", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results["default_config"] = asdict(default_config(DTYPE, 128, 4, torch.device(DEVICE)))
    parts = set(args.parts.split(",")) - ({"prefill", "prefix"} if args.decode_only else set())
    if unknown := parts - {"prefill", "prefix", "decode"}:
        raise SystemExit(f"--parts takes prefill, prefix and decode; got {sorted(unknown)}")
    if "prefill" in parts:
        print("prefill (causal, bf16):")
        run_prefill(results, not args.no_sweep, deadline)
    if "prefix" in parts:
        print("chunk after a cached prefix (bf16):")
        run_prefix_prefill(results, not args.no_sweep, deadline)
    out.write_text(json.dumps(results, indent=1))
    if "decode" in parts:
        print("decode (bf16, block 16, % of copy bandwidth):")
        batches, contexts = ([1, 64], [512, 4096]) if args.quick else (BATCHES, CONTEXTS)
        if args.decode_batches:
            batches = [int(x) for x in args.decode_batches.split(",")]
        if args.decode_contexts:
            contexts = [int(x) for x in args.decode_contexts.split(",")]
        names = set(args.variants.split(",")) if args.variants else None
        run_decode(results, copy_bw, not args.no_sweep, deadline, batches, contexts, names, ragged=args.ragged)
    results["wall_s"] = time.time() - t0
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out} ({results['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()

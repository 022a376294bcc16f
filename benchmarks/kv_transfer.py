"""The disk tier across restarts, and the KV transfer bandwidth per block (one run).

TTFT: a long shared document (--doc-tokens, 8k-32k at the Llama-3.1-8B shape, random weights,
bf16) is asked --asks times with a different short question each time, spread over
--restarts engines (a restart = a new LLM in the same process; the GPU cache starts empty).
Two modes on the same questions:
  recompute  no connector: the first ask after each restart prefills the document again
             (later asks hit the device prefix cache)
  disk       a StoreConnector over a DiskKVStore in --dir, kept across the restarts: the
             first ask after a restart loads the document's blocks from the files
Reported per mode: TTFT of the first ask after each restart (the figure the disk tier is
for), TTFT over all asks, blocks loaded from disk.

Bandwidth: the connector's copies on their own, --blocks blocks of the same shape, timed
with CUDA synchronisation: device -> host (gather + copy into pinned memory, the save's first
half), host -> file (DiskKVStore.put), file -> host (DiskKVStore.get_into a pinned buffer, the
load's read), host -> device (the load's copy),
each in GB/s, against torch's plain pinned device -> host copy of the same bytes (the
ceiling).

    python -m benchmarks kv_transfer --doc-tokens 8192,32768 --asks 100 --restarts 4
    python -m benchmarks kv_transfer --quick          # CPU check of the script, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sim_common import release_llm  # noqa: E402


def _model(args):
    if args.quick:
        from transformers import LlamaConfig

        cfg = LlamaConfig(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
                          num_key_value_heads=2, vocab_size=517, max_position_embeddings=4096,
                          eos_token_id=2, bos_token_id=1, tie_word_embeddings=False)
        return cfg, dict(dtype="float32", device="cpu", num_blocks=512, block_size=16)
    from toolkit.models.shapes import llama31_8b

    return llama31_8b(), dict(dtype="bfloat16", max_model_len=max(args.doc_tokens) + 256)


def _connector(args, shape, dtype):
    from toolkit.kv_transfer.disk_store import DiskKVStore
    from toolkit.kv_transfer.store_connector import StoreConnector

    # random weights have no folder to name them: the benchmark names the directory itself,
    # so the restarts (same seed, same weights) find the blocks
    store = DiskKVStore(Path(args.dir) / "bench", shape, dtype, int(args.disk_gb * 2**30))
    return StoreConnector(store, shape[2])


def _kv_layout(cfg, kw) -> tuple[tuple, torch.dtype]:
    """The KV block layout of this shape, [layers, 2, block_size, kv heads, head_dim], and its
    dtype, from an engine built for the purpose and released."""
    from toolkit import LLM

    torch.manual_seed(0)
    probe = LLM(cfg, **kw)
    kv = probe.engine.runner.kv_cache
    shape = (kv.num_layers, 2, kv.block_size, kv.num_kv_heads, kv.head_dim)
    dtype = kv.layers[0].dtype
    del kv                                       # no reference left to its device tensors
    release_llm(probe)
    return shape, dtype


def _ttft(engine, prompt, params) -> float:
    t = time.perf_counter()
    rid = engine.add_request(prompt, params)
    while True:
        for o in engine.step():
            if o.request_id == rid and o.outputs[0].token_ids:
                ttft = time.perf_counter() - t
                engine.abort(rid)
                while engine.has_unfinished():       # the save of its blocks, if any
                    engine.step()
                return ttft


def ttft_runs(args, doc_len: int) -> dict:
    from toolkit import LLM, SamplingParams

    cfg, kw = _model(args)
    vocab = cfg.vocab_size
    doc = [(7919 * j) % (vocab - 10) + 5 for j in range(doc_len)]
    questions = [doc + [(31 * k + j) % (vocab - 10) + 5 for j in range(16)] for k in range(args.asks)]
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    per = -(-args.asks // args.restarts)
    out = {}
    layout = None
    for mode in ("recompute", "disk"):
        shutil.rmtree(Path(args.dir) / "bench", ignore_errors=True)
        if mode == "disk" and layout is None:
            layout = _kv_layout(cfg, kw)               # the same for every restart
        first, every, loaded = [], [], 0
        for r in range(args.restarts):
            torch.manual_seed(0)
            extra = {} if mode == "recompute" else dict(kv_connector=_connector(args, *layout))
            with LLM(cfg, **kw, **extra) as llm:
                for i, q in enumerate(questions[r * per:(r + 1) * per]):
                    t = _ttft(llm.engine, q, params)
                    every.append(t)
                    if i == 0:
                        first.append(t)
                if mode == "disk":
                    loaded += llm.engine.scheduler.connector.num_loaded_blocks
            release_llm(llm)                        # its memory back before the next engine
        out[mode] = dict(first_after_restart_ms=[t * 1e3 for t in first],
                         first_after_restart_mean_ms=statistics.mean(first[1:] or first) * 1e3,
                         all_asks_mean_ms=statistics.mean(every) * 1e3, blocks_loaded=loaded)
    return out


def bandwidth(args) -> dict:
    from toolkit.kv_transfer.disk_store import DiskKVStore

    cfg, kw = _model(args)
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    dtype = torch.float32 if args.quick else torch.bfloat16
    L, H = cfg.num_hidden_layers, cfg.num_key_value_heads
    D = cfg.hidden_size // cfg.num_attention_heads
    bs = kw.get("block_size", 16)
    n = args.blocks
    layers = [torch.randn(2, n + 8, bs, H, D, device=dev, dtype=dtype) for _ in range(L)]
    idx = torch.arange(n, device=dev)
    nbytes = n * L * 2 * bs * H * D * dtype.itemsize

    def timed(fn) -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        r = fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t, r

    pin = dev.type == "cuda"

    def d2h():                     # the connector's save: gather, then one copy into pinned memory
        staged = torch.stack([x.index_select(1, idx).transpose(0, 1) for x in layers], 1)
        host = torch.empty(staged.shape, dtype=staged.dtype, pin_memory=pin)
        return host.copy_(staged, non_blocking=pin)

    t_d2h, host = timed(d2h)
    store = DiskKVStore(Path(args.dir) / "bw", host.shape[1:], dtype, nbytes * 2, persistent=False)
    t_put, _ = timed(lambda: [store.put(f"b{i}", host[i]) for i in range(n)])

    def get():                     # the connector's load: each file read into one pinned buffer
        out = torch.empty(host.shape, dtype=dtype, pin_memory=pin)
        for i in range(n):
            store.get_into(f"b{i}", out[i])
        return out

    t_get, back = timed(get)
    assert torch.equal(back, host)

    def h2d():
        b = back.to(dev)
        for i, x in enumerate(layers):
            x.index_copy_(1, idx, b[:, i].transpose(0, 1))

    t_h2d, _ = timed(h2d)
    flat = torch.randn(nbytes // 2, device=dev, dtype=torch.bfloat16)
    pinned = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=dev.type == "cuda")
    t_ceiling, _ = timed(lambda: pinned.copy_(flat, non_blocking=True))
    store.close()
    gbps = lambda t: nbytes / t / 1e9
    return dict(blocks=n, block_bytes=nbytes // n, device_to_host_gbps=gbps(t_d2h), host_to_file_gbps=gbps(t_put),
                file_to_host_gbps=gbps(t_get), host_to_device_gbps=gbps(t_h2d),
                pinned_copy_ceiling_gbps=gbps(t_ceiling))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny random Llama on the CPU")
    ap.add_argument("--doc-tokens", default="8192,16384,32768")
    ap.add_argument("--asks", type=int, default=100)
    ap.add_argument("--restarts", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=512, help="blocks in the bandwidth test")
    ap.add_argument("--disk-gb", type=float, default=64.0)
    ap.add_argument("--dir", default=None, help="the disk tier's directory (default: a temporary one)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.doc_tokens = [int(x) for x in args.doc_tokens.split(",")]
    if args.quick:
        args.doc_tokens, args.asks, args.restarts, args.blocks = [512], 6, 2, 32
    tmp = None
    if args.dir is None:
        tmp = args.dir = tempfile.mkdtemp(prefix="kv-bench-")
    try:
        result = dict(ttft={str(n): ttft_runs(args, n) for n in args.doc_tokens}, bandwidth=bandwidth(args))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""Serving benchmark, like vLLM's `bench serve`: ShareGPT requests with Poisson arrivals
through HTTP streaming, and the same requests through AsyncEngine directly and through
LLM.generate, all on one engine in one run.

    python -m benchmarks serving --shape llama8b --num 300 --rates inf,4,8      # the H200
    python -m benchmarks serving --shape tiny --num 16 --rates inf,8             # a CPU check

Layout: one process builds the engine (random weights at the shape) and serves it with
uvicorn on a thread, as `python -m toolkit.serve` does; the HTTP client runs in a child
process (`serving.py client ...`), so its parsing does not share the server's GIL. The
client streams /v1/completions with token-id prompts, ignore_eos and max_tokens = the
request's ShareGPT output length, and measures per request: TTFT (send -> first chunk),
TPOT ((e2e - TTFT) / (tokens - 1)), ITL (gaps between chunks), e2e.
Without a tokenizer of the shape's vocabulary, no text is detokenised on any path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from typing import Any


# -- the requests --
def load_requests(path: str, n: int, vocab: int, max_output: int | None) -> list[tuple[list[int], int]]:
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)["requests"][:n]
        reqs = [([t % vocab for t in r["prompt_ids"]], r["output_len"]) for r in data]
    else:                                           # labelled in the output: not ShareGPT
        print(f"[serving] {path} not found: random lengths (prompt 4-1024, output 4-512)", flush=True)
        rng = random.Random(0)
        reqs = [([rng.randrange(vocab) for _ in range(rng.randint(4, 1024))], rng.randint(4, 512))
                for _ in range(n)]
    if max_output:
        reqs = [(p, min(o, max_output)) for p, o in reqs]
    return reqs


def arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """Send times (s from start): Poisson at `rate` requests/s, all at 0 for inf."""
    if rate == float("inf"):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def summarize(records: list[dict], duration: float) -> dict[str, Any]:
    """vLLM bench serve's figures from per-request records {ttft, e2e, tokens, itl: [...]}."""
    def pct(xs: list[float], q: float) -> float:
        if not xs:
            return float("nan")
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]

    ttft = [r["ttft"] * 1e3 for r in records]
    tpot = [(r["e2e"] - r["ttft"]) / (r["tokens"] - 1) * 1e3 for r in records if r["tokens"] > 1]
    itl = [x * 1e3 for r in records for x in r["itl"]]
    toks = sum(r["tokens"] for r in records)
    return dict(requests=len(records), duration_s=duration, request_throughput=len(records) / duration,
                output_tok_s=toks / duration, output_tokens=toks,
                ttft_ms=dict(mean=statistics.fmean(ttft), p50=pct(ttft, 50), p99=pct(ttft, 99)),
                tpot_ms=dict(mean=statistics.fmean(tpot) if tpot else float("nan"), p50=pct(tpot, 50),
                             p99=pct(tpot, 99)),
                itl_ms=dict(mean=statistics.fmean(itl) if itl else float("nan"), p50=pct(itl, 50),
                            p99=pct(itl, 99)))


def record(t0: float, times: list[float], tokens: int) -> dict:
    """One request's figures from its send time and the arrival times of its chunks."""
    return dict(ttft=times[0] - t0, e2e=times[-1] - t0, tokens=tokens,
                itl=[b - a for a, b in zip(times, times[1:])])


# -- HTTP client (asyncio streams: no client library needed on the GPU machine) --
async def sse_post(host: str, port: int, path: str, body: dict):
    """POST and yield each server-sent event's data (bytes), HTTP/1.1 chunked."""
    payload = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection(host, port, limit=2**22)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
    await writer.drain()
    status = (await reader.readline()).split()
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    if status[1] != b"200":
        raise RuntimeError(f"HTTP {status[1].decode()}: {(await reader.read()).decode()[:300]}")
    buf = b""
    try:
        while True:
            size = int((await reader.readline()).strip() or b"0", 16)
            if size == 0:
                return
            buf += await reader.readexactly(size)
            await reader.readexactly(2)
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if event.startswith(b"data: "):
                    yield event[6:]
    finally:
        writer.close()


async def run_http(url: str, model: str, reqs, rate: float) -> dict:
    host, port = url.removeprefix("http://").split(":")
    records: list[dict] = []

    async def one(delay: float, prompt: list[int], out_len: int, start: float) -> None:
        await asyncio.sleep(max(0.0, start + delay - time.perf_counter()))
        t0 = time.perf_counter()
        body = dict(model=model, prompt=prompt, max_tokens=out_len, temperature=0.0, ignore_eos=True,
                    stream=True, stream_options={"include_usage": True})
        times, tokens = [], 0
        async for data in sse_post(host, int(port), "/v1/completions", body):
            if data == b"[DONE]":
                break
            msg = json.loads(data)
            if msg.get("usage"):
                tokens = msg["usage"]["completion_tokens"]
            if msg.get("choices"):
                times.append(time.perf_counter())
        records.append(record(t0, times, tokens))

    start = time.perf_counter()
    await asyncio.gather(*(one(d, p, o, start) for d, (p, o) in zip(arrivals(len(reqs), rate), reqs)))
    return summarize(records, time.perf_counter() - start)


async def run_direct(engine, reqs, rate: float) -> dict:
    """The same requests through AsyncEngine.generate (no HTTP)."""
    from toolkit import SamplingParams

    records: list[dict] = []

    async def one(delay: float, prompt: list[int], out_len: int, start: float) -> None:
        await asyncio.sleep(max(0.0, start + delay - time.perf_counter()))
        t0 = time.perf_counter()
        times, tokens = [], 0
        sp = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
        async for out in engine.generate(prompt, sp):
            times.append(time.perf_counter())
            tokens += sum(len(c.token_ids) for c in out.outputs)
        records.append(record(t0, times, tokens))

    start = time.perf_counter()
    await asyncio.gather(*(one(d, p, o, start) for d, (p, o) in zip(arrivals(len(reqs), rate), reqs)))
    return summarize(records, time.perf_counter() - start)


def client_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", required=True, help="a JSON file of [[prompt_ids, output_len], ...]")
    ap.add_argument("--rate", type=float, required=True)
    a = ap.parse_args(argv)
    with open(a.requests) as f:
        reqs = json.load(f)
    print(json.dumps(asyncio.run(run_http(a.url, a.model, reqs, a.rate))))


# -- the run --
def build_args(shape: str) -> tuple:
    """(model, options) of LLM(model, **options) for a shape: random weights."""
    import torch
    from transformers import LlamaConfig

    from toolkit.models.shapes import llama31_8b, qwen3_0_6b

    if shape == "tiny":
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=1000, max_position_embeddings=4096)
        return cfg, dict(num_blocks=2048, block_size=16, max_num_seqs=64)
    cfg = llama31_8b() if shape == "llama8b" else qwen3_0_6b()
    dev = torch.cuda.is_available()
    return cfg, dict(dtype="bfloat16" if dev else "float32", max_num_seqs=256, max_num_batched_tokens=8192,
                     gpu_memory_utilization=0.85, max_model_len=4096)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        return client_main(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=["tiny", "qwen3", "llama8b"], default="llama8b")
    ap.add_argument("--data", default="benchmarks/data/sharegpt.json")
    ap.add_argument("--num", type=int, default=300)
    ap.add_argument("--max-output", type=int, default=None, help="cap output lengths (CPU checks)")
    ap.add_argument("--rates", default="inf,4,8", help="requests/s, comma separated; inf = all at once")
    ap.add_argument("--port", type=int, default=18431)
    ap.add_argument("--cores", default="thread,process",
                    help="where AsyncEngine runs the engine: thread (this process), process (its own)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from toolkit import LLM, SamplingParams
    from toolkit.entrypoints.async_engine import AsyncEngine

    t0 = time.perf_counter()
    cfg, options = build_args(args.shape)
    llm = LLM(cfg, **options)
    reqs = load_requests(args.data, args.num, cfg.vocab_size, args.max_output)
    results: dict[str, Any] = dict(shape=args.shape, num=len(reqs), startup_s=time.perf_counter() - t0,
                                   data=args.data if os.path.exists(args.data) else "random")
    # warm: the kernels and graphs of these requests' shapes compile on first use (cold
    # machine: tens of seconds), so a slice of them runs once before anything is timed
    warm = reqs[:64]
    llm.generate([p for p, _ in warm], SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)

    # 1. LLM.generate: the ceiling the serving paths are measured against
    t = time.perf_counter()
    outs = llm.generate([p for p, _ in reqs], [SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True)
                                               for _, o in reqs], use_tqdm=False)
    dt = time.perf_counter() - t
    toks = sum(len(o.outputs[0].token_ids) for o in outs)
    results["generate"] = dict(duration_s=dt, output_tokens=toks, output_tok_s=toks / dt)
    save(args.out, results)
    print(f"[generate] {toks} tokens in {dt:.1f} s = {toks / dt:.0f} tok/s", flush=True)

    rates = [float(r) for r in args.rates.split(",")]
    req_file = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"serving_reqs_{os.getpid()}.json")
    with open(req_file, "w") as f:
        json.dump(reqs, f)
    for core in args.cores.split(","):
        if core == "thread":
            engine = AsyncEngine(llm)
        else:                           # the engine in its own process: free this one's GPU memory
            llm.close()
            engine = AsyncEngine.build(cfg, process=True, **options)
            for p, _ in reqs[:64]:             # the same warm-up as the in-process engine had
                engine.add(p, SamplingParams(max_tokens=16, ignore_eos=True))
            while engine.num_unfinished:
                time.sleep(0.05)
        results[core] = serve_and_measure(engine, reqs, rates, args, req_file, results)
        engine.close()
        inf = str(float("inf"))
        gen = results["generate"]["output_tok_s"]
        if inf in results[core]["http"]:
            results[core]["http_over_generate"] = results[core]["http"][inf]["output_tok_s"] / gen
            results[core]["direct_over_generate"] = results[core]["direct"][inf]["output_tok_s"] / gen
            print(f"[{core} ratio] rate inf: HTTP / generate = {results[core]['http_over_generate']:.3f}, "
                  f"AsyncEngine / generate = {results[core]['direct_over_generate']:.3f}", flush=True)
        save(args.out, results)


def serve_and_measure(engine, reqs, rates: list[float], args, req_file: str, results: dict) -> dict:
    """Each rate through AsyncEngine directly, then through HTTP (uvicorn on a thread here,
    the client in a child process)."""
    import uvicorn

    from toolkit.serving.app import build_app

    tag = "process" if engine.engine is None else "thread"
    out: dict[str, dict] = {"direct": {}, "http": {}}
    for rate in rates:
        r = asyncio.run(run_direct(engine, reqs, rate))
        out["direct"][str(rate)] = r
        print(f"[{tag} direct rate={rate}] {r['output_tok_s']:.0f} tok/s, TTFT p50 {r['ttft_ms']['p50']:.1f} ms, "
              f"TPOT p50 {r['tpot_ms']['p50']:.2f} ms", flush=True)
    server = uvicorn.Server(uvicorn.Config(build_app(engine, model_name="bench", close_engine=False),
                                           host="127.0.0.1", port=args.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    for rate in rates:
        proc = subprocess.run([sys.executable, __file__, "client", "--url", f"http://127.0.0.1:{args.port}",
                               "--model", "bench", "--requests", req_file, "--rate", str(rate)],
                              capture_output=True, text=True, timeout=900)
        if proc.returncode:
            raise RuntimeError(f"client failed: {proc.stderr[-2000:]}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        out["http"][str(rate)] = r
        print(f"[{tag} http rate={rate}] {r['output_tok_s']:.0f} tok/s, TTFT p50 {r['ttft_ms']['p50']:.1f} ms "
              f"p99 {r['ttft_ms']['p99']:.1f}, TPOT p50 {r['tpot_ms']['p50']:.2f} ms, "
              f"ITL p50 {r['itl_ms']['p50']:.2f} ms p99 {r['itl_ms']['p99']:.2f}", flush=True)
    server.should_exit = True
    thread.join(timeout=30)
    return out


def save(path: str | None, results: dict) -> None:
    """Written after every phase: a run cut short keeps what it measured."""
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

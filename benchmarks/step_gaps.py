"""Where a policy's engine steps spend their stream time: kernels, or the GPU waiting for the host.

A probe for #18 (RESULTS, simulator update (h)): under vtc the engine's eager prefill steps
took 27% more stream time than fcfs's with the same features, while decode-only steps took
the same. Stream time (`StepRecord.gpu_time`) runs from an event before a step's work to the
one after its token copy, so it counts any gap in which the GPU waits for the host to launch
the next kernel. This script tells the two apart.

One process, one engine (`sim_common.build_llm`). After one unreported profiled run of the
trace (the profiler's start-up slows the first), for each policy, in the order given, the same arrivals run with fresh prompt ids: three clients, ShareGPT lengths, Poisson arrivals at
--rate req/s, as sim_gpu_all's comparisons. After --skip steps, torch.profiler records
--steps steps. For each policy it reports:
- the window's steps by kind: decode only, prefill at most graph_tokens (piecewise graphs),
  eager; with their stream time;
- the window's CUDA kernel and copy time (the union of their intervals; the profiler's own
  step ranges on the device timeline left out), against its stream time. Their difference is
  the GPU waiting on the host (under the profiler, whose per-launch cost on the host widens
  gaps: an upper bound);
- the costliest kernels per step.

    python -m benchmarks step_gaps --shape llama8b --rate 34 --policies vtc,fcfs
    python -m benchmarks step_gaps --quick        # the tiny CPU model: a check of the plumbing
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.sim_common import build_llm  # noqa: E402
from benchmarks.sim_gpu_all import CLIENT_SHARES, fresh_prompts  # noqa: E402


def step_kind(features, graph_tokens: int | None) -> str:
    """features in cost.FEATURES order."""
    from toolkit.simulator import FEATURES

    if features[FEATURES.index("eager_steps")]:
        return "eager"
    if not features[FEATURES.index("prefill_tokens")]:
        return "decode only"
    return "prefill (no graphs)" if graph_tokens is None else "prefill (graphed)"


def is_annotation(event) -> bool:
    """A user or profiler-step range on the device timeline, not a kernel or a copy."""
    return bool(getattr(event, "is_user_annotation", False)) or event.name.startswith("ProfilerStep")


def busy_seconds(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals: kernels on other streams (copies) may
    overlap the compute stream's, and time on the device is counted once."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def profile_policy(llm, trace, name: str, skip: int, steps: int) -> dict:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, schedule

    from toolkit.schedulers import resolve_policy
    from toolkit.simulator.replay import run_on_engine

    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    llm.engine.scheduler.set_policy(resolve_policy(name))
    with profile(activities=acts, schedule=schedule(wait=skip, warmup=2, active=steps, repeat=1)) as prof:
        stepper = lambda rec: prof.step()          # noqa: E731  (one profiler step an engine step)
        llm.engine.add_observer(stepper)
        try:
            real = run_on_engine(llm, trace, label=name, time_limit=300)
        finally:
            llm.engine.remove_observer(stepper)
    window = real.recording.steps[skip + 2: skip + 2 + steps]
    graph_tokens = real.recording.graph_tokens
    kinds: dict[str, dict] = {}
    for s in window:
        k = kinds.setdefault(step_kind(s.features, graph_tokens), dict(steps=0, stream_s=0.0))
        k["steps"] += 1
        k["stream_s"] += s.gpu or 0.0
    stream = sum(s.gpu or 0.0 for s in window)
    kernels: dict[str, float] = {}
    spans: list[tuple[float, float]] = []
    if cuda:
        for e in prof.events():
            # the device timeline also carries the profiler's step annotations (ProfilerStep#n,
            # each spanning a whole step): not work; counted, they doubled the kernel time
            if e.device_type != DeviceType.CUDA or is_annotation(e):
                continue
            t = e.time_range.elapsed_us() * 1e-6
            spans.append((e.time_range.start * 1e-6, e.time_range.end * 1e-6))
            kernels[e.name[:80]] = kernels.get(e.name[:80], 0.0) + t
    busy = busy_seconds(spans)
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
    s = real.summary()
    return dict(policy=name, window_steps=len(window), stream_s=stream, kernel_s=busy,
                gaps_s=stream - busy if cuda else None, kinds=kinds,
                top_kernels_ms_per_step={k: 1e3 * v / max(1, len(window)) for k, v in top},
                ttft_mean_ms=1e3 * s["ttft"]["mean"], tpot_mean_ms=1e3 * s["tpot"]["mean"])


def main() -> None:
    from toolkit.simulator import multi_client_trace, scaled_lengths, sharegpt_lengths

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama8b", help="llama8b or qwen3 (sim_common); --quick: the tiny CPU model")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rate", type=float, default=34.0, help="arrivals, req/s (34: 0.5x of call (h)'s saturation)")
    ap.add_argument("--n", type=int, default=300, help="requests a policy")
    ap.add_argument("--policies", default="vtc,fcfs")
    ap.add_argument("--skip", type=int, default=300, help="engine steps before the profiled window")
    ap.add_argument("--steps", type=int, default=600, help="engine steps profiled")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shape = "tiny" if args.quick else args.shape
    llm = build_llm(shape)
    vocab = llm.engine.model.spec.vocab_size
    lengths = sharegpt_lengths(args.n, seed=0)
    lengths = scaled_lengths(lengths, 0.5, min_len=4) if args.quick else lengths
    base = multi_client_trace(lengths, {c: f * args.rate for c, f in CLIENT_SHARES.items()},
                              vocab_size=vocab, seed=args.seed + 1)
    # the first profiled trace of a process runs slower whatever the policy (the profiler's own
    # start-up inside it; CPU: TTFT 84-131 ms against 23-44 ms for the next ones): one
    # unreported profiled trace first
    profile_policy(llm, fresh_prompts(base, args.seed + 19_999, vocab), "fcfs", args.skip, args.steps)
    rows = []
    for k, name in enumerate(args.policies.split(",")):
        t = time.perf_counter()
        r = profile_policy(llm, fresh_prompts(base, args.seed + 20_000 + k, vocab), name, args.skip, args.steps)
        rows.append(r)
        gaps = "n/a (no CUDA)" if r["gaps_s"] is None else f"{1e3 * r['gaps_s'] / max(1, r['window_steps']):.2f} ms"
        print(f"[{k}] {name}: {r['window_steps']} steps profiled; stream {1e3 * r['stream_s']:.0f} ms, kernels "
              f"{1e3 * r['kernel_s']:.0f} ms, GPU waiting on the host {gaps} a step; TTFT {r['ttft_mean_ms']:.1f} ms, "
              f"TPOT {r['tpot_mean_ms']:.2f} ms ({time.perf_counter() - t:.0f} s)", flush=True)
        for kind, v in sorted(r["kinds"].items()):
            print(f"      {kind:18s} {v['steps']:5d} steps, stream {1e3 * v['stream_s'] / max(1, v['steps']):.2f} ms a step")
        for name_k, ms in list(r["top_kernels_ms_per_step"].items())[:6]:
            print(f"      {ms:7.3f} ms/step  {name_k}")
        if args.out:        # after each policy: a timeout keeps what was done
            with open(args.out, "w") as f:
                json.dump(dict(date=time.strftime("%Y-%m-%d %H:%M"), argv=sys.argv[1:], rows=rows), f, indent=1)


if __name__ == "__main__":
    main()

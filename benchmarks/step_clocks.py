"""Step GPU time against the GPU's clocks: phases of one eager step shape and of decode steps.

#18's engine runs of one schedule differed by up to 20% in TTFT at 0.5x (RESULTS, simulator
(l)). Their decode and graphed steps took the same GPU time run to run; their eager prefill
steps did not (median 17.7 against 24.4 ms at 512-768 prompt tokens beside 40 decodes). This
probe tells the GPU (its SM clock under a power or heat limit) from the host (an eager step's
GPU time includes waits for the host to enqueue the rest of it):
- phases of eager steps (B decodes and one new P-token prompt a step, P past the CUDA graphs)
  and of decode-only steps, each for a number of seconds;
- nvidia-smi in the background every 100 ms: SM clock, power, temperature, throttle reasons;
- the first and last steps of each phase under the profiler: the kernels' busy time a step
  against the step's GPU time (equal: the device set the pace; GPU time larger: the host).
Printed per 2-second bin: the phase, median GPU / kernel ms, host work, clock, power, reasons.

    python -m benchmarks step_clocks --shape llama8b
    python -m benchmarks step_clocks --quick      # the tiny CPU model: the plumbing only
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import reduce
from operator import or_

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sim_common import build_llm, release_llm  # noqa: E402
from benchmarks.step_gaps import busy_seconds, is_annotation  # noqa: E402

SMI_FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def start_smi(path: str) -> subprocess.Popen | None:
    """nvidia-smi sampling every 100 ms into `path` (None without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return None
    return subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits",
                             "-lms", "100", "-f", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def read_smi(path: str) -> list[tuple[float, float, float, float, int]]:
    """(epoch seconds, SM MHz, watts, deg C, throttle-reason bits) per sample."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = f.read().splitlines()
    rows = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((t, float(parts[1]), float(parts[2]), float(parts[3]), int(parts[4], 16)))
        except (ValueError, IndexError):
            continue
    return rows


class Phases:
    """Runs the phases on one engine, recording each step (epoch time, phase, GPU, host work)."""

    def __init__(self, llm, decodes: int, context: int, prompt: int, profile_steps: int) -> None:
        from toolkit.simulator.replay import TraceRecorder

        self.engine = llm.engine
        self.rec = TraceRecorder(self.engine)
        self.b, self.c, self.p, self.k = decodes, context, prompt, profile_steps
        self.vocab = self.engine.model.spec.vocab_size
        self.n, self.rows, self.profiles = 0, [], []
        self.epoch0 = time.time() - time.perf_counter()      # perf_counter -> epoch

    def add(self, length: int, max_tokens: int) -> str:
        from toolkit.types import SamplingParams

        self.n += 1
        prompt = [(self.n * 7919 + i * 104729) % self.vocab for i in range(length)]
        return self.engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                                              temperature=0.0), request_id=f"clk{self.n}")

    def step(self, phase: str, eager: bool) -> None:
        if eager:
            self.add(self.p, 1)
        first = len(self.rec.steps)
        t = time.perf_counter()
        self.engine.step()
        call = time.perf_counter() - t
        landed = self.rec.steps[first:]
        # the call's own host work: its wall time less its waits for the device (0 or 2 steps may land)
        waits = sum(s.wait or 0.0 for s in landed)
        for s in landed:
            self.rows.append(dict(t=self.epoch0 + s.time, phase=phase, gpu=s.gpu, host=(call - waits) / len(landed),
                                  prefill=int(s.features[1]), decodes=int(s.features[2])))

    def profiled(self, phase: str, eager: bool, where: str) -> None:
        """k steps under the profiler (CUDA activity only: the host's pace is left as it is)."""
        import torch
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        if not torch.cuda.is_available():
            return
        first = len(self.rows)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(self.k):
                self.step(phase, eager)
            torch.cuda.synchronize()
        spans = [(e.time_range.start * 1e-6, e.time_range.end * 1e-6) for e in prof.events()
                 if e.device_type == DeviceType.CUDA and not is_annotation(e)]
        gpu = [r["gpu"] for r in self.rows[first:] if r["gpu"] is not None]
        self.profiles.append(dict(phase=phase, where=where, kernel_ms=1e3 * busy_seconds(spans) / self.k,
                                  gpu_ms=1e3 * statistics.fmean(gpu) if gpu else None))

    def run(self, phase: str, seconds: float) -> None:
        eager = phase == "eager"
        ids = [self.add(self.c, self.engine.scheduler.max_model_len - self.c - 1) for _ in range(self.b)]
        while any(r.num_computed_tokens < r.num_prompt_tokens for r in self.engine.scheduler.requests.values()):
            self.engine.step()
        self.profiled(phase, eager, "start")
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            self.step(phase, eager)
        self.profiled(phase, eager, "end")
        self.engine.abort(ids)
        while self.engine.has_unfinished():
            self.engine.step()


def bins(rows: list[dict], smi: list[tuple], width: float) -> list[dict]:
    """Per `width` seconds: the phase, steps, median GPU ms and host work, the samples' means."""
    if not rows:
        return []
    t0, out = rows[0]["t"], []
    edges = [t0 + i * width for i in range(int((rows[-1]["t"] - t0) / width) + 2)]
    for lo, hi in zip(edges, edges[1:]):
        rs = [r for r in rows if lo <= r["t"] < hi]
        gpu = [r["gpu"] for r in rs if r["gpu"] is not None]          # None on the CPU
        ss = [s for s in smi if lo <= s[0] < hi]
        if not rs:
            continue
        out.append(dict(t=lo - t0, phase=statistics.mode(r["phase"] for r in rs),   # the bin's most steps
                        steps=len(rs), gpu_ms=1e3 * statistics.median(gpu) if gpu else None,
                        host_ms=1e3 * statistics.median(r["host"] for r in rs),
                        sm_mhz=statistics.fmean(s[1] for s in ss) if ss else None,
                        watts=statistics.fmean(s[2] for s in ss) if ss else None,
                        temp_c=max(s[3] for s in ss) if ss else None,
                        reasons=f"{reduce(or_, (s[4] for s in ss), 0):#x}" if ss else None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama8b")
    ap.add_argument("--quick", action="store_true", help="the tiny CPU model, short phases")
    ap.add_argument("--phases", default="eager:40,decode:15,eager:25",
                    help="phase:seconds, comma-separated (eager or decode)")
    ap.add_argument("--decodes", type=int, default=40)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=640, help="the eager steps' prompt (past the graphs)")
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--bin-s", type=float, default=2.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    phases = [(p.split(":")[0], float(p.split(":")[1])) for p in args.phases.split(",")]
    if any(p not in ("eager", "decode") for p, _ in phases):
        raise SystemExit(f"--phases: each phase is eager:S or decode:S, got {args.phases!r}")
    if args.quick:
        args.decodes, args.context, args.prompt = 4, 32, 300
        phases = [(p, min(s, 1.0)) for p, s in phases]
    t_build = time.perf_counter()
    llm = build_llm("tiny" if args.quick else args.shape)
    print(f"engine built in {time.perf_counter() - t_build:.0f} s", flush=True)
    smi_path = os.path.join(tempfile.mkdtemp(), "smi.csv")
    smi = start_smi(smi_path)
    probe = Phases(llm, args.decodes, args.context, args.prompt, args.profile_steps)
    print(f"graphs hold {probe.rec.graph_tokens} tokens; the eager steps add a {args.prompt}-token prompt "
          f"beside {args.decodes} decodes of {args.context}-token prompts", flush=True)
    try:
        for phase, seconds in phases:
            probe.run(phase, seconds)
            print(f"  {phase} {seconds:.0f} s done ({len(probe.rows)} steps)", flush=True)
    finally:
        if smi is not None:
            smi.terminate()
            smi.wait()
        probe.rec.detach()
        release_llm(llm)
    samples = read_smi(smi_path)
    table = bins(probe.rows, samples, args.bin_s)
    print("\n     t  phase   steps  GPU ms  host ms  SM MHz  watts  deg C  reasons")
    for b in table:
        fmt = lambda v, f: "n/a" if v is None else format(v, f)       # noqa: E731
        print(f"{b['t']:6.1f}  {b['phase']:6s} {b['steps']:6d} {fmt(b['gpu_ms'], '7.2f')} {fmt(b['host_ms'], '8.2f')} "
              f"{fmt(b['sm_mhz'], '7.0f')} {fmt(b['watts'], '6.0f')} {fmt(b['temp_c'], '6.0f')}  {b['reasons']}")
    print("\nprofiled steps: phase, where, kernel busy ms a step / GPU ms a step")
    for p in probe.profiles:
        print(f"  {p['phase']:6s} {p['where']:5s} {p['kernel_ms']:7.2f} / {p['gpu_ms'] or 0:7.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(date=time.strftime("%Y-%m-%d %H:%M"), argv=sys.argv[1:], bins=table,
                           profiles=probe.profiles, steps=probe.rows, smi=samples), f)


if __name__ == "__main__":
    main()

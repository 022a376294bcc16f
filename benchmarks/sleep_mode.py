"""Sleep mode and weight updates (#51) against building a new LLM: sleep and wake times of
both levels, the device memory each frees, the first step after wake (the CUDA graphs are
captured again), and update_weights' throughput from host and from device tensors.

One process, random weights at the shape. The update's tensors are the checkpoint's (Hugging
Face names and full shapes, from transformers' model built on the meta device), drawn on the
device and copied to the host for the host case (pageable, as a trainer's CPU state dict is).

    python -m benchmarks sleep_mode --shape llama8b
    python -m benchmarks sleep_mode --shape tiny        # CPU check of the script
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sim_common import GPU_ENGINE, TINY_ENGINE, model_config, release_llm, tiny_config  # noqa: E402

PROMPTS = [[11 + i, 12, 13, 14] * 16 for i in range(8)]


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _free_gib() -> float | None:
    import torch

    return torch.cuda.mem_get_info()[0] / 2**30 if torch.cuda.is_available() else None


def _timed(fn) -> float:
    _sync()
    t = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t


def checkpoint_tensors(config, dtype, device) -> dict:
    """Random tensors with the checkpoint's names and shapes (what a trainer hands over)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config, dtype=dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    out = {}
    for name, p in meta.state_dict().items():
        out[name] = torch.empty(p.shape, dtype=dtype, device=device).normal_(0, 0.02, generator=gen)
    return out


def measure(shape: str, steps: int) -> dict:
    import torch

    from toolkit import LLM, SamplingParams

    tiny = shape == "tiny"
    config = tiny_config() if tiny else model_config(shape)
    # the device copy of the update must fit beside the engine: a smaller KV budget than usual
    settings = dict(TINY_ENGINE) if tiny else {**GPU_ENGINE, "gpu_memory_utilization": 0.45}
    sp = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)

    def generate(llm) -> float:
        return _timed(lambda: llm.generate(PROMPTS, sp, use_tqdm=False))

    t = time.perf_counter()
    llm = LLM(config, enable_sleep_mode=True, **settings)
    build_s = time.perf_counter() - t
    startup = dict(llm.engine.startup)
    steady_s = min(generate(llm) for _ in range(2))
    row: dict = dict(shape=shape, build_s=build_s, startup=startup, generate_s=steady_s, levels={})
    device = "cpu" if tiny else "cuda"
    dtype = llm.engine.model.spec.dtype
    weights_gib = sum(p.numel() * p.element_size() for p in llm.engine.model.parameters()) / 2**30
    row["weights_gib"] = weights_gib
    on_device = checkpoint_tensors(config, dtype, device)
    nbytes = sum(t.numel() * t.element_size() for t in on_device.values())
    on_host = {k: v.cpu() for k, v in on_device.items()}
    for level in (1, 2):
        free0 = _free_gib()
        sleep_s = _timed(lambda: llm.sleep(level=level))
        free1 = _free_gib()
        wake_weights_s = _timed(lambda: llm.wake_up(tags=["weights"]))
        update_s = _timed(lambda: llm.update_weights(on_host)) if level == 2 else None
        wake_kv_s = _timed(lambda: llm.wake_up(tags=["kv_cache"]))
        first_s = generate(llm)                    # the graphs are captured again here
        row["levels"][level] = dict(sleep_s=sleep_s, wake_weights_s=wake_weights_s, wake_kv_s=wake_kv_s,
                                    update_from_host_s=update_s, first_generate_s=first_s,
                                    freed_gib=None if free0 is None else free1 - free0,
                                    freed_bytes_reported=llm.engine.sleep_mode.freed_bytes)
    host_s = min(_timed(lambda: llm.update_weights(on_host)) for _ in range(2))
    device_s = min(_timed(lambda: llm.update_weights(on_device)) for _ in range(2))
    row["update"] = dict(gib=nbytes / 2**30, from_host_s=host_s, from_device_s=device_s,
                         from_host_gb_s=nbytes / host_s / 1e9, from_device_gb_s=nbytes / device_s / 1e9)
    release_llm(llm)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama8b", help="llama8b, qwen3 or tiny (CPU check)")
    ap.add_argument("--steps", type=int, default=32, help="output tokens per request of the timed generate")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    row = measure(args.shape, args.steps)
    print(f"{args.shape}: new LLM {row['build_s']:.1f} s (weights {row['weights_gib']:.1f} GiB)")
    for level, r in row["levels"].items():
        print(f"  level {level}: sleep {r['sleep_s']:.2f} s"
              + (f" (freed {r['freed_gib']:.1f} GiB)" if r["freed_gib"] is not None else "")
              + f", wake weights {r['wake_weights_s']:.2f} s, KV {r['wake_kv_s']:.2f} s"
              + (f", update from host {r['update_from_host_s']:.2f} s" if r["update_from_host_s"] else "")
              + f"; first generate {r['first_generate_s']:.2f} s against {row['generate_s']:.2f} s steady")
    u = row["update"]
    print(f"  update_weights {u['gib']:.1f} GiB: {u['from_host_gb_s']:.1f} GB/s from host, "
          f"{u['from_device_gb_s']:.1f} GB/s from device")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()

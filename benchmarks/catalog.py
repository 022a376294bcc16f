"""The benchmarks `python -m benchmarks` runs: name -> module and what it measures."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    name: str
    module: str            # benchmarks.<module>, whose main() parses sys.argv and honours --out
    what: str
    gpu: bool = True       # needs CUDA for its figures


CATALOG = {b.name: b for b in [
    Benchmark("throughput", "throughput", "offline tok/s of LLM.generate against Hugging Face "
              "continuous batching, same requests (random or ShareGPT)"),
    Benchmark("serving", "serving", "the OpenAI server and AsyncEngine against LLM.generate: "
              "tok/s, TTFT, TPOT, ITL at request rates"),
    Benchmark("attention", "attention", "paged decode and prefill attention against torch SDPA "
              "(flash, cuDNN) and the copy bandwidth"),
    Benchmark("kernels", "fused_ops", "the model's fused small ops (norms, rotary) against their torch twins"),
    Benchmark("startup", "engine_core", "LLM(...) start-up split into load, KV cache, compile and "
              "capture; async scheduling; the decode step against its roofline"),
    Benchmark("prefix_cache", "prefix_cache", "prefix caches (off, hash chain, radix, host tier) "
              "on shared-prefix traffic"),
    Benchmark("simulator", "sim_validate", "the simulator's predictions against the engine on one trace"),
    Benchmark("cpu", "cpu", "the embedded model on a CPU against Hugging Face generate", gpu=False),
    Benchmark("sampling", "sampling", "the sampler pipeline against the reference sampler"),
    Benchmark("speculative", "speculative", "n-gram and draft-model speculation: acceptance and tok/s"),
    Benchmark("structured", "structured", "grammar-constrained generation: mask cost and tok/s"),
    Benchmark("floor", "floor", "a workload's floor: every op at its roofline, as the engine would run it"),
    Benchmark("quant_gemm", "quant_gemm", "FP8 / INT8 W8A8 and W4A16 GEMMs at the Llama-3.1-8B shapes "
              "against cuBLAS bf16 and their rooflines"),
    Benchmark("quant_divergence", "quant_divergence", "quantized weights' KL and top-1 agreement against "
              "float32 on the embedded model", gpu=False),
]}

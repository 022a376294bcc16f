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
    Benchmark("kv_transfer", "kv_transfer", "a long shared document asked across restarts: TTFT "
              "with the disk tier against recompute; KV block copies in GB/s against a pinned copy"),
    Benchmark("sampling", "sampling", "the sampler pipeline against the reference sampler"),
    Benchmark("speculative", "speculative", "n-gram and draft-model speculation: acceptance and tok/s"),
    Benchmark("structured", "structured", "grammar-constrained generation: mask cost and tok/s"),
    Benchmark("replicas", "replicas", "2 data-parallel replicas of the Qwen3-0.6B shape on one GPU "
              "against 1; prefix affinity against round robin on shared-prefix traffic; router cost"),
    Benchmark("replicas_sim", "replicas_sim", "routers over 2, 4, 8 simulated replicas on ShareGPT, "
              "shared-prefix and multi-tenant traces: prefix-cache hit rate, TTFT", gpu=False),
    Benchmark("lora", "lora", "multi-LoRA: tok/s and the steady decode step with 0/1/8/32 adapters "
              "against the base model"),
    Benchmark("embed", "embed", "LLM.embed against sentence-transformers: embeddings/s (CPU: "
              "all-MiniLM-L6-v2; --device cuda: BERT-base)", gpu=False),
    Benchmark("floor", "floor", "a workload's floor: every op at its roofline, as the engine would run it"),
    Benchmark("moe", "moe", "Qwen3-30B-A3B: the fused MoE kernel against the per-expert loop and torch's "
              "grouped GEMM, the decode step against its roofline, ShareGPT against Hugging Face"),
    Benchmark("sleep_mode", "sleep_mode", "sleep / wake of both levels and update_weights GB/s "
              "against building a new LLM"),
    Benchmark("quant_gemm", "quant_gemm", "FP8 / INT8 W8A8 and W4A16 GEMMs at the Llama-3.1-8B shapes "
              "against cuBLAS bf16 and their rooflines"),
    Benchmark("quant_fusion", "quant_fusion", "RMSNorm / SiLU-and-mul fused with per-token fp8 / int8 "
              "activation quantization against the unfused pair, at the Llama-3.1-8B shapes"),
    Benchmark("quant_divergence", "quant_divergence", "quantized weights' KL and top-1 agreement against "
              "float32 on the embedded model", gpu=False),
]}

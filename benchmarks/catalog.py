"""The benchmarks `python -m benchmarks` runs: name -> module and what it measures.

`probe` entries are diagnostics, each written to answer one question (where a step's host time
goes, what a launch costs, which clock a step ran at); they stay runnable so the answer can be
checked again on another machine or version."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    name: str
    module: str            # benchmarks.<module>, whose main() parses sys.argv and honours --out
    what: str
    gpu: bool = True       # needs CUDA for its figures
    probe: bool = False    # a diagnostic, listed apart from the benchmarks
    writes_out: bool = True  # main() takes --out; False: its printed output is the record's raw


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
    Benchmark("cold_start", "cold_start", "LLM(...) from an empty Triton cache, its kernels compiled "
              "one by one against in parallel (compile_workers), and warm; each start a new process"),
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
    Benchmark("quant_decode", "quant_decode", "the steady decode step at batch 1/16/64 with fp8 and "
              "W4A16 weights against bf16, Llama-3.1-8B shape, one process"),
    Benchmark("quant_fusion", "quant_fusion", "RMSNorm / SiLU-and-mul fused with per-token fp8 / int8 "
              "activation quantization against the unfused pair, at the Llama-3.1-8B shapes"),
    Benchmark("quant_divergence", "quant_divergence", "quantized weights' KL and top-1 agreement against "
              "float32 on the embedded model", gpu=False),
    # probes
    Benchmark("blocks", "blocks", "block allocators: allocate / free / lookup / publish per second on "
              "one seeded request stream", gpu=False, probe=True),
    Benchmark("capture_size", "capture_size", "steps past the decode batch: eager, or replayed from CUDA "
              "graphs up to max_cudagraph_capture_size", probe=True),
    Benchmark("eager_host", "eager_host", "an eager step's host time, GPU time and a cProfile of its "
              "forward", probe=True),
    Benchmark("fp8_kv", "fp8_kv", "the FP8 KV cache: divergence from bf16, capacity, ShareGPT tok/s, decode "
              "bandwidth (--mode cpu runs the divergence on a CPU)", probe=True),
    Benchmark("gemm_blas", "gemm_blas", "a decode step's projections, cuBLAS against cuBLASLt and their "
              "bandwidth floor", probe=True),
    Benchmark("host_overhead", "host_overhead", "the engine's host work per step, part by part, on a tiny "
              "model", gpu=False, probe=True, writes_out=False),
    Benchmark("host_parts", "host_parts", "a steady decode step's host pieces per batch size, timed "
              "without a profiler", probe=True),
    Benchmark("launch_costs", "launch_costs", "the host cost of a graph replay, a Triton launch, a torch op "
              "and an upload", probe=True),
    Benchmark("mixed_steps", "mixed_steps", "eager mixed steps with and without the TMA prefill path",
              probe=True),
    Benchmark("ngram_acceptance", "ngram_acceptance", "real n-gram draft acceptance on an input-copying "
              "task, embedded SmolLM2, k = 1..6", gpu=False, probe=True, writes_out=False),
    Benchmark("penalty_host", "penalty_host", "host time of penalised sampling metadata: rebuilt lists "
              "against PenaltyHistory", gpu=False, probe=True),
    Benchmark("profile_step", "profile_step", "one decode step's prepare / forward / sample / update and "
              "a torch.profiler table", probe=True, writes_out=False),
    Benchmark("sim_calibrate", "sim_calibrate", "fit the simulator's cost model on the engine (writes "
              "toolkit/simulator/data/cost_models.json)", probe=True),
    Benchmark("sim_gpu_all", "sim_gpu_all", "calibrate, find saturation, then the simulator against the "
              "engine for several policies below and above it", probe=True),
    Benchmark("sim_step_models", "sim_step_models", "offline: cost models refitted to one sim_gpu_all "
              "run's per-step times (arguments: its results and raw JSON)", gpu=False, probe=True, writes_out=False),
    Benchmark("step_clocks", "step_clocks", "step GPU time beside the SM clock and the kernels' busy "
              "time", probe=True),
    Benchmark("step_gaps", "step_gaps", "a policy's engine steps: kernel time against the GPU waiting "
              "for the host", probe=True),
    Benchmark("swap_vs_recompute", "swap_vs_recompute", "swap against recompute preemption under memory "
              "pressure, long and short prompts", probe=True),
    Benchmark("tensor_parallel", "tensor_parallel", "TP=2 against TP=1 on one host: equal greedy outputs, "
              "tok/s (2 GPUs)", probe=True),
    Benchmark("transformers_backend", "transformers_backend", "the Transformers backend beside the native "
              "model file, same shape and settings", probe=True),
]}

"""Engine configuration: one dataclass, validated on creation, a reason on each field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_DTYPES = ("auto", "float32", "float16", "bfloat16")
_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
# steps up to this many tokens (or the largest decode step, if larger) replay whole-forward
# CUDA graphs when every sequence decodes (EngineConfig.full_graph_tokens)
DEFAULT_CAPTURE_TOKENS = 512


def _check(cond: bool, name: str, valid: str, value: object) -> None:
    if not cond:
        raise ValueError(f"EngineConfig.{name} must be {valid}, got {value!r}")


KERNELS = ("auto", "triton", "reference")   # EngineConfig.kernels


@dataclass
class EngineConfig:
    # dtype of weights, activations and KV cache; "auto": bf16 on CUDA, fp32 on the CPU
    dtype: str = "auto"
    # "auto": CUDA when available, else the CPU (which uses the reference kernels)
    device: str = "auto"
    # tokens per KV block; 16 is vLLM's default and what the kernels are tuned for
    block_size: int = 16
    # longest sequence (prompt + output) accepted; None = the model's own limit
    max_model_len: int | None = None
    # at most this many sequences run in one step (bounds the decode batch)
    max_num_seqs: int = 256
    # token budget of one step (prefill chunks + decodes); bounds activation memory
    max_num_batched_tokens: int = 8192
    # fraction of the GPU's free memory (after weights) given to the KV cache
    gpu_memory_utilization: float = 0.85
    # KV-cache budget in bytes on the CPU (or on the GPU when set); None = use the fraction
    kv_cache_bytes: int | None = None
    # force this many KV blocks (tests); overrides both budgets
    num_blocks: int | None = None
    # reuse the KV of shared prompt prefixes (hash chain + LRU)
    enable_prefix_caching: bool = True
    # prefill long prompts in chunks that fit the token budget next to decodes
    enable_chunked_prefill: bool = True
    # seed of the engine's default generator (requests may bring their own)
    seed: int = 0
    # replay decode steps from piecewise CUDA graphs (CUDA with the Triton backend only)
    cuda_graphs: bool = True
    # the largest step (tokens) replayed from CUDA graphs; None = max_num_batched_tokens,
    # every step. A larger step runs the model eagerly, one Python launch per kernel, at the
    # host's pace (several times a replay's time; docs/performance.md). Buckets are 16 tokens
    # apart to 256, 64 to 512, then four per doubling (cuda_graphs.buckets); steps above
    # full_graph_tokens replay L + 1 pieces with attention launched between them
    max_cudagraph_capture_size: int | None = None
    # schedule and launch step N + 1 before step N's tokens reach the host (hides the host's
    # work under the GPU's); None = on for CUDA, off on the CPU. Off with speculative decoding
    async_scheduling: bool | None = None
    # compile kernels and capture CUDA graphs inside LLM(...) (CUDA only), not in the first generate
    warmup: bool = True
    # speculative decoding: proposer name ("ngram", "draft") or None, and draft length k
    speculative: str | None = None
    num_speculative_tokens: int = 0
    # KV-cache storage: "auto" = the model's dtype; "fp8" (= "fp8_e4m3") = float8_e4m3fn with
    # one static scale per layer for K and one for V: half the bytes of bf16 a token, twice the
    # blocks in a budget; lossy (its measured cost: docs/performance.md)
    kv_cache_dtype: str = "auto"
    # fp8 scales (model value = stored value x scale): None = the checkpoint's k_scale/v_scale
    # when it has them, else calibrated at start-up (toolkit/worker/kv_scales.py); one
    # (k_scale, v_scale) pair for every layer, or a list of one pair per layer
    kv_scales: Any = None
    # scheduling policy of the continuous / static scheduler: a name ("fcfs", "priority",
    # "sjf", "sjf_output", "lpm", "vtc", "edf"), a Policy class or a Policy instance
    policy: Any = "fcfs"
    # tensor parallelism: the model split over this many processes, one per GPU (gloo
    # processes on the CPU); the KV budget and gpu_memory_utilization are per rank
    tensor_parallel_size: int = 1
    # host (CPU) tier of the KV cache, in GiB (pinned on CUDA): blocks the device prefix cache
    # evicts are kept there and copied back on a hit, and swap preemption parks a victim's
    # KV there; 0 = no host tier. host_cache_blocks (tests) gives the slot count instead
    cpu_cache_gb: float = 0.0
    host_cache_blocks: int | None = None
    # preemption when the KV cache runs out: "recompute" (free the victim's blocks, prefill it
    # again), "swap" (its KV to the host tier and back; recompute when the tier is full),
    # "auto" (swap a victim with >= schedulers.core.SWAP_MIN_TOKENS computed tokens). Without
    # a host tier every preemption recomputes
    preemption: str = "auto"
    # which code runs the model: "native" (a toolkit model file, toolkit/models/registry.py),
    # "transformers" (transformers' own modules with the toolkit's paged attention,
    # toolkit/models/transformers_backend.py; one rank only), "auto" (native where a file
    # serves config.architectures, else transformers)
    model_impl: str = "auto"
    # one switch for the whole engine's arithmetic: "auto" (Triton kernels on CUDA, lean torch
    # on the CPU), "triton" (the Triton kernels everywhere: on the CPU under TRITON_INTERPRET=1),
    # "reference" (every op's slow reference twin: the model's ops, the attention backend
    # "torch", the reference sampler, the cache copies). A part given explicitly wins.
    kernels: str = "auto"
    # quantized weights: None = the checkpoint's own quantization_config when it has one (else
    # dense); "fp8" = quantize a bf16/fp32 checkpoint at load time (per-channel fp8 weights,
    # dynamic per-token fp8 activations); "compressed-tensors" / "gptq" / "awq" / "fp8" name the
    # checkpoint's method (checked against it). Lossy: each scheme's measured cost is in
    # docs/guides/quantization.md and the engine's repr
    quantization: str | None = None

    def __post_init__(self) -> None:
        for name, kind in (("block_size", int), ("max_num_seqs", int), ("max_num_batched_tokens", int),
                           ("seed", int), ("num_speculative_tokens", int), ("max_model_len", int),
                           ("kv_cache_bytes", int), ("num_blocks", int), ("gpu_memory_utilization", float),
                           ("cpu_cache_gb", float), ("host_cache_blocks", int), ("preemption", str), ("model_impl", str), ("kernels", str),
                           ("enable_prefix_caching", bool), ("enable_chunked_prefill", bool),
                           ("cuda_graphs", bool), ("max_cudagraph_capture_size", int), ("warmup", bool), ("tensor_parallel_size", int), ("async_scheduling", bool), ("dtype", str), ("device", str), ("speculative", str)):
            v = getattr(self, name)
            optional = name in ("max_model_len", "kv_cache_bytes", "num_blocks", "speculative",
                                "async_scheduling", "host_cache_blocks", "max_cudagraph_capture_size")
            if v is None and optional:
                continue
            ok = (isinstance(v, bool) if kind is bool else isinstance(v, str) if kind is str
                  else isinstance(v, (int, float)) and not isinstance(v, bool) if kind is float
                  else isinstance(v, int) and not isinstance(v, bool))
            if not ok:
                what = {bool: "True or False", str: "a string", float: "a number", int: "an integer"}[kind]
                raise TypeError(f"EngineConfig.{name} must be {what}{' or None' if optional else ''}, "
                                f"got {type(v).__name__} {v!r}")
        _check(self.dtype in _DTYPES, "dtype", f"one of {_DTYPES}", self.dtype)
        _check(isinstance(self.block_size, int) and self.block_size in (1, 2, 4, 8, 16, 32, 64, 128),
               "block_size", "a power of two in [1, 128]", self.block_size)
        _check(self.max_model_len is None or self.max_model_len >= 1, "max_model_len", "None or >= 1",
               self.max_model_len)
        _check(self.max_num_seqs >= 1, "max_num_seqs", ">= 1", self.max_num_seqs)
        _check(self.max_num_batched_tokens >= 1, "max_num_batched_tokens", ">= 1",
               self.max_num_batched_tokens)
        _check(0.0 < self.gpu_memory_utilization <= 1.0, "gpu_memory_utilization", "in (0, 1]",
               self.gpu_memory_utilization)
        _check(self.kv_cache_bytes is None or self.kv_cache_bytes > 0, "kv_cache_bytes", "None or > 0",
               self.kv_cache_bytes)
        _check(self.num_blocks is None or self.num_blocks >= 2, "num_blocks", "None or >= 2",
               self.num_blocks)
        _check(self.num_speculative_tokens >= 0, "num_speculative_tokens", ">= 0",
               self.num_speculative_tokens)
        _check(self.max_cudagraph_capture_size is None or self.max_cudagraph_capture_size >= 1,
               "max_cudagraph_capture_size", "None or >= 1 (tokens)", self.max_cudagraph_capture_size)
        _check(self.tensor_parallel_size >= 1, "tensor_parallel_size", ">= 1", self.tensor_parallel_size)
        _check(0.0 <= self.cpu_cache_gb < float("inf"), "cpu_cache_gb", "a finite number >= 0 (GiB)",
               self.cpu_cache_gb)
        _check(self.host_cache_blocks is None or self.host_cache_blocks >= 0, "host_cache_blocks",
               "None or >= 0", self.host_cache_blocks)
        _check(self.kernels in KERNELS, "kernels", f"one of {KERNELS}", self.kernels)
        _check(self.model_impl in ("auto", "native", "transformers"), "model_impl",
               "one of ('auto', 'native', 'transformers')", self.model_impl)
        if self.model_impl == "transformers" and self.tensor_parallel_size > 1:
            raise ValueError("EngineConfig.model_impl='transformers' runs on one rank; use "
                             "model_impl='native' for tensor_parallel_size > 1")
        _check(self.preemption in ("auto", "swap", "recompute"), "preemption",
               "one of 'auto', 'swap', 'recompute'", self.preemption)
        if self.preemption == "swap" and not self.has_host_tier:
            raise ValueError("EngineConfig.preemption='swap' parks a preempted request's KV in the host "
                             "tier, which is off; set cpu_cache_gb > 0 (or host_cache_blocks > 0), or "
                             "use preemption='recompute'")
        if self.tensor_parallel_size > 1 and self.speculative == "draft":
            raise ValueError("EngineConfig.speculative='draft' is not supported with tensor_parallel_size > 1 "
                             "(the draft model is not sharded); use speculative='ngram' or "
                             "tensor_parallel_size=1")
        if isinstance(self.policy, str):
            from toolkit.schedulers.policies import POLICIES

            _check(self.policy.lower() in POLICIES, "policy", f"one of {sorted(POLICIES)}, a Policy class "
                   "or instance", self.policy)
        elif self.policy is None or isinstance(self.policy, (bool, int, float)):
            raise TypeError(f"EngineConfig.policy must be a policy name, a Policy class or instance, "
                            f"got {type(self.policy).__name__} {self.policy!r}")
        if self.speculative is not None:
            _check(self.num_speculative_tokens >= 1, "num_speculative_tokens",
                   ">= 1 when speculative is set", self.num_speculative_tokens)
        if not isinstance(self.kv_cache_dtype, str):
            raise TypeError(f"EngineConfig.kv_cache_dtype must be a string, one of {_KV_CACHE_DTYPES}, "
                            f"got {type(self.kv_cache_dtype).__name__} {self.kv_cache_dtype!r}")
        _check(self.kv_cache_dtype in _KV_CACHE_DTYPES,
               "kv_cache_dtype", f"one of {_KV_CACHE_DTYPES} ('auto' = the model's dtype)",
               self.kv_cache_dtype)
        if self.kv_scales is not None:
            from toolkit.worker.kv_scales import scale_pairs

            if self.kv_cache_dtype == "auto":
                raise ValueError("EngineConfig.kv_scales applies to an fp8 KV cache; set "
                                 "kv_cache_dtype='fp8' or leave kv_scales None")
            scale_pairs(self.kv_scales, None)     # raises on a malformed value
        if self.kv_cache_dtype != "auto" and self.tensor_parallel_size > 1:
            raise ValueError("EngineConfig.kv_cache_dtype='fp8' is not supported with "
                             "tensor_parallel_size > 1 yet; use kv_cache_dtype='auto'")
        if self.quantization is not None:
            from toolkit.models.quantization.config import ALIASES, QUANTIZATION_METHODS

            if not isinstance(self.quantization, str):
                raise TypeError(f"EngineConfig.quantization must be a string or None, got "
                                f"{type(self.quantization).__name__} {self.quantization!r}")
            _check(ALIASES.get(self.quantization, self.quantization) in QUANTIZATION_METHODS, "quantization",
                   f"None or one of {QUANTIZATION_METHODS}", self.quantization)

    @property
    def graph_tokens(self) -> int:
        """The largest step replayed from CUDA graphs (the top capture bucket), in tokens."""
        return min(self.max_num_batched_tokens, self.max_cudagraph_capture_size or self.max_num_batched_tokens)

    @property
    def full_graph_tokens(self) -> int:
        """The largest decode step that replays a whole-forward graph (decode attention inside,
        one replay a step; the buckets up to the first that holds it get one): the larger of
        512 and max_num_seqs x (1 + k), the largest decode / verification step, at most
        graph_tokens."""
        return min(self.graph_tokens, max(DEFAULT_CAPTURE_TOKENS,
                                          self.max_num_seqs * (1 + self.num_speculative_tokens)))

    @property
    def has_host_tier(self) -> bool:
        return bool(self.host_cache_blocks) if self.host_cache_blocks is not None else self.cpu_cache_gb > 0

    def resolve_device(self) -> str:
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def resolve_dtype(self):
        import torch

        if self.dtype == "auto":
            return torch.bfloat16 if self.resolve_device().startswith("cuda") else torch.float32
        return getattr(torch, self.dtype)

    def resolve_kv_cache_dtype(self):
        import torch

        return self.resolve_dtype() if self.kv_cache_dtype == "auto" else torch.float8_e4m3fn

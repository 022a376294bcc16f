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
    # the warm-up's Triton kernels compile in this many processes before it runs them
    # (toolkit/kernels/precompile.py); None = the host's cores, at most 16; 0 or 1 = one by
    # one as each is first launched
    compile_workers: int | None = 0
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
    # sampling defaults for requests that leave a field unset: "auto" (the model folder's
    # generation_config.json: temperature, top_p, top_k, min_p, repetition_penalty,
    # max_new_tokens), "vllm" (SamplingParams' own defaults), or a folder holding one
    generation_config: str = "auto"
    # LLM.sleep() / wake_up() allowed (vLLM's flag): the weights' and the KV cache's device
    # memory can be freed and brought back (toolkit/engine/sleep.py); update_weights needs no flag
    enable_sleep_mode: bool = False
    # multi-LoRA (vLLM's names): requests may name a PEFT adapter (lora_request=); at most
    # max_loras distinct adapters run in one step (device slots, the scheduler waits a request
    # whose adapter would exceed them), of rank up to max_lora_rank (slots are padded to it);
    # max_cpu_loras adapters stay read on the host (LRU; None = max_loras)
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # how pooling requests (LLM.embed / classify / score) pool: a toolkit.pooling.PoolerConfig
    # or its dict (pooling_type LAST / MEAN / CLS, normalize, classifier_from_token). None: a
    # sentence-transformers folder's modules, else the model's default (decoders: LAST, normalized)
    pooler_config: Any = None
    # [kv_transfer] a KV connector (toolkit/kv_transfer/): None; "disk" (the disk tier: a
    # finished request's full blocks saved to memory-mapped files, loaded back on a prefix
    # hit); "pd" (prefill/decode disaggregation, with kv_role); or a KVConnectorBase instance
    kv_connector: Any = None
    # prefill/decode disaggregation: "kv_producer" (prefills, hands the KV off) or
    # "kv_consumer" (loads it and decodes); None otherwise
    kv_role: str | None = None
    # the disk tier's directory, kept across restarts (setting it alone turns the disk tier
    # on); "pd": the handoff directory both engines see. None with kv_connector="disk": a
    # temporary directory deleted at close
    kv_cache_dir: str | None = None
    # size bound of the disk tier (and of a "pd" handoff directory), in GiB; LRU beyond it
    kv_cache_dir_gb: float = 4.0
    # a "pd" consumer waits this long (s) for a handoff that has not landed yet, its request
    # parked meanwhile, then recomputes it; `python -m toolkit.serve --kv-role consumer` sets
    # 10 (its proxy asks as soon as the prefill answered). 0: a missing handoff is recomputed
    kv_handoff_wait_s: float = 0.0
    # quantized weights: None = the checkpoint's own quantization_config when it has one (else
    # dense); "fp8" = quantize a bf16/fp32 checkpoint at load time (per-channel fp8 weights,
    # dynamic per-token fp8 activations); "compressed-tensors" / "gptq" / "awq" / "fp8" name the
    # checkpoint's method (checked against it). Lossy: each scheme's measured cost is in
    # docs/guides/quantization.md and the engine's repr
    quantization: str | None = None
    # bounds on what a structured-output request may ask to compile (a GrammarLimits, or a
    # dict of its fields; None: its defaults): refused at add_request with a ValueError (400)
    grammar_limits: Any = None

    def __post_init__(self) -> None:
        if self.pooler_config is not None:
            from toolkit.pooling.config import PoolerConfig

            self.pooler_config = PoolerConfig.coerce(self.pooler_config)
        for name, kind in (("block_size", int), ("max_num_seqs", int), ("max_num_batched_tokens", int),
                           ("seed", int), ("num_speculative_tokens", int), ("max_model_len", int),
                           ("kv_cache_bytes", int), ("num_blocks", int), ("gpu_memory_utilization", float),
                           ("cpu_cache_gb", float), ("host_cache_blocks", int), ("preemption", str), ("model_impl", str), ("kernels", str), ("generation_config", str),
                           ("enable_prefix_caching", bool), ("enable_chunked_prefill", bool),
                           ("cuda_graphs", bool), ("max_cudagraph_capture_size", int), ("warmup", bool), ("compile_workers", int), ("tensor_parallel_size", int), ("async_scheduling", bool), ("dtype", str), ("device", str), ("speculative", str)):
            v = getattr(self, name)
            optional = name in ("max_model_len", "kv_cache_bytes", "num_blocks", "speculative",
                                "async_scheduling", "host_cache_blocks", "max_cudagraph_capture_size",
                                "compile_workers")
            if v is None and optional:
                continue
            ok = (isinstance(v, bool) if kind is bool else isinstance(v, str) if kind is str
                  else isinstance(v, (int, float)) and not isinstance(v, bool) if kind is float
                  else isinstance(v, int) and not isinstance(v, bool))
            if not ok:
                what = {bool: "True or False", str: "a string", float: "a number", int: "an integer"}[kind]
                raise TypeError(f"EngineConfig.{name} must be {what}{' or None' if optional else ''}, "
                                f"got {type(v).__name__} {v!r}")
        if not isinstance(self.enable_sleep_mode, bool):
            raise TypeError(f"EngineConfig.enable_sleep_mode must be True or False, got "
                            f"{type(self.enable_sleep_mode).__name__} {self.enable_sleep_mode!r}")
        _check(self.dtype in _DTYPES, "dtype", f"one of {_DTYPES}", self.dtype)
        _check(isinstance(self.block_size, int) and self.block_size in (1, 2, 4, 8, 16, 32, 64, 128),
               "block_size", "a power of two in [1, 128]", self.block_size)
        _check(self.compile_workers is None or self.compile_workers >= 0, "compile_workers",
               "None or an integer >= 0", self.compile_workers)
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
        self._check_lora()
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
        self._check_kv_transfer()
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

    def _check_lora(self) -> None:
        for name in ("max_loras", "max_lora_rank", "max_cpu_loras"):
            v = getattr(self, name)
            if v is None and name == "max_cpu_loras":
                continue
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"EngineConfig.{name} must be an integer, got {type(v).__name__} {v!r}")
            _check(v >= 1, name, "an integer >= 1", v)
        if not isinstance(self.enable_lora, bool):
            raise TypeError(f"EngineConfig.enable_lora must be True or False, got {self.enable_lora!r}")
        _check(self.max_lora_rank <= 512, "max_lora_rank", "at most 512", self.max_lora_rank)
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"EngineConfig.max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras "
                             f"({self.max_loras}): every adapter in a slot is also kept on the host")
        if self.enable_lora and self.speculative == "draft":
            raise ValueError("EngineConfig.enable_lora is not supported with speculative='draft' (the draft "
                             "model shares the target's layers but not its step's adapter indices); use "
                             "speculative='ngram'")
    def _check_kv_transfer(self) -> None:
        """[kv_transfer] the connector fields (toolkit/kv_transfer/build.py builds them)."""
        c = self.kv_connector
        if isinstance(c, str):
            _check(c in ("disk", "pd"), "kv_connector", "None, 'disk', 'pd' or a KVConnectorBase instance", c)
        elif c is not None and not callable(getattr(c, "get_num_new_matched_tokens", None)):
            raise TypeError(f"EngineConfig.kv_connector must be None, 'disk', 'pd' or a KVConnectorBase "
                            f"instance, got {type(c).__name__} {c!r}")
        if c is not None and not isinstance(c, str) and self.tensor_parallel_size > 1:
            raise ValueError("EngineConfig.kv_connector: an instance cannot serve tensor_parallel_size > 1 "
                             "(every rank opens its own store over its slice of the KV heads); use "
                             "kv_connector='disk' or 'pd' with kv_cache_dir=")
        _check(self.kv_role in (None, "kv_producer", "kv_consumer"), "kv_role",
               "None, 'kv_producer' or 'kv_consumer'", self.kv_role)
        if (c == "pd") != (self.kv_role is not None) and (c is None or isinstance(c, str)):
            raise ValueError(f"EngineConfig.kv_role must be set exactly when kv_connector='pd' "
                             f"(kv_connector={c!r}, kv_role={self.kv_role!r})")
        if self.kv_cache_dir is not None and not isinstance(self.kv_cache_dir, str):
            raise TypeError(f"EngineConfig.kv_cache_dir must be a string or None, got "
                            f"{type(self.kv_cache_dir).__name__} {self.kv_cache_dir!r}")
        w = self.kv_handoff_wait_s
        _check(isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0, "kv_handoff_wait_s",
               "a number of seconds >= 0", w)
        g = self.kv_cache_dir_gb
        _check(isinstance(g, (int, float)) and not isinstance(g, bool) and g > 0, "kv_cache_dir_gb",
               "a number of GiB > 0", g)

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
    def resolved_compile_workers(self) -> int:
        """compile_workers, None resolved to the host's cores (at most 16)."""
        import os

        return self.compile_workers if self.compile_workers is not None else min(os.cpu_count() or 1, 16)

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

"""Assemble an Engine from parts given by name, class or instance."""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

import torch

from toolkit.attention.layerwise import build_attention
from toolkit.blocks.kv_cache import KVCache
from toolkit.config import EngineConfig
from toolkit.engine.engine import Engine
from toolkit.registry import create_part
from toolkit.worker.runner import Runner

log = logging.getLogger(__name__)

CPU_KV_BUDGET = 512 * 2**20   # bytes of KV cache on the CPU when no budget is given
# EngineConfig.kernels -> the model ops' implementation (toolkit/models/ops.py)
MODEL_KERNELS = {"auto": "auto", "triton": "triton", "reference": "torch"}


def _default_attention(kernels: str, device: torch.device) -> str:
    """The attention backend EngineConfig.kernels implies."""
    if kernels == "reference":
        return "torch"
    return "triton" if kernels == "triton" or device.type == "cuda" else "cpu"


def _check_policy(scheduler: Any, policy: Any) -> None:
    """A policy other than the default must have reached the scheduler (a scheduler built
    here from a class that takes `policy=`, not an instance or a class without it)."""
    from toolkit.schedulers.policies import policy_of

    if isinstance(policy, str) and policy.lower() == "fcfs":
        return
    got = policy_of(scheduler)
    name = policy.lower() if isinstance(policy, str) else None
    inner = getattr(got, "wrapped", got)           # a duck-typed policy is wrapped in Adapted
    if got is None or not (inner is policy or type(inner) is policy or getattr(got, "name", None) == name):
        raise ValueError(f"policy={policy!r} did not reach scheduler {type(scheduler).__name__} (it "
                         f"runs {got!r}); give the policy to a scheduler that takes policy= "
                         "('continuous', 'static'), or build your scheduler instance with it")


def _has_tokenizer(folder) -> bool:
    from pathlib import Path

    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    return any((Path(folder) / n).exists() for n in names)


def build_engine(model: Any = None, *, tokenizer: Any = None, allocator: Any = None,
                 scheduler: Any = "continuous", sampler: Any = "default", attention: Any = "auto",
                 proposer: Any = None, draft_model: Any = None, config: EngineConfig | None = None,
                 load_format: str = "auto") -> Engine:
    from toolkit.models import default_model_path, load_model, load_tokenizer
    from toolkit.models.base import check_model

    t0 = time.perf_counter()
    cfg = config or EngineConfig()
    device = torch.device(cfg.resolve_device())
    dtype = cfg.resolve_dtype()
    grammar_limits = _grammar_limits(cfg.grammar_limits)

    # model (+ tokenizer from the same folder)
    if model is None:
        model = default_model_path()
    folder = model if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__") else None
    executor = None
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        if tokenizer is None and _has_tokenizer(model):
            tokenizer = load_tokenizer(model)
    lora = _lora_state(cfg, model, device)   # multi-LoRA: its linear_method wraps the layers
    methods = {"linear_method": lora.linear_method()} if lora is not None else {}
    if cfg.tensor_parallel_size > 1:      # each rank loads its own shard (toolkit/parallel/)
        executor = _tensor_parallel(model, cfg, dtype, device, attention, load_format, lora)
        model = executor.model
    elif isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        model = load_model(model, dtype=dtype, device=device, load_format=load_format,
                           model_impl=cfg.model_impl, kernels=MODEL_KERNELS[cfg.kernels],
                           quantization=cfg.quantization, **methods)
    elif not hasattr(model, "forward"):   # a transformers config: random weights
        model = load_model(model, dtype=dtype, device=device, load_format="dummy",
                           model_impl=cfg.model_impl, kernels=MODEL_KERNELS[cfg.kernels],
                           quantization=cfg.quantization, **methods)
    if lora is not None and executor is None:     # TP: the executor attached rank 0's shard
        lora.attach(model)
    if isinstance(tokenizer, (str, bytes)) or hasattr(tokenizer, "__fspath__"):
        tokenizer = load_tokenizer(tokenizer)
    spec = check_model(model)
    max_model_len = min(cfg.max_model_len or spec.max_model_len, spec.max_model_len)
    if cfg.max_model_len and cfg.max_model_len > spec.max_model_len:
        log.warning("max_model_len=%d is more than the model's %d positions (its config's "
                    "max_position_embeddings): the engine uses %d", cfg.max_model_len,
                    spec.max_model_len, spec.max_model_len)
    if folder is not None:                # a sentence-transformers folder embeds at most its max_seq_length
        from toolkit.pooling.config import max_seq_length

        max_model_len = min(max_model_len, max_seq_length(folder) or max_model_len)
    loaded = time.perf_counter()
    log.info("model %s loaded in %.1f s (%s on %s, max_model_len %d)", folder or type(model).__name__,
             loaded - t0, dtype, device, max_model_len)

    # KV cache: sized after the weights are loaded
    shape = dict(num_layers=spec.num_layers, block_size=cfg.block_size,
                 num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                 dtype=cfg.resolve_kv_cache_dtype(), device=device)   # fp8: 1 byte, twice the blocks
    if executor is not None:              # every rank's share of the KV heads, as many blocks
        kv_cache = executor.kv_cache
    elif cfg.num_blocks is not None:
        kv_cache = KVCache(num_blocks=cfg.num_blocks, **shape)
    else:
        from toolkit.worker.memory_profile import activation_peak_bytes

        budget = cfg.kv_cache_bytes or (CPU_KV_BUDGET if device.type == "cpu" else None)
        peak = 0 if budget is not None else activation_peak_bytes(
            model, *_profile_step(cfg), device)
        kv_cache = KVCache.from_budget(budget_bytes=budget, gpu_memory_utilization=cfg.gpu_memory_utilization,
                                       activation_peak=peak, **shape)
    log.info("%r", kv_cache)

    if allocator is None:
        allocator = "prefix_caching" if cfg.enable_prefix_caching else "free_list"
    allocator = create_part("allocator", allocator, num_blocks=kv_cache.num_blocks, block_size=cfg.block_size)
    if (allocator.num_blocks, allocator.block_size) != (kv_cache.num_blocks, cfg.block_size):
        raise ValueError(f"the allocator has {allocator.num_blocks} blocks of {allocator.block_size} tokens "
                         f"but the KV cache {kv_cache.num_blocks} of {cfg.block_size}; build it with "
                         f"num_blocks={kv_cache.num_blocks}, block_size={cfg.block_size} (or pass "
                         f"num_blocks= to LLM, or the allocator's class or name instead)")
    connector = None
    if _wants_connector(cfg):             # [kv_transfer] toolkit/kv_transfer/build.py
        from toolkit.kv_transfer.build import build_connector, connector_scheduler

        scheduler = connector_scheduler(scheduler)
        connector = build_connector(cfg, kv_cache, folder, executor)
    scheduler = create_part(
        "scheduler", scheduler, allocator=allocator, block_size=cfg.block_size,
        # a draft model writes its k drafts' KV one step ahead: reserve their slots
        num_lookahead_tokens=cfg.num_speculative_tokens if cfg.speculative == "draft" else 0,
        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_model_len=max_model_len, enable_prefix_caching=cfg.enable_prefix_caching,
        enable_chunked_prefill=cfg.enable_chunked_prefill, policy=cfg.policy,
        **_host_tier(cfg, kv_cache, executor), **({"kv_connector": connector} if connector else {}))
    _check_policy(scheduler, cfg.policy)
    if lora is not None:
        if not getattr(scheduler, "supports_lora", False):    # declared (schedulers/core.py)
            raise ValueError(f"enable_lora needs a scheduler that keeps max_loras ('continuous'); "
                             f"{type(scheduler).__name__} does not declare supports_lora")
        from toolkit.lora.pool import AdapterPool

        scheduler.lora_pool = AdapterPool(cfg.max_loras)
    tiered = cfg.has_host_tier and getattr(scheduler, "supports_host_tier", False)   # declared (schedulers/base.py)
    host_tier = scheduler.kv.host if tiered else None
    if cfg.has_host_tier and host_tier is None:
        raise ValueError(f"cpu_cache_gb / host_cache_blocks need a scheduler that supports the host tier "
                         f"('continuous'); {type(scheduler).__name__} does not")
    if attention == "auto":               # EngineConfig.kernels picks; "torch" is the reference twin
        attention = _default_attention(cfg.kernels, device)   # encoders too: every backend has causal=False
    backend = attention                   # the name (or class) the draft model's backend reuses
    attention = (executor.attention if executor is not None else
                 build_attention(spec, partial(create_part, "attention", attention, kv_cache=kv_cache)))
    if kv_cache.is_fp8:   # static per-layer scales, set before warm-up and CUDA-graph capture
        from toolkit.worker.kv_scales import resolve_scales

        default = _default_attention(cfg.kernels, device)
        resolve_scales(kv_cache, cfg.kv_scales, folder, model, tokenizer, dtype=dtype,
                       make_attention=lambda c: build_attention(
                           spec, partial(create_part, "attention", default, kv_cache=c)))
    if sampler == "default" and cfg.kernels == "reference":
        sampler = "reference"
    sampler = create_part("sampler", sampler)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    if getattr(sampler, "generator", False) is None:   # unseeded rows draw from the engine's seed
        sampler.generator = generator
    if executor is None:                  # the model in this process: one ModelRunner here
        from toolkit.worker.executor import LocalExecutor

        executor = LocalExecutor(model, attention, kv_cache, device,
                                 copy_backend="torch" if cfg.kernels == "reference" else "auto")
    runner = Runner(model, attention, sampler, kv_cache, device, generator, executor=executor)
    runner.lora = lora
    if host_tier is not None:
        from toolkit.blocks.host_kv import HostKVCache

        runner.host_kv = HostKVCache.like(kv_cache, host_tier.num_slots)
        log.info("host tier: %r", runner.host_kv)
    if connector is not None:             # [kv_transfer] its worker side runs in the runner
        if getattr(scheduler, "connector", None) is not connector:
            connector.close()
            raise ValueError(f"scheduler {type(scheduler).__name__} did not take the KV connector; give "
                             "kv_connector to a scheduler that declares supports_kv_connector")
        from toolkit.kv_transfer.build import bind_connector

        bind_connector(cfg, connector, kv_cache, folder, executor)   # after the fp8 scales: they name its store
        runner.kv_connector = connector
    if cfg.cuda_graphs and runner.enable_cuda_graphs(cfg.graph_tokens, cfg.max_num_seqs,
                                                     full_tokens=cfg.full_graph_tokens):
        log.info("steps of up to %d tokens replay CUDA graphs (whole-forward graphs up to %d)",
                 cfg.graph_tokens, cfg.full_graph_tokens)
    eos = spec.eos_token_ids[0] if spec.eos_token_ids else getattr(tokenizer, "eos_token_id", None)
    proposer = proposer if proposer is not None else cfg.speculative
    if proposer == "draft":
        proposer = _draft_proposer(draft_model, model, kv_cache,
                                   backend if isinstance(backend, (str, type)) else type(backend),
                                   dtype, device)
    elif proposer is not None:
        proposer = create_part("proposer", proposer)
    k = cfg.num_speculative_tokens if proposer is not None else 0
    if proposer is not None and k < 1:
        raise ValueError("a proposer needs num_speculative_tokens >= 1")
    if proposer is not None and not callable(getattr(sampler, "process", None)):
        raise ValueError(f"speculative decoding verifies drafts against the sampler's distribution, "
                         f"but sampler {sampler!r} has no process(logits, meta); use the default "
                         "sampler or add it")
    startup = dict(load_s=loaded - t0, kv_cache_s=time.perf_counter() - loaded, warmup_s=0.0)
    pooler = None
    if executor.supports_hidden:          # pooling reads the hidden states (rank 0's under TP);
        pooler = _worker_pooler(runner, model, tokenizer, folder, cfg)   # before the warm-up's pooled steps
    if cfg.warmup and device.type == "cuda":
        from toolkit.worker.warmup import warm_up

        startup.update(warm_up(runner, max_num_batched_tokens=cfg.max_num_batched_tokens,
                               block_size=cfg.block_size, num_blocks=kv_cache.num_blocks,
                               max_model_len=max_model_len,
                               compile_workers=cfg.resolved_compile_workers))
        log.info("warm-up %.1f s: %.1f s compiling %d Triton kernels in turn, %.1f s capturing CUDA graphs",
                 startup["warmup_s"], startup["compile_s"], startup["kernels_compiled"],
                 startup["capture_s"])
    engine = Engine(model, tokenizer, scheduler, runner, allocator=allocator, block_size=cfg.block_size,
                    num_blocks=kv_cache.num_blocks, max_model_len=max_model_len, eos_token_id=eos,
                    proposer=proposer, num_spec_tokens=k,
                    async_scheduling=(device.type == "cuda" if cfg.async_scheduling is None
                                      else cfg.async_scheduling))
    engine.startup = startup
    engine.structured.limits = grammar_limits   # before any compile: the compiler is built lazily
    engine.sleep_mode.enabled = cfg.enable_sleep_mode
    if pooler is not None:
        from toolkit.engine.pooling import EnginePooling

        engine.pooling = EnginePooling(pooler, causal=all(x.causal for x in model.spec.layers),
                                       hidden_size=model.spec.hidden_size)
    return engine


def _grammar_limits(value: Any) -> Any:
    """EngineConfig.grammar_limits as a GrammarLimits (None: the compiler's defaults)."""
    if value is None:              # the grammar package (outlines-core) loads on first use only
        return None
    from toolkit.samplers.grammar.limits import GrammarLimits

    gl = GrammarLimits(**value) if isinstance(value, dict) else value
    if gl is not None and not isinstance(gl, GrammarLimits):
        raise TypeError(f"grammar_limits must be a GrammarLimits or a dict of its fields, got {type(value).__name__}")
    return gl


def _lora_state(cfg: EngineConfig, model: Any, device: torch.device) -> Any:
    """The worker side of multi-LoRA (toolkit/lora/state.py), or None when enable_lora is off."""
    if not cfg.enable_lora:
        return None
    if hasattr(model, "forward"):
        raise ValueError("enable_lora needs the model as a folder or a config (its linear layers are "
                         "built with LoRA slots), not an already built model")
    from toolkit.lora.state import LoRAState
    from toolkit.models.causal_lm import CausalLM
    from toolkit.models.loader import load_config, model_class

    config = load_config(model) if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__") else model
    cls = model_class(config, cfg.model_impl)
    if not issubclass(cls, CausalLM):
        raise ValueError(f"enable_lora needs a native model (its linear layers take LoRA slots); "
                         f"{cls.__name__} runs transformers' own modules; use model_impl='native' with an "
                         "architecture the toolkit has a file for")
    backend = {"auto": "auto", "triton": "triton", "reference": "torch"}[cfg.kernels]
    return LoRAState(max_loras=cfg.max_loras, max_lora_rank=cfg.max_lora_rank,
                     max_cpu_loras=cfg.max_cpu_loras or cfg.max_loras,
                     max_tokens=cfg.max_num_batched_tokens, device=device, backend=backend)


def _profile_step(cfg: EngineConfig) -> tuple[int, int]:
    """(tokens, logits rows) of the largest step the KV cache must leave room for."""
    return cfg.max_num_batched_tokens, min(cfg.max_num_seqs, cfg.max_num_batched_tokens)


def _worker_pooler(runner: Runner, model: Any, tokenizer: Any, folder: Any, cfg: EngineConfig) -> Any:
    """The Pooler of embed / classify / score requests, its worker side set on the runner
    (the engine's side, EnginePooling, takes the same pooler)."""
    from toolkit.pooling.accumulate import PoolingState
    from toolkit.pooling.build import build_pooler
    from toolkit.pooling.ranks import executor_logits, set_sep_token_id

    if getattr(model, "sep_token_id", 0) is None and tokenizer is not None:
        # an encoder's text-pair token types, on every tensor-parallel rank (each embeds them)
        runner.executor.call(set_sep_token_id, tokenizer.sep_token_id)
    pooler = build_pooler(model, tokenizer, folder, cfg.pooler_config,
                          compute_logits=partial(executor_logits, runner.executor))
    runner.pooling = PoolingState(pooler)
    return pooler


def _tensor_parallel(model: Any, cfg: EngineConfig, dtype: torch.dtype, device: torch.device,
                     attention: Any, load_format: str, lora: Any = None) -> Any:
    """Start the N ranks (rank 0 here, workers 1..N-1): each loads its shard and its KV cache."""
    from toolkit.parallel.executor import TPExecutor

    if attention == "auto":
        attention = _default_attention(cfg.kernels, device)
    return TPExecutor(model, size=cfg.tensor_parallel_size, dtype=dtype,
                      device=device.type if device.index is None else str(device), attention=attention,
                      load_format=load_format, block_size=cfg.block_size, num_blocks=cfg.num_blocks,
                      kv_cache_bytes=cfg.kv_cache_bytes, gpu_memory_utilization=cfg.gpu_memory_utilization,
                      cpu_kv_budget=CPU_KV_BUDGET, quantization=cfg.quantization, lora=lora,
                      profile_step=_profile_step(cfg))


def _host_tier(cfg: EngineConfig, kv_cache: KVCache, executor: Any) -> dict:
    """The scheduler's host-tier arguments: a HostTier of cpu_cache_gb (or host_cache_blocks)
    worth of KV blocks, and the preemption mode."""
    if not cfg.has_host_tier:
        return {"preemption": cfg.preemption}
    from toolkit.blocks.host_kv import HostKVCache
    from toolkit.blocks.host_tier import HostTier

    if executor is not None:
        raise ValueError("the host tier (cpu_cache_gb / host_cache_blocks) does not support "
                         "tensor_parallel_size > 1 yet; use one of them")
    per = HostKVCache.bytes_per_slot(kv_cache)
    n = cfg.host_cache_blocks if cfg.host_cache_blocks is not None else int(cfg.cpu_cache_gb * 2**30) // per
    if n < 1:
        raise ValueError(f"cpu_cache_gb={cfg.cpu_cache_gb} holds no KV block of {per} bytes; give at "
                         f"least {per / 2**30:.6f} GiB, or 0 for no host tier")
    return {"host_tier": HostTier(n), "preemption": cfg.preemption}


def _draft_proposer(draft_model: Any, model: Any, kv_cache: KVCache, attention: Any,
                    dtype: torch.dtype, device: torch.device) -> Any:
    """A DraftModelProposer over the target's block geometry. draft_model: an int (the first
    N layers of the target, sharing its weights), a folder, a config, or a loaded model."""
    from toolkit.models import load_model
    from toolkit.samplers.speculative.draft import DraftModelProposer
    from toolkit.samplers.speculative.truncate import truncated_model

    if draft_model is None:
        raise ValueError('speculative="draft" needs draft_model= (an int = the first N layers of '
                         "the target, a Hugging Face folder, a config, or a loaded model)")
    if isinstance(draft_model, int):
        draft_model = truncated_model(model, draft_model)
    elif not hasattr(draft_model, "forward"):
        fmt = "auto" if isinstance(draft_model, str) or hasattr(draft_model, "__fspath__") else "dummy"
        draft_model = load_model(draft_model, dtype=dtype, device=device, load_format=fmt)
    if draft_model.spec.vocab_size != model.spec.vocab_size:
        raise ValueError(f"the draft model's vocabulary ({draft_model.spec.vocab_size}) differs from the "
                         f"target's ({model.spec.vocab_size}); they must share a tokenizer")
    return DraftModelProposer(draft_model, num_blocks=kv_cache.num_blocks, block_size=kv_cache.block_size,
                              attention=attention, dtype=dtype, device=device)


def _wants_connector(cfg: EngineConfig) -> bool:
    """[kv_transfer] a connector is configured (kv_connector, or kv_cache_dir alone: the disk tier)."""
    return getattr(cfg, "kv_connector", None) is not None or getattr(cfg, "kv_cache_dir", None) is not None

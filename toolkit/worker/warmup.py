"""Warm-up: compile the kernels and capture the CUDA graphs inside `LLM(...)`, so that none of
it happens inside the user's first `generate` (20-25 s on a fresh machine otherwise).

Dummy steps for each CUDA-graph bucket (the first, eager run compiles, then the bucket is
captured): a decode batch of that many tokens for the buckets with whole-forward graphs, that
many prompt tokens for the larger ones (pieces only), in prompts no longer than the model's
positions or the cache (they share their blocks), with sampling rows of each kind (greedy;
temperature alone, whose LM head and fused tail are captured per bucket too,
worker/sample_graphs.py; temperature with top-k / top-p; all three mixed), then one prefill and one chunked prefill
over a cached prefix (the prefill attention kernels), then penalised rows (the penalty
kernels, with every row penalised and with some). A model without an LM head (an encoder)
warms up with pooled prompts of each bucket's size instead. The dummy steps write garbage KV into
block 0 and the first blocks; every block is free again afterwards and a real request
overwrites a slot before attention reads it.

With compile_workers > 1 the dummy steps first run once with every Triton launch skipped and
recorded (kernels/precompile.py), captures included, the recorded specializations not in
Triton's on-disk cache compile in that many processes, the first pass's graphs (which hold no
Triton kernel) are dropped, and then the steps run as above, their compiles cache hits.
"""

from __future__ import annotations

import logging
import time

import torch

from toolkit.kernels.compiles import triton_compiles
from toolkit.pooling.params import PoolingParams
from toolkit.progress import progress_bar
from toolkit.types import Request, SamplingParams, ScheduledRequest, SchedulerOutput

_GREEDY = SamplingParams(temperature=0.0, max_tokens=2)
_SAMPLED = SamplingParams(temperature=0.7, top_p=0.9, top_k=50, max_tokens=2, seed=0)
_TEMPERATURE = SamplingParams(temperature=0.6, max_tokens=2, seed=1)   # seeded: the engine's generator untouched
_KINDS = (_GREEDY, _SAMPLED, _TEMPERATURE)
_EMBED = PoolingParams(task="embed")
_PENALISED = SamplingParams(temperature=0.0, max_tokens=2, repetition_penalty=1.1, presence_penalty=0.1)

log = logging.getLogger(__name__)


def _step(runner, scheduled: list[ScheduledRequest]) -> None:
    """One dummy step the way the engine runs it (its sampling graphs captured on first use)."""
    runner.launch(SchedulerOutput(scheduled)).result()


def _decode(i: int, params: SamplingParams) -> ScheduledRequest:
    return ScheduledRequest(Request(f"warmup-{i}", [0], params), 0, 1, [0])


def _prompts(name: str, n: int, block_size: int, longest: int,
             pooling: PoolingParams | None = None) -> list[ScheduledRequest]:
    """n prompt tokens as whole prompts of at most `longest` tokens, each over blocks 0, 1, ...
    (positions past the model's would read past its rotary table); pooled ones with `pooling`."""
    out = []
    for i, start in enumerate(range(0, n, longest)):
        m = min(longest, n - start)
        out.append(ScheduledRequest(Request(f"{name}-{i}", [0] * m, _GREEDY, pooling_params=pooling), 0, m,
                                    list(range(-(-m // block_size)))))
    return out


@torch.inference_mode()
def warm_up(runner, *, max_num_batched_tokens: int, block_size: int, num_blocks: int,
            max_model_len: int | None = None, show_progress: bool = True,
            compile_workers: int = 0) -> dict[str, float]:
    """Run the dummy steps; returns seconds: warmup_s in all, of which compile_s in Triton
    compiles (kernels_compiled of them) and capture_s in CUDA-graph captures; the rest ran the
    dummy steps. max_model_len: the longest dummy prompt (None: the model's max_model_len).
    compile_workers > 1: the steps' kernels compile in that many processes first (this
    process's model only, not a tensor-parallel group's ranks); the figures then include
    kernels/precompile.compile_specs' counts and seconds (precompiled, precompile_cached,
    precompile_unseen, precompile_s, precompile_cpu_s)."""
    cache = (num_blocks - 1) * block_size
    longest = max(1, min(max_model_len or runner.model.spec.max_model_len, cache))
    start = time.perf_counter()
    pre = {}
    if compile_workers > 1 and getattr(runner.executor, "single_process", False):   # declared (worker/executor.py)
        pre = _precompile(runner, compile_workers, max_num_batched_tokens, block_size, longest, show_progress)
    with triton_compiles(strict=False) as compiled:
        _warm_up(runner, max_num_batched_tokens, block_size, longest, show_progress)
    total = time.perf_counter() - start
    return {"warmup_s": total, "compile_s": sum(s for _, s in compiled.values()),
            "kernels_compiled": sum(n for n, _ in compiled.values()),
            "capture_s": (runner.graphs.capture_s if runner.graphs is not None else 0.0)
            + (runner.sample_graphs.capture_s if runner.sample_graphs is not None else 0.0), **pre}


def _precompile(runner, workers: int, max_num_batched_tokens: int, block_size: int, longest: int,
                show_progress: bool) -> dict:
    """The dummy steps once with every Triton launch skipped and recorded, CUDA-graph captures
    included (they launch kernels the eager steps do not: the whole-forward decode attention,
    the sampler's graphed tail), then the recorded specializations compiled in `workers`
    processes. The pass's graphs hold no Triton kernel: they are dropped and the warm-up
    captures them again. A failure is logged and leaves the warm-up to compile as before."""
    from toolkit.kernels.precompile import collect_compiles, compile_specs

    try:
        with collect_compiles() as specs:
            _warm_up(runner, max_num_batched_tokens, block_size, longest, show_progress=False)
    except Exception as e:  # noqa: BLE001 - e.g. a kernel argument Triton cannot serialize
        log.warning("parallel compile skipped: its collecting pass raised %s: %s", type(e).__name__, e)
        return {}
    finally:
        _recapture(runner)
        if runner.penalty_history is not None:
            runner.penalty_history.clear()
    stats = compile_specs(specs, workers, show_progress=show_progress)
    for message in stats.pop("precompile_errors"):
        log.warning("parallel compile: %s (it compiles in its turn)", message)
    if stats["precompile_unseen"]:
        log.warning("parallel compile: %d kernels compiled by the workers are not under this process's "
                    "cache key; they compile in their turn", stats["precompile_unseen"])
    log.info("%d Triton kernel specializations compiled in %d processes in %.1f s (%.1f s of compiling), "
             "%d found in the cache", stats["precompiled"], workers, stats["precompile_s"],
             stats["precompile_cpu_s"], stats["precompile_cached"])
    return stats


def _recapture(runner) -> None:
    """Drop the runner's CUDA graphs and make empty ones (each bucket captured again at its
    next step), as sleep mode does on wake."""
    if runner.graphs is None:
        return
    runner.graphs = runner.sample_graphs = None
    runner.executor.call(_drop_graphs)
    torch.cuda.empty_cache()
    runner.enable_cuda_graphs(*runner.graph_args)


def _drop_graphs(model_runner) -> None:
    model_runner.graphs = None


def _warm_up(runner, max_num_batched_tokens: int, block_size: int, longest: int,
             show_progress: bool) -> None:
    graphs = runner.graphs
    sizes = list(graphs.sizes) if graphs is not None else [1, 16]
    if not runner.model.spec.supports_generation:     # declared: no LM head, nothing to sample
        _warm_up_pooling(runner, sizes, block_size, longest, show_progress)
        return
    prefill = min(512, max_num_batched_tokens, longest)
    with progress_bar(total=len(sizes) + 2, enabled=show_progress,
                      desc="compiling kernels, capturing CUDA graphs") as bar:
        for b in sizes:
            if graphs is None or b <= graphs.full_tokens:
                for kind in (_GREEDY, _SAMPLED, _TEMPERATURE, None):    # None: the rows mixed
                    _step(runner, [_decode(i, kind or _KINDS[i % 3]) for i in range(b)])
            else:                                         # eager and captured, then replayed
                for _ in range(2):                        # (its paged prefill tiles compile)
                    _step(runner, _prompts("warmup-b", b, block_size, longest))
            bar.update(1)
        _step(runner, _prompts("warmup-p", prefill, block_size, longest))
        bar.update(1)
        if prefill > block_size:              # a chunk after a cached prefix, next to a decode
            req = Request("warmup-c", [0] * prefill, _SAMPLED)
            _step(runner, [_decode(0, _GREEDY),
                           ScheduledRequest(req, block_size, prefill - block_size,
                                            list(range(-(-prefill // block_size))))])
        bar.update(1)
        # the penalty kernels: every row penalised, and some (their row-list variant)
        _step(runner, [_decode(0, _PENALISED)])
        _step(runner, [_decode(0, _PENALISED), _decode(1, _GREEDY)])
    if runner.penalty_history is not None:     # the dummy requests' rows: never finished, dropped
        runner.penalty_history.clear()
    _finish(runner)


def _warm_up_pooling(runner, sizes: list[int], block_size: int, longest: int, show_progress: bool) -> None:
    """A model without an LM head (an encoder) runs pooling requests only: each bucket as
    whole prompts, pooled, twice (eager and captured, then replayed); every prompt finishes
    in its step, so the pooling state keeps nothing."""
    with progress_bar(total=len(sizes), enabled=show_progress,
                      desc="compiling kernels, capturing CUDA graphs") as bar:
        for b in sizes:
            for _ in range(2):
                _step(runner, _prompts("warmup-e", b, block_size, longest, _EMBED))
            bar.update(1)
    _finish(runner)


def _finish(runner) -> None:
    # what the steps above cannot reach (a backend declares it; AttentionBackend: optional)
    attention_warm_up = getattr(runner.attention, "warm_up", None)
    if attention_warm_up is not None:
        attention_warm_up(runner.model.spec.dtype)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        # the eager runs' activations (up to the largest bucket's) sit in the caching
        # allocator, unused: a replayed step's live in the graphs' pool (an eager step, past
        # max_cudagraph_capture_size, allocates again)
        torch.cuda.empty_cache()

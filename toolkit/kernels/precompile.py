"""Compile a warm-up's Triton kernels in parallel, before the warm-up runs them.

A cold start compiles each kernel specialization (constexprs, dtypes, pointer alignment, ints
equal to 1 or divisible by 16) the first time a launch needs it: one after another, on one
core, most of `LLM(...)`'s time on a fresh machine. Two passes instead:

1. `collect_compiles()`: the warm-up's dummy steps run once while every Triton launch of a
   kernel found in the loaded modules is skipped (Triton's `jit_cache_hook` returns True: the
   launch returns without compiling or running) and its specialization is recorded in
   Triton's own serialized form (the `specialization_data` that `JITFunction.preload` reads).
   Each kernel's in-memory cache is swapped for an empty one meanwhile, so no launch runs at
   all, not even of a kernel compiled before: skipped kernels leave their outputs unwritten,
   and a kernel that ran would read them (an index read from garbage is out of bounds).
2. `compile_specs(specs, workers)`: the recorded specializations that Triton's on-disk cache
   lacks (`is_cached`: the key triton.compile computes) compile in `workers` spawned
   processes (Triton's compiler front end holds the GIL, so threads would not spread it),
   each into that cache under this process's key; none of them touches the GPU.

The warm-up then runs as before and each compile is a cache hit (milliseconds). A
specialization pass 1 did not see compiles as before, in its turn; so does one whose worker
failed (reported).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class CompileSpec:
    """One kernel specialization: the kernel's module and name, and Triton's serialized
    specialization (JSON: signature, constexprs, attributes, options, cache key)."""
    module: str
    name: str
    data: str


def _is_jit(obj) -> bool:
    from triton.runtime.jit import JITFunction

    return issubclass(type(obj), JITFunction)     # type(): no attribute lookup on lazy module objects


def loaded_kernels() -> list:
    """Every Triton JITFunction bound to a name in a loaded module (the toolkit's kernels, and
    any other the process imported): what `collect_compiles` empties the caches of."""
    seen: dict[int, object] = {}
    for module in list(sys.modules.values()):
        try:
            values = list(vars(module).values())
        except TypeError:                         # a module-like object without __dict__
            continue
        for v in values:
            if _is_jit(v):
                seen[id(v)] = v
    return list(seen.values())


def _unwrap(obj):
    """The JITFunction under an autotuner or heuristics wrapper (each keeps it as .fn)."""
    while obj is not None and not _is_jit(obj):
        obj = getattr(obj, "fn", None)
    return obj


@contextlib.contextmanager
def collect_compiles() -> Iterator[list[CompileSpec]]:
    """Inside the block no Triton launch runs: each is recorded (once per specialization)
    and skipped. Yields the list the specializations are appended to, in first-seen order.
    Kernels keep the caches they had before the block, untouched."""
    from collections import defaultdict

    from triton import knobs

    specs: list[CompileSpec] = []
    seen: set[str] = set()

    def record(*, fn, compile, **_) -> bool:
        data = compile["specialization_data"]
        if data not in seen:
            seen.add(data)
            specs.append(CompileSpec(fn.module, fn.name, data))
        return True                               # skip: no compile, no launch

    kernels = loaded_kernels()
    saved = [(k, k.device_caches) for k in kernels]
    previous = knobs.runtime.jit_cache_hook
    for k in kernels:
        k.device_caches = defaultdict(k.create_binder)
    knobs.runtime.jit_cache_hook = record
    try:
        yield specs
    finally:
        knobs.runtime.jit_cache_hook = previous
        for k, caches in saved:
            k.device_caches = caches
        # a kernel first imported inside the block cached nothing: every launch was skipped


def current_target() -> tuple:
    """(backend, arch, warp_size) of the current device: what the workers compile for."""
    from triton.runtime import driver

    t = driver.active.get_current_target()
    return (t.backend, t.arch, t.warp_size)


def _source(spec: CompileSpec) -> tuple:
    """(Triton's ASTSource of the specialization, its options dict), as JITFunction.preload
    rebuilds them from the serialized form."""
    import triton.language as tl
    from triton.compiler import ASTSource

    obj = importlib.import_module(spec.module)
    for part in spec.name.split("."):
        obj = getattr(obj, part)
    fn = _unwrap(obj)
    if fn is None:
        raise TypeError(f"{spec.module}.{spec.name} is not a Triton kernel")
    d = json.loads(spec.data)
    constexprs = {tuple(k): tl.dtype(v) if tl.dtype.is_dtype(v)
                  else tl.constexpr(v["constexpr"]) if isinstance(v, dict) and "constexpr" in v else v
                  for k, v in zip(d["constant_keys"], d["constant_vals"])}
    attrs = dict(zip(map(tuple, d["attrs_keys"]), d["attrs_vals"]))
    signature = {k: tuple(v) if isinstance(v, list) else v for k, v in d["signature"].items()}
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in d["options"].items()}
    return ASTSource(fn, signature, constexprs, attrs), options


def cache_invalidating_env() -> dict:
    """The environment variables Triton's cache key includes, as this process sees them (the
    workers are handed them, so their keys are this process's)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return dict(get_cache_invalidating_env_vars())


def is_cached(spec: CompileSpec, target: tuple, env: dict | None = None) -> bool:
    """Whether Triton's on-disk cache holds this specialization for `target`: the key
    triton.compile computes (source, backend, options, environment), without compiling."""
    import hashlib

    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import get_cache_key, get_cache_manager

    if knobs.runtime.add_stages_inspection_hook is not None:
        return False                              # a custom pipeline's key: leave it to Triton
    src, options = _source(spec)
    backend = make_backend(GPUTarget(*target))
    parsed = backend.parse_options(dict(options, **src.parse_options()))
    key = get_cache_key(src, backend, parsed, env_vars=env if env is not None else cache_invalidating_env())
    name = f"{src.name[:150]}.json"
    group = get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest()).get_group(name)
    return bool(group) and name in group


def compile_spec(spec: CompileSpec, target: tuple, env: dict | None = None) -> float:
    """Compile one specialization for `target` into Triton's on-disk cache, as
    `JITFunction.preload` would but without a device (a worker process runs it), under the
    cache key of `env` (cache_invalidating_env() of the process that will load it); returns
    seconds. Raises what Triton raises."""
    import triton
    from triton.backends.compiler import GPUTarget

    start = time.perf_counter()
    src, options = _source(spec)
    triton.compile(src, target=GPUTarget(*target), options=options, _env_vars=env)
    return time.perf_counter() - start


def _compile_or_error(spec: CompileSpec, target: tuple, env: dict) -> tuple[float, str | None]:
    try:
        return compile_spec(spec, target, env), None
    except Exception as e:  # noqa: BLE001 - reported; the kernel compiles in its turn
        return 0.0, f"{spec.name}: {type(e).__name__}: {e}"


def compile_specs(specs: list[CompileSpec], workers: int, target: tuple | None = None,
                  show_progress: bool = False) -> dict:
    """Compile those of `specs` not in Triton's on-disk cache yet in `workers` spawned
    processes (1: here, one after another), with a progress bar when show_progress. Returns
    {"precompiled": compiled now, "precompile_cached": found in the cache, "precompile_s":
    wall seconds, "precompile_cpu_s": the compiles' summed seconds, "precompile_unseen":
    compiled but still not found under this process's key (a worker and this process
    disagree on it: each then compiles in its turn), "precompile_errors": [messages]}."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from toolkit.progress import progress_bar

    start = time.perf_counter()
    if not specs:                                 # nothing launched a Triton kernel (a CPU run)
        return {"precompiled": 0, "precompile_cached": 0, "precompile_s": 0.0, "precompile_cpu_s": 0.0,
                "precompile_unseen": 0, "precompile_errors": []}
    target = target if target is not None else current_target()
    env = cache_invalidating_env()
    todo = [s for s in specs if not _cached_or_false(s, target, env)]
    results = []
    with progress_bar(total=len(todo), enabled=show_progress, unit="kernels",
                      desc=f"compiling kernels in {workers} processes") as bar:
        if workers <= 1 or len(todo) <= 1:
            for s in todo:
                results.append(_compile_or_error(s, target, env))
                bar.update(1)
        elif todo:
            with ProcessPoolExecutor(min(workers, len(todo)), mp_context=mp.get_context("spawn")) as pool:
                for future in as_completed([pool.submit(_compile_or_error, s, target, env) for s in todo]):
                    results.append(future.result())
                    bar.update(1)
    errors = [e for _, e in results if e is not None]
    unseen = sum(not _cached_or_false(s, target, env) for s in todo) - len(errors)
    return {"precompiled": len(todo) - len(errors), "precompile_cached": len(specs) - len(todo),
            "precompile_s": time.perf_counter() - start, "precompile_cpu_s": sum(s for s, _ in results),
            "precompile_unseen": max(0, unseen), "precompile_errors": errors}


def _cached_or_false(spec: CompileSpec, target: tuple, env: dict) -> bool:
    try:
        return is_cached(spec, target, env)
    except Exception:  # noqa: BLE001 - a spec this process cannot rebuild: the workers try it
        return False

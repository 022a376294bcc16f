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
2. `compile_specs(specs, workers)`: the recorded specializations compile in `workers` spawned
   processes (Triton's compiler front end holds the GIL, so threads would not spread it),
   each into Triton's on-disk cache; none of them touches the GPU.

The warm-up then runs as before and each compile is a cache hit (milliseconds). A
specialization pass 1 did not see (a graph capture's own kernels) compiles as before, in its
turn; a worker's failure is reported and the kernel compiles in its turn too.
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
        # a kernel module imported inside the block: its kernels saw only skipped launches
        for k in loaded_kernels():
            if all(k is not s for s, _ in saved):
                k.device_caches = defaultdict(k.create_binder)


def current_target() -> tuple:
    """(backend, arch, warp_size) of the current device: what the workers compile for."""
    from triton.runtime import driver

    t = driver.active.get_current_target()
    return (t.backend, t.arch, t.warp_size)


def compile_spec(spec: CompileSpec, target: tuple) -> float:
    """Compile one specialization for `target` into Triton's on-disk cache, as
    `JITFunction.preload` would but without a device (a worker process runs it); returns
    seconds. Raises what Triton raises."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    start = time.perf_counter()
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
    src = ASTSource(fn, signature, constexprs, attrs)
    triton.compile(src, target=GPUTarget(*target), options=options)
    return time.perf_counter() - start


def _compile_or_error(spec: CompileSpec, target: tuple) -> tuple[float, str | None]:
    try:
        return compile_spec(spec, target), None
    except Exception as e:  # noqa: BLE001 - reported; the kernel compiles in its turn
        return 0.0, f"{spec.name}: {type(e).__name__}: {e}"


def compile_specs(specs: list[CompileSpec], workers: int, target: tuple | None = None,
                  show_progress: bool = False) -> dict:
    """Compile `specs` in `workers` spawned processes (1: here, one after another) into
    Triton's on-disk cache, with a progress bar when show_progress. Returns {"precompiled":
    n compiled, "precompile_s": wall seconds, "precompile_cpu_s": the compiles' summed
    seconds, "precompile_errors": [messages]}."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from toolkit.progress import progress_bar

    target = target if target is not None else current_target()
    start = time.perf_counter()
    results = []
    with progress_bar(total=len(specs), enabled=show_progress, unit="kernels",
                      desc=f"compiling kernels in {workers} processes") as bar:
        if workers <= 1 or len(specs) <= 1:
            for s in specs:
                results.append(_compile_or_error(s, target))
                bar.update(1)
        else:
            with ProcessPoolExecutor(min(workers, len(specs)), mp_context=mp.get_context("spawn")) as pool:
                for future in as_completed([pool.submit(_compile_or_error, s, target) for s in specs]):
                    results.append(future.result())
                    bar.update(1)
    errors = [e for _, e in results if e is not None]
    return {"precompiled": len(specs) - len(errors), "precompile_s": time.perf_counter() - start,
            "precompile_cpu_s": sum(s for s, _ in results), "precompile_errors": errors}

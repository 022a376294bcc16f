"""Which Triton kernels compile while a block of code runs: the warm-up reports its compile
time with it, and a warm-up is complete when a workload's first run compiles nothing
(exported for tests as `toolkit.testing.triton_compiles`).

    with triton_compiles() as seen:
        llm.generate(prompts, params)
    assert not seen, seen          # {kernel name: [compiles, seconds]}
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


@contextlib.contextmanager
def triton_compiles(strict: bool = True) -> Iterator[dict[str, list]]:
    """{kernel name: [compiles, seconds]} of the Triton compiles while the block runs (a kernel
    compiles once per specialization: constexprs, dtypes, pointer alignment, and ints equal to
    1 or divisible by 16). It hooks Triton's `JITFunction._do_compile` (Triton 3.x); where that
    is missing it raises RuntimeError (strict), or counts nothing (strict=False, benchmarks)."""
    seen: dict[str, list] = {}
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        JITFunction = None
    plain = getattr(JITFunction, "_do_compile", None)
    if plain is None:
        if strict:
            raise RuntimeError("cannot count compiles: this Triton has no JITFunction._do_compile "
                               "(Triton 3.x has); pass strict=False to count nothing instead")
        yield seen
        return

    def counted(self, *a, **k):
        t = time.perf_counter()
        try:
            return plain(self, *a, **k)
        finally:
            c = seen.setdefault(getattr(self, "__name__", "?"), [0, 0.0])
            c[0] += 1
            c[1] = round(c[1] + time.perf_counter() - t, 3)
    JITFunction._do_compile = counted
    try:
        yield seen
    finally:
        JITFunction._do_compile = plain

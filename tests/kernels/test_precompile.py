"""Parallel compile (toolkit/kernels/precompile.py): the collecting hook records and skips,
leaves the kernels' caches as they were; specializations compile in worker processes into
Triton's on-disk cache (for a GPU target, which needs no GPU), and a failure is reported, not
raised; a specialization already cached is not compiled again. The whole path on a GPU: tests/engine/test_precompile_gpu.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

triton = pytest.importorskip("triton")

from triton.runtime.jit import JITFunction

from toolkit.kernels.precompile import CompileSpec, collect_compiles, loaded_kernels


def _plain(x_ptr, n):           # wrapped below without the decorator (the interpreter replaces @triton.jit)
    pass


KERNEL = JITFunction(_plain)


def _spec(block: int) -> CompileSpec:
    """The silu-and-mul kernel's specialization in Triton's serialized form (what the hook gets)."""
    data = {"name": "_silu_and_mul_kernel",
            "signature": {"x_ptr": "*fp16", "out_ptr": "*fp16", "n_cols": "i32", "stride_x": "i32",
                          "stride_out": "i32", "BLOCK": "constexpr"},
            "constant_keys": [[5]], "constant_vals": [block],
            "attrs_keys": [[0], [1]], "attrs_vals": [[["tt.divisibility", 16]], [["tt.divisibility", 16]]],
            "options": {"num_warps": 4}, "key": "k"}
    return CompileSpec("toolkit.kernels.silu_and_mul", "_silu_and_mul_kernel", json.dumps(data))


def _hook_call(data: str) -> bool:
    return triton.knobs.runtime.jit_cache_hook(
        key=None, repr="", fn=SimpleNamespace(module="m", name="k", jit_function=None),
        compile={"specialization_data": data}, is_manual_warmup=False, already_compiled=False)


def test_collect_records_each_specialization_once_skips_it_and_restores_the_caches():
    assert any(k is KERNEL for k in loaded_kernels())
    caches, previous = KERNEL.device_caches, triton.knobs.runtime.jit_cache_hook
    with collect_compiles() as specs:
        assert KERNEL.device_caches is not caches and not KERNEL.device_caches   # nothing cached inside
        assert _hook_call('{"a": 1}') is True            # True: Triton skips the compile and the launch
        assert _hook_call('{"a": 1}') is True
        assert _hook_call('{"a": 2}') is True
    assert [s.data for s in specs] == ['{"a": 1}', '{"a": 2}'] and specs[0].module == "m"
    assert KERNEL.device_caches is caches and triton.knobs.runtime.jit_cache_hook is previous


def test_collect_restores_the_hook_when_the_block_raises():
    previous = triton.knobs.runtime.jit_cache_hook
    with pytest.raises(ValueError), collect_compiles():
        raise ValueError("x")
    assert triton.knobs.runtime.jit_cache_hook is previous


_WORKERS = """
import json, sys
sys.path.insert(0, {root!r})
from tests.kernels.test_precompile import _spec
from toolkit.kernels.precompile import CompileSpec, compile_specs
bad = CompileSpec("toolkit.kernels.silu_and_mul", "silu_and_mul", _spec(64).data)   # not a kernel
for _ in range(2):
    print(json.dumps(compile_specs([_spec(64), _spec(128), bad], workers=2, target=("cuda", 90, 32))))
"""


def test_workers_compile_what_the_cache_lacks_under_this_process_key(tmp_path):
    """In a process with real (not interpreted) kernels, as on a GPU: the first call compiles
    both specializations in the workers and then finds them under its own key; the second
    finds them cached and starts no worker; the non-kernel is reported both times."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", _WORKERS.format(root=root)], capture_output=True, text=True,
                         env=env, cwd=root, check=False, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = (json.loads(line) for line in out.stdout.splitlines()[-2:])
    assert (first["precompiled"], first["precompile_cached"], first["precompile_unseen"]) == (2, 0, 0), first
    assert (second["precompiled"], second["precompile_cached"]) == (0, 2), second
    for stats in (first, second):
        assert len(stats["precompile_errors"]) == 1 and "silu_and_mul" in stats["precompile_errors"][0]
    assert len(list(Path(tmp_path).rglob("_silu_and_mul_kernel.cubin"))) == 2   # one per BLOCK

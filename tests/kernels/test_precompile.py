"""Parallel compile (toolkit/kernels/precompile.py): the collecting hook records and skips,
leaves the kernels' caches as they were; specializations compile in worker processes into
Triton's on-disk cache (for a GPU target, which needs no GPU), and a failure is reported, not
raised. The whole path on a GPU: tests/engine/test_precompile_gpu.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

triton = pytest.importorskip("triton")

from triton.runtime.jit import JITFunction

from toolkit.kernels.precompile import CompileSpec, collect_compiles, compile_specs, loaded_kernels


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


def test_workers_compile_into_the_disk_cache_and_report_failures(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)   # the workers compile real kernels
    bad = CompileSpec("toolkit.kernels.silu_and_mul", "silu_and_mul", _spec(64).data)   # not a kernel
    stats = compile_specs([_spec(64), _spec(128), bad], workers=2, target=("cuda", 90, 32))
    assert stats["precompiled"] == 2, stats
    assert len(stats["precompile_errors"]) == 1 and "silu_and_mul" in stats["precompile_errors"][0]
    cubins = list(Path(tmp_path).rglob("_silu_and_mul_kernel.cubin"))
    assert len(cubins) == 2                          # one per BLOCK: two specializations

"""TritonPagedAttention's TMA prefill path (kernels/self_attention.py): taken only when run()
follows this step's write_kv for the same layer, for whole prompts and for chunks of at least
one TMA tile after a cached prefix (gathered from the pages); every other row (decodes, short
chunks) and every step without a fresh write_kv (a CUDA-graph replay) stays on the paged
kernel. The output equals the reference either way. fp16 under TRITON_INTERPRET=1 on the CPU,
bf16 on the GPU."""

from __future__ import annotations

import pytest
import torch
from attention_cases import REL_TOL, make_case, poisoned_like, rel_err

from toolkit.attention.torch_ref import TorchAttention
from toolkit.attention.triton_paged import TritonPagedAttention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def own_kv(case, h: int):
    """The step's K/V as the model passes them: k contiguous, v a view of a QKV projection."""
    kv = case.cache[0].flatten(1, 2)[:, case.layout.slot_mapping.long()]     # [2, T, H_kv, D]
    t, h_kv, d = kv.shape[1:]
    qkv = torch.empty(t, (h + 2 * h_kv) * d, dtype=kv.dtype, device=kv.device)
    qkv[:, (h + h_kv) * d:] = kv[1].flatten(1)
    return kv[0].contiguous(), qkv[:, (h + h_kv) * d:].view(t, h_kv, d)


def run_case(kv_lens, q_lens, dtype, write: bool, seed: int = 0, h=4, h_kv=2, d=16):
    case = make_case(h, h_kv, d, 16, kv_lens, q_lens, dtype, seed)
    ref = TorchAttention(case.cache, h, d)
    fast = TritonPagedAttention(case.cache, h, d)
    ref.plan(case.layout)
    fast.plan(case.layout)
    if write:
        fast.write_kv(0, *own_kv(case, h))               # the same values the cache holds
    out = poisoned_like(case.q)
    fast.run(0, case.q, out=out)
    err = rel_err(out, ref.run(0, case.q))
    assert err < REL_TOL[dtype], f"relative error {err:.2e} ({fast!r})"
    return fast


@pytest.mark.parametrize("kv_lens,q_lens,takes", [
    ([40], [40], True),                          # a whole prompt
    ([70, 9, 33, 50], [70, 1, 33, 20], True),    # prompt, decode, prompt, chunk after a prefix
    ([50, 9], [20, 1], False),                   # only a short chunk after a cached prefix
    ([90, 9], [40, 1], True),                    # a chunk of a TMA tile or more after a prefix
    ([77, 64, 40], [45, 64, 33], True),          # chunks after prefixes ending mid-page, a prompt
    ([9, 12], [1, 1], False),                    # decodes only
])
def test_self_prefill_path_matches_reference(kv_lens, q_lens, takes) -> None:
    fast = run_case(kv_lens, q_lens, torch.float16, write=True)
    assert fast.num_self_prefill_launches == int(takes)


def test_without_this_steps_write_kv_the_paged_kernel_runs() -> None:
    """A CUDA-graph replay captured write_kv, so run() gets no fresh K/V: the paged rows run."""
    fast = run_case([70, 9, 33], [70, 1, 33], torch.float16, write=False)
    assert fast.num_self_prefill_launches == 0


def test_fresh_kv_is_for_one_layer_and_one_step() -> None:
    case = make_case(4, 2, 16, 16, [40], [40], torch.float16, 0, num_layers=2)
    fast = TritonPagedAttention(case.cache, 4, 16)
    fast.plan(case.layout)
    k, v = own_kv(case, 4)
    fast.write_kv(0, k, v)
    fast.run(1, case.q)                          # another layer: paged
    assert fast.num_self_prefill_launches == 0
    fast.write_kv(0, k, v)
    fast.plan(case.layout)                       # a new step: last step's K/V are stale
    fast.run(0, case.q)
    assert fast.num_self_prefill_launches == 0


def test_float32_and_windows_stay_paged() -> None:
    fast = run_case([40], [40], torch.float32, write=True)
    assert fast.num_self_prefill_launches == 0
    case = make_case(4, 2, 16, 16, [40], [40], torch.float16, 0)
    win = TritonPagedAttention(case.cache, 4, 16, sliding_window=8)
    win.plan(case.layout)
    win.write_kv(0, *own_kv(case, 4))
    win.run(0, case.q)
    assert win.num_self_prefill_launches == 0


@pytest.mark.gpu
def test_self_prefill_path_gpu_bf16() -> None:
    # a prompt, a decode, a prompt, a chunk after a prefix (TMA), a short chunk (paged)
    fast = run_case([1000, 9, 777, 4600, 600], [1000, 1, 777, 512, 40], torch.bfloat16, write=True,
                    h=32, h_kv=8, d=128)
    assert fast.num_self_prefill_launches == 1 and "TMA prefill tiles" in repr(fast)

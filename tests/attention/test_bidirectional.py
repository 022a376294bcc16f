"""Bidirectional (causal=False) attention for encoders: the CPU SDPA backend equals the
torch twin on ragged whole-prompt batches, the twin equals plain dense attention over each
sequence (the Triton backend's: test_triton_bidirectional.py)."""

from __future__ import annotations

import torch
from attention_cases import make_case, poisoned_like, rel_err
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.attention.cpu import CPUAttention
from toolkit.attention.torch_ref import TorchAttention


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [S, H, D], k, v [S, Hkv, D] of one sequence, every key visible -> [S, H, D]."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    p = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) * scale, -1)
    return torch.einsum("hqk,khd->qhd", p, v)


@settings(max_examples=15, deadline=None)
@given(lens=st.lists(st.integers(1, 40), min_size=1, max_size=5), kv_heads=st.sampled_from([1, 2, 4]),
       bs=st.sampled_from([4, 16]), seed=st.integers(0, 2**16))
def test_cpu_equals_twin_equals_dense(lens, kv_heads, bs, seed) -> None:
    h, d = 4, 16
    case = make_case(h, kv_heads, d, bs, lens, lens, torch.float32, seed)
    fast, twin = CPUAttention(case.cache, h, d, causal=False), TorchAttention(case.cache, h, d, causal=False)
    fast.plan(case.layout)
    twin.plan(case.layout)
    out = poisoned_like(case.q)
    out.copy_(fast.run(0, case.q))
    want = twin.run(0, case.q)
    assert not out.isnan().any()
    assert rel_err(out, want) < 1e-5
    cache, start = case.cache[0], 0
    for table, n in zip(case.tables, lens):
        pos = torch.arange(n)
        slots = torch.tensor(table)[pos // bs] * bs + pos % bs
        flat = cache.view(2, -1, kv_heads, d)
        ref = dense(case.q[start:start + n], flat[0, slots], flat[1, slots], d ** -0.5)
        assert rel_err(want[start:start + n], ref) < 1e-5
        start += n
    if max(lens) > 1:              # a causal backend differs: the first token sees later ones here
        causal = CPUAttention(case.cache, h, d)
        causal.plan(case.layout)
        assert rel_err(causal.run(0, case.q), want) > 1e-4


"""Differential test: paged attention equals torch's scaled_dot_product_attention on the same
K/V laid out contiguously (causal, queries at the end of each sequence, GQA by repetition)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attention_cases import (
    REL_TOL,
    head_geometry,
    make_case,
    poisoned_like,
    ragged_lengths,
    rel_err,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.attention.triton_paged import TritonPagedAttention


def sdpa_contiguous(case, scale: float) -> torch.Tensor:
    """Gather each sequence's K/V into one contiguous run and call SDPA per sequence."""
    cache = case.cache[0]
    h = case.q.shape[1]
    out, row = [], 0
    for table, kv_len, q_len in zip(case.tables, case.kv_lens, case.q_lens):
        blocks = torch.tensor(table, device=cache.device)
        k = cache[0, blocks].flatten(0, 1)[:kv_len]                       # [S, H_kv, D] contiguous
        v = cache[1, blocks].flatten(0, 1)[:kv_len]
        group = h // k.shape[1]
        k, v = (x.repeat_interleave(group, dim=1).transpose(0, 1).float() for x in (k, v))  # [H, S, D]
        q = case.q[row:row + q_len].transpose(0, 1).float()                             # [H, Q, D]
        q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)[:, None]
        mask = torch.arange(kv_len, device=q.device)[None, :] <= q_pos                  # [Q, S]
        out.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).transpose(0, 1))
        row += q_len
    return torch.cat(out)


@settings(max_examples=15)
@given(lengths=ragged_lengths(), geom=head_geometry(), bs=st.sampled_from([16, 32, 64]),
       dtype=st.sampled_from([torch.float32, torch.float16]), seed=st.integers(0, 2**16))
def test_paged_equals_sdpa_on_contiguous_kv(lengths, geom, bs, dtype, seed) -> None:
    (kv_lens, q_lens), (h, h_kv, d) = lengths, geom
    case = make_case(h, h_kv, d, bs, kv_lens, q_lens, dtype, seed)
    attn = TritonPagedAttention(case.cache, h, d, scale=0.7 / d ** 0.5)
    attn.plan(case.layout)
    out = attn.run(0, case.q, out=poisoned_like(case.q))
    err = rel_err(out, sdpa_contiguous(case, 0.7 / d ** 0.5))
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_paged_equals_sdpa(dtype) -> None:
    case = make_case(32, 8, 128, 16, [4096, 1, 1000, 333], [4096, 1, 1, 100], dtype, seed=7)
    attn = TritonPagedAttention(case.cache, 32, 128)
    attn.plan(case.layout)
    out = attn.run(0, case.q, out=poisoned_like(case.q))
    err = rel_err(out, sdpa_contiguous(case, 128 ** -0.5))
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"

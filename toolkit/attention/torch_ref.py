"""TorchAttention: the reference twin. Gathers each sequence's blocks and computes softmax
attention in float32, one sequence at a time. Also the CPU path of the engine."""

from __future__ import annotations

import math

import torch

from toolkit.attention.common import check_geometry, check_layout, check_qkv
from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout
from toolkit.kernels import reference as ref


class TorchAttention:
    def __init__(self, kv_cache: KVCache, num_heads: int, head_dim: int, scale: float | None = None,
                 sliding_window: int | None = None, soft_cap: float | None = None, causal: bool = True) -> None:
        """causal=False: each token attends to every token of its sequence (encoders; a
        sequence's prompt then runs in one step, kv_len == q_len)."""
        check_geometry(kv_cache, num_heads, head_dim)
        self.kv_cache = kv_cache
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, kv_cache.num_kv_heads, head_dim
        self.scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
        self.sliding_window = sliding_window
        self.soft_cap = soft_cap
        self.causal = causal
        self.layout: PagedKVLayout | None = None
        self._host: tuple[list[int], list[int], list[list[int]]] | None = None

    def plan(self, layout: PagedKVLayout) -> None:
        check_layout(layout, self.kv_cache)
        self.layout = layout
        host = layout.host
        qo = host.qo_indptr.tolist()
        kvp = host.kv_indptr.tolist()
        idx = host.kv_indices.tolist()
        self._host = (qo, host.kv_lens.tolist(), [idx[kvp[b]:kvp[b + 1]] for b in range(layout.num_seqs)])

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        assert self.layout is not None, "plan() first"
        check_qkv(None, k, self.kv_cache[layer], self.num_heads, self.layout.num_tokens)
        ref.write_kv(k, v, self.kv_cache[layer], self.layout.slot_mapping, *self.kv_cache.scales(layer))

    def run(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        assert self.layout is not None and self._host is not None, "plan() first"
        cache = self.kv_cache[layer]
        check_qkv(q, None, cache, self.num_heads, self.layout.num_tokens)
        qo, kv_lens, tables = self._host
        k_scale, v_scale = self.kv_cache.scales(layer)
        out = torch.empty_like(q)
        for b in range(len(kv_lens)):
            out[qo[b]:qo[b + 1]] = paged_attention_ref(
                q[qo[b]:qo[b + 1]], cache, tables[b], kv_lens[b], self.scale,
                self.sliding_window, self.soft_cap, k_scale, v_scale, self.causal).to(q.dtype)
        return out

    def __repr__(self) -> str:
        from toolkit.attention.describe import attention_repr

        return attention_repr(self)

    def _repr_html_(self) -> str:
        from toolkit.attention.describe import attention_html

        return attention_html(self, {"path": "reference twin: one sequence at a time, float32"})


def paged_attention_ref(q: torch.Tensor, cache: torch.Tensor, table: list[int], kv_len: int,
                        scale: float, sliding_window: int | None = None,
                        soft_cap: float | None = None, k_scale: float = 1.0,
                        v_scale: float = 1.0, causal: bool = True) -> torch.Tensor:
    """One sequence: q [Q, H, D] are its last Q tokens; returns float32 [Q, H, D]. An fp8
    cache's K/V are dequantised (value x scale) in float32. causal=False: every key visible."""
    blocks = torch.as_tensor(table, dtype=torch.long, device=cache.device)
    k = ref.dequantize(cache[0, blocks].reshape(-1, *cache.shape[3:])[:kv_len], k_scale)  # [S, H_kv, D]
    v = ref.dequantize(cache[1, blocks].reshape(-1, *cache.shape[3:])[:kv_len], v_scale)
    n_q, h, _ = q.shape
    group = h // k.shape[1]
    k = k.repeat_interleave(group, dim=1)                                  # [S, H, D]
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale                 # [H, Q, S]
    if soft_cap is not None:
        s = soft_cap * torch.tanh(s / soft_cap)
    q_pos = torch.arange(kv_len - n_q, kv_len, device=q.device)[:, None]  # [Q, 1]
    k_pos = torch.arange(kv_len, device=q.device)[None, :]                # [1, S]
    mask = k_pos <= q_pos if causal else torch.ones(n_q, kv_len, dtype=torch.bool, device=q.device)
    if sliding_window is not None:
        mask &= k_pos > q_pos - sliding_window
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("hqk,khd->qhd", p, v)

"""CPUAttention: the fast attention backend of a CPU device (the default there).

`plan` turns the step's ragged layout into a few padded groups once; every layer then runs
one `scaled_dot_product_attention` per group over K/V gathered from the paged cache with one
`index_select` per tensor. Sequences are grouped by query length (sorted, a new group when
padding would more than double the group's work), so a step of decode rows is one batched
call, a step of prompts of similar length another, and a long prefill chunk beside decode
rows does not pad them to its length. GQA runs without repeating K/V (`enable_gqa`); a soft
cap (which SDPA cannot apply) takes an explicit float32 softmax over the same gathered K/V.

The twin it is tested against is `toolkit.attention.torch_ref.TorchAttention`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from toolkit.attention.common import check_geometry, check_layout, check_qkv
from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout
from toolkit.kernels.reference import FP8_DTYPE as FP8
from toolkit.kernels.reference import quantize_fp8

# a group's padded work (n * Q_max * S_max) may exceed its real work (sum q * kv) by this
# factor plus SLACK score elements before the next sequence starts a new group
PAD_FACTOR = 2.0
SLACK = 4096


@dataclass
class Group:
    """Sequences attended in one padded call: n sequences, Q_max queries, S_max keys each."""
    n: int
    q_max: int
    s_max: int
    q_rows: torch.Tensor | None     # int64 [n * Q_max]: row of q per padded query (None: rows are 0..T-1)
    take: torch.Tensor | None       # int64 [R]: padded query slots that are real (None: all)
    dest: torch.Tensor | None       # int64 [R]: their rows in the output (None: 0..R-1)
    kv_slots: torch.Tensor          # int64 [n * S_max]: cache slot per padded key (pads: position 0's)
    mask: torch.Tensor | None       # bool [n, 1, Q_max, S_max] (None: every key visible)


class CPUAttention:
    def __init__(self, kv_cache: KVCache, num_heads: int, head_dim: int, scale: float | None = None,
                 sliding_window: int | None = None, soft_cap: float | None = None, causal: bool = True) -> None:
        """causal=False: bidirectional (encoders): a query sees every key of its sequence."""
        check_geometry(kv_cache, num_heads, head_dim)
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window}")
        if soft_cap is not None and not soft_cap > 0:
            raise ValueError(f"soft_cap must be a positive number or None, got {soft_cap}")
        self.kv_cache = kv_cache
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, kv_cache.num_kv_heads, head_dim
        self.scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
        self.sliding_window = sliding_window
        self.soft_cap = soft_cap
        self.causal = causal
        self.layout: PagedKVLayout | None = None
        self._groups: list[Group] = []
        self._write_rows: torch.Tensor | None = None    # int64 [W]: rows of k/v written (None: all)
        self._write_slots = torch.empty(0, dtype=torch.long)   # int64 [W]: their slots

    def __repr__(self) -> str:
        return (f"CPUAttention(heads={self.num_heads}/{self.num_kv_heads} (q/kv) x {self.head_dim}, "
                f"scale={self.scale:.4g}, sliding_window={self.sliding_window}, "
                f"soft_cap={self.soft_cap})")

    def _repr_html_(self) -> str:
        from toolkit.attention.describe import attention_html

        return attention_html(self, {"path": "SDPA over K/V gathered from the paged cache"})

    def plan(self, layout: PagedKVLayout) -> None:
        check_layout(layout, self.kv_cache)
        host = layout.host
        qo = host.qo_indptr.numpy().astype(np.int64)                     # [B+1]
        kvp = host.kv_indptr.numpy().astype(np.int64)                    # [B+1]
        pages = host.kv_indices.numpy().astype(np.int64)                 # [nnz]
        kv_lens = host.kv_lens.numpy().astype(np.int64)                  # [B]
        q_lens = qo[1:] - qo[:-1]                                        # [B]
        device = self.kv_cache.layers[0].device
        self._groups = [self._group(seqs, qo, kvp, pages, kv_lens, q_lens, layout, device)
                        for seqs in _partition(q_lens, kv_lens)]
        slots = host.slot_mapping.numpy()                                # [T], -1 = skip
        keep = np.flatnonzero(slots >= 0)
        as_long = lambda x: torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64)).to(device)
        self._write_rows = None if len(keep) == len(slots) else as_long(keep)
        self._write_slots = as_long(slots[keep])
        self.layout = layout

    def _group(self, seqs: np.ndarray, qo: np.ndarray, kvp: np.ndarray, pages: np.ndarray,
               kv_lens: np.ndarray, q_lens: np.ndarray, layout: PagedKVLayout,
               device: torch.device) -> Group:
        bs = layout.block_size
        kv, ql = kv_lens[seqs], q_lens[seqs]                             # [n]
        n, q_max, s_max = len(seqs), int(ql.max()), int(kv.max())
        # queries: padded slot (b, i) holds row qo[b] + i; pads reuse the sequence's first row
        i = np.arange(q_max)[None, :]                                    # [1, Q]
        real_q = i < ql[:, None]                                         # [n, Q]
        q_rows = qo[seqs][:, None] + np.where(real_q, i, 0)              # [n, Q]
        # keys: position s of sequence b lives in page kv_indptr[b] + s // bs at offset s % bs
        s = np.arange(s_max)[None, :]                                    # [1, S]
        real_k = s < kv[:, None]                                         # [n, S]
        # pad keys read the sequence's position 0: written, so finite (0 * NaN would poison)
        pos = np.where(real_k, s, 0)                                     # [n, S]
        slots = pages[kvp[seqs][:, None] + pos // bs] * bs + pos % bs    # [n, S]
        # query i of b sits at position kv - q + i: causal, within the window, never a pad key
        q_pos = (kv - ql)[:, None, None] + i[:, :, None]                 # [n, Q, 1]
        k_pos = s[:, None, :]                                            # [1, 1, S]
        seen = (k_pos <= q_pos) if self.causal else np.ones((n, q_max, s_max), dtype=bool)
        mask = seen & real_k[:, None, :]                                 # [n, Q, S]
        if self.sliding_window is not None:
            mask &= k_pos > q_pos - self.sliding_window
        mask[:, :, 0] |= ~real_q                                         # pad queries see key 0: no NaN
        rows = q_rows.reshape(-1)
        contiguous = bool(np.array_equal(rows, np.arange(layout.num_tokens)))
        take = np.flatnonzero(real_q.reshape(-1))                        # [R]
        t = lambda x: torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64)).to(device)
        return Group(
            n=n, q_max=q_max, s_max=s_max,
            q_rows=None if contiguous else t(rows),
            take=None if real_q.all() else t(take),
            dest=None if contiguous else t(rows[take]),
            kv_slots=t(slots.reshape(-1)),
            mask=None if mask.all() else torch.from_numpy(mask[:, None]).to(device),
        )

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        assert self.layout is not None, "plan() first"
        cache = self.kv_cache[layer]                                     # [2, NB, BS, Hkv, D]
        check_qkv(None, k, cache, self.num_heads, self.layout.num_tokens)
        if v.shape != k.shape or v.dtype != k.dtype:
            raise ValueError(f"v must match k {tuple(k.shape)} {k.dtype}, got {tuple(v.shape)} {v.dtype}")
        flat = cache.view(2, -1, self.num_kv_heads, self.head_dim)       # [2, NB*BS, Hkv, D]
        if self._write_rows is not None:                                 # slots -1 skipped
            k, v = k.index_select(0, self._write_rows), v.index_select(0, self._write_rows)
        if cache.dtype == FP8:   # quantised as the twin does; index_copy_ has no fp8 kernel: bytes
            k_scale, v_scale = self.kv_cache.scales(layer)
            flat = flat.view(torch.uint8)
            k, v = quantize_fp8(k, k_scale).view(torch.uint8), quantize_fp8(v, v_scale).view(torch.uint8)
        flat[0].index_copy_(0, self._write_slots, k)
        flat[1].index_copy_(0, self._write_slots, v)

    def run(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q [T, H, D] -> [T, H, D], one padded attention call per group of the plan."""
        assert self.layout is not None, "plan() first"
        cache = self.kv_cache[layer]                                     # [2, NB, BS, Hkv, D]
        check_qkv(q, None, cache, self.num_heads, self.layout.num_tokens)
        flat = cache.view(2, -1, self.num_kv_heads, self.head_dim)       # [2, NB*BS, Hkv, D]
        groups = self._groups
        # fp8: K/V converted to q's dtype (exact); K's scale folded into the softmax scale, V's
        # applied to the output
        k_scale, v_scale = self.kv_cache.scales(layer) if cache.dtype == FP8 else (1.0, 1.0)
        whole = len(groups) == 1 and groups[0].q_rows is None and groups[0].take is None
        out = None if whole else torch.empty_like(q)
        for g in groups:
            qg = q if g.q_rows is None else q.index_select(0, g.q_rows)  # [n*Q, H, D]
            qg = qg.reshape(g.n, g.q_max, self.num_heads, self.head_dim).transpose(1, 2)  # [n, H, Q, D]
            k = flat[0].index_select(0, g.kv_slots).view(g.n, g.s_max, self.num_kv_heads, -1)
            v = flat[1].index_select(0, g.kv_slots).view(g.n, g.s_max, self.num_kv_heads, -1)
            if cache.dtype == FP8:
                k, v = k.to(q.dtype), v.to(q.dtype)
            o = self._attend(qg, k.transpose(1, 2), v.transpose(1, 2), g.mask, k_scale)  # [n, H, Q, D]
            if v_scale != 1.0:
                o = o.mul_(v_scale)                                      # SDPA's fresh output
            o = o.transpose(1, 2).reshape(g.n * g.q_max, self.num_heads, self.head_dim)  # [n*Q, H, D]
            if whole:
                return o
            if g.take is not None:
                o = o.index_select(0, g.take)                            # [R, H, D]
            if g.dest is None:
                out[: o.shape[0]] = o
            else:
                out.index_copy_(0, g.dest, o)
        return out

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None, k_scale: float = 1.0) -> torch.Tensor:
        """q [n, H, Q, D], k/v [n, Hkv, S, D], mask bool [n, 1, Q, S] -> [n, H, Q, D]."""
        scale = self.scale * k_scale
        if self.soft_cap is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                  enable_gqa=self.num_heads != self.num_kv_heads)
        n, h, nq, d = q.shape
        group = h // self.num_kv_heads
        # [n, Hkv, G*Q, D]: the G query heads of a KV head share its keys (no K/V repeat)
        qf = q.float().reshape(n, self.num_kv_heads, group * nq, d)
        s = torch.matmul(qf, k.float().transpose(-1, -2)) * scale       # [n, Hkv, G*Q, S]
        s = self.soft_cap * torch.tanh(s / self.soft_cap)
        if mask is not None:
            s = s.masked_fill(~mask.repeat(1, 1, group, 1), float("-inf"))
        p = torch.softmax(s, dim=-1)
        return torch.matmul(p, v.float()).view(n, h, nq, d).to(q.dtype)


def _partition(q_lens: np.ndarray, kv_lens: np.ndarray) -> list[np.ndarray]:
    """Sequence ids in groups: sorted by query length, a group closed when padding the next
    sequence in would make its padded work exceed PAD_FACTOR x its real work + SLACK."""
    order = np.argsort(q_lens, kind="stable")
    groups: list[list[int]] = []
    cur: list[int] = []
    real = s_max = 0
    for b in order.tolist():
        q, kv = int(q_lens[b]), int(kv_lens[b])
        n_real, n_s = real + q * kv, max(s_max, kv)
        # sorted ascending, so q is the group's Q_max if b joins
        if cur and (len(cur) + 1) * q * n_s > PAD_FACTOR * n_real + SLACK:
            groups.append(cur)
            cur, n_real, n_s = [], q * kv, kv
        cur.append(b)
        real, s_max = n_real, n_s
    if cur:
        groups.append(cur)
    return [np.asarray(g, dtype=np.int64) for g in groups]

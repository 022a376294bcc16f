"""LoRALinearMethod on the parallel linear layers, against x W^T + per-token x A^T B^T: merged
column layers (gate | up) and row-parallel layers, at 1 and N tensor-parallel ranks (the
ranks' outputs gathered / summed by hand), with the Triton kernels (TRITON_INTERPRET=1 on the
CPU) and the torch twins; ranks padded to max_lora_rank, a part an adapter does not target."""

from __future__ import annotations

import pytest
import torch

from toolkit.lora.layer import LoRALinearMethod
from toolkit.lora.state import LoRAState
from toolkit.models.layers.linear import RowParallelLinear, UnquantizedLinearMethod, merged_column


class Rank:
    """Rank `rank` of `size`; the all-reduce is left to the test (it sums the ranks' outputs)."""
    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size, self.backend = rank, size, "fake"

    def all_reduce(self, t):
        return t


def _state(backend: str) -> LoRAState:
    return LoRAState(max_loras=3, max_lora_rank=8, max_cpu_loras=3, max_tokens=16, device="cpu", backend=backend)


def _adapters(g, n_in, outs):
    """slot -> per part (A [r, in], B [out, r]) or None; slot 1 leaves part 1 untouched."""
    ad = {}
    for slot, r in ((0, 3), (1, 8), (2, 1)):
        ad[slot] = [None if (slot == 1 and i == 1) else
                    (torch.randn(r, n_in, generator=g), torch.randn(o, r, generator=g)) for i, o in enumerate(outs)]
    return ad


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("tp", [1, 2])
def test_merged_column_and_row_parallel(backend, tp):
    g = torch.Generator().manual_seed(tp)
    n_in, outs, t = 12, [10, 6], 7
    x = torch.randn(t, n_in, generator=g)
    w = [torch.randn(o, n_in, generator=g) for o in outs]
    ad = _adapters(g, n_in, outs)
    idx = torch.tensor([0, -1, 1, 2, 1, -1, 0], dtype=torch.int32)
    # expected: the full layer
    want = []
    for i, o in enumerate(outs):
        y = x @ w[i].T
        for tok in range(t):
            s = int(idx[tok])
            if s >= 0 and ad[s][i] is not None:
                a, b = ad[s][i]
                y[tok] += b @ (a @ x[tok])
        want.append(y)
    parts = [[], []]
    for rank in range(tp):
        st = _state(backend)
        st.indices[:t] = idx
        layer = merged_column(n_in, outs, False, dtype=torch.float32, device="cpu", group=Rank(rank, tp),
                              method=LoRALinearMethod(UnquantizedLinearMethod(), st))
        for i in range(2):
            layer.weight_loader(layer.weight, w[i], i)
        for slot, ab in ad.items():
            layer.method.load_slot(layer, slot, ab)
        gate, up = layer.split(layer(x))
        parts[0].append(gate)
        parts[1].append(up)
    for i in range(2):
        torch.testing.assert_close(torch.cat(parts[i], dim=1), want[i], atol=1e-4, rtol=1e-4)

    # row-parallel: each rank's input columns; the ranks' partial outputs sum to the full
    n_out = 9
    w2 = torch.randn(n_out, n_in, generator=g)
    ad2 = {s: [(torch.randn(r, n_in, generator=g), torch.randn(n_out, r, generator=g))] for s, r in ((0, 5), (2, 8))}
    full = x @ w2.T
    for tok in range(t):
        s = int(idx[tok])
        if s in ad2:
            a, b = ad2[s][0]
            full[tok] += b @ (a @ x[tok])
    total = torch.zeros(t, n_out)
    for rank in range(tp):
        st = _state(backend)
        st.indices[:t] = idx
        layer = RowParallelLinear(n_in, n_out, False, dtype=torch.float32, device="cpu", group=Rank(rank, tp),
                                  method=LoRALinearMethod(UnquantizedLinearMethod(), st))
        layer.weight_loader(layer.weight, w2)
        for slot, ab in ad2.items():
            layer.method.load_slot(layer, slot, ab)
        total += layer(x[:, layer.cols.start:layer.cols.start + layer.cols.size].contiguous())
    torch.testing.assert_close(total, full, atol=1e-4, rtol=1e-4)


def test_wraps_the_base_method():
    class Doubling(UnquantizedLinearMethod):          # a stand-in for a quantized base method
        def apply(self, layer, x, bias=None):
            return 2 * super().apply(layer, x, bias)

    st = _state("torch")
    m = LoRALinearMethod(Doubling(), st)
    layer = RowParallelLinear(4, 3, False, dtype=torch.float32, device="cpu", method=m)
    layer.weight_loader(layer.weight, torch.eye(3, 4))
    x = torch.randn(2, 4)
    torch.testing.assert_close(layer(x), 2 * x[:, :3])           # indices -1: the base alone
    assert "LoRA(" in repr(layer) and "lora_a" in dict(layer.named_buffers())

"""toolkit.transfer.upload: many CPU tensors in one packed copy, each back with its dtype,
shape and values (the packing is forced on the CPU; on CUDA it is the default)."""

from __future__ import annotations

import pytest
import torch

from toolkit.transfer import to_device, upload


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_upload_packs_and_restores_every_tensor(device: str) -> None:
    tensors = {
        "f32": torch.tensor([1.5, -2.0, float("inf")]),
        "bool": torch.tensor([True, False, True]),                 # odd byte count before int64
        "i64": torch.arange(6).reshape(2, 3),
        "strided": torch.arange(10)[::3],                           # not contiguous
        "i32": torch.tensor([[7]], dtype=torch.int32),
        "bf16": torch.tensor([1.5, -3.25], dtype=torch.bfloat16),  # no numpy twin: torch's copy
        "scalar": torch.tensor(-9, dtype=torch.int64),              # 0-d
        "f16_t": torch.arange(6, dtype=torch.float16).reshape(2, 3).T,   # transposed 2-D
        "empty": torch.empty(0, dtype=torch.int64),                 # last, after an odd offset
    }
    out = upload(tensors, device, pack=True)
    assert list(out) == list(tensors)
    for k, t in tensors.items():
        assert out[k].device.type == device and out[k].dtype == t.dtype and out[k].shape == t.shape
        assert torch.equal(out[k].cpu(), t), k
    assert upload({}, device, pack=True) == {}
    assert torch.equal(to_device(tensors["i64"], device).cpu(), tensors["i64"])

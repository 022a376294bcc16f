"""Host -> device copies that do not make the host wait for the GPU.

A plain `cpu_tensor.to("cuda")` from pageable memory returns only when the copy is done, and
the copy is queued behind whatever the stream already holds: called after the model's forward
was launched, it stalls the host until the forward ends, so nothing of the step's host work
overlaps the GPU any more. Staging through pinned memory with non_blocking=True queues the copy
and returns at once; PyTorch's pinned-memory cache keeps the staging buffer alive (and unused)
until the copy has run.
"""

from __future__ import annotations

from typing import Mapping

import torch


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t` (on the CPU) on `device`, without a host wait when the device is CUDA."""
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    if not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def upload(tensors: Mapping[str, torch.Tensor], device: torch.device | str, *,
           pack: bool | None = None) -> dict[str, torch.Tensor]:
    """The CPU tensors of one step on `device` in a single host -> device copy.

    They are packed into one pinned byte buffer (each at a 16-byte aligned offset), copied
    with non_blocking=True, and returned as views of the device buffer with their dtypes and
    shapes: one pinned allocation and one copy instead of one of each per tensor (a pinned
    allocation costs tens of microseconds). pack: default only for CUDA (on the CPU the
    tensors are returned as they are); tests pass pack=True to run the packing anywhere.
    """
    device = torch.device(device)
    if not (device.type == "cuda" if pack is None else pack):
        return {k: t.to(device) for k, t in tensors.items()}
    offsets, total = [], 0
    for t in tensors.values():
        total = -(-total // 16) * 16
        offsets.append(total)
        total += t.numel() * t.element_size()
    # rounded up, so an empty tensor's slot (even the last) is an aligned in-bounds slice
    buf = torch.empty(-(-total // 16) * 16 + 16, dtype=torch.uint8, pin_memory=device.type == "cuda")
    for off, t in zip(offsets, tensors.values()):
        nbytes = t.numel() * t.element_size()
        if nbytes:      # copied through a typed view of the slot: any strides, any dtype
            buf[off:off + nbytes].view(t.dtype).copy_(t.reshape(-1))
    dev = buf.to(device, non_blocking=True)
    return {k: dev[off:off + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            for (k, t), off in zip(tensors.items(), offsets)}

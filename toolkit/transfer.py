"""Host -> device copies that do not make the host wait for the GPU.

A plain `cpu_tensor.to("cuda")` from pageable memory returns only when the copy is done, and
the copy is queued behind whatever the stream already holds: called after the model's forward
was launched, it stalls the host until the forward ends, so nothing of the step's host work
overlaps the GPU any more. Staging through pinned memory with non_blocking=True queues the copy
and returns at once; PyTorch's pinned-memory cache keeps the staging buffer alive (and unused)
until the copy has run.
"""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t` (on the CPU) on `device`, without a host wait when the device is CUDA."""
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    if not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)

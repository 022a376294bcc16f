"""Group: the collectives of one rank, over a torch.distributed process group.

The process group is built directly (`ProcessGroupGloo` / `ProcessGroupNCCL` on a TCPStore),
never through `init_process_group`: the engine's process (rank 0, often a notebook) keeps no
global torch.distributed state, and two tensor-parallel LLMs may live in one process one
after the other. Gloo on the CPU, NCCL on CUDA; NCCL calls issued while a CUDA graph is
captured are recorded into it (torch's ProcessGroupNCCL is capture-safe once its
communicator exists: `make_group` runs one all-reduce eagerly for that).
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist


class Group:
    """rank r of `size`; every method is a collective: all ranks call it in the same order."""

    def __init__(self, pg: Any, rank: int, size: int, backend: str) -> None:
        self.pg, self.rank, self.size, self.backend = pg, rank, size, backend

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place; returns t."""
        if self.size > 1:
            self.pg.allreduce([t]).wait()
        return t

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """t of rank src on every rank, in place."""
        if self.size > 1:
            opts = dist.BroadcastOptions()
            opts.rootRank = src
            self.pg.broadcast([t], opts).wait()
        return t

    def gather(self, t: torch.Tensor, dst: int = 0) -> list[torch.Tensor] | None:
        """Every rank's t (same shape) on rank dst, in rank order; None on the other ranks."""
        if self.size == 1:
            return [t]
        t = t.contiguous()
        out = [[torch.empty_like(t) for _ in range(self.size)]] if self.rank == dst else []
        opts = dist.GatherOptions()
        opts.rootRank = dst
        self.pg.gather(out, [t], opts).wait()
        return out[0] if self.rank == dst else None

    def abort(self) -> None:
        """Unblock and end the group (a peer died): pending collectives fail instead of hanging."""
        try:
            self.pg.abort()
        except Exception:  # noqa: BLE001 - already broken or not supported: nothing to unblock
            pass

    def __repr__(self) -> str:
        return f"Group(rank={self.rank}, size={self.size}, backend={self.backend!r})"


def make_group(store: Any, rank: int, size: int, device: torch.device,
               timeout: datetime.timedelta = datetime.timedelta(minutes=10)) -> Group:
    """This rank's Group over `store` (all ranks call it; it returns once all have joined).
    Gloo for a CPU device, NCCL for CUDA (the current device must be `device`)."""
    if device.type == "cuda":
        from torch.distributed import ProcessGroupNCCL

        opts = ProcessGroupNCCL.Options()
        opts.is_high_priority_stream = False
        opts._timeout = timeout
        opts.group_name = f"toolkit-tp-{getattr(store, 'port', 0)}"   # the same on every rank
        pg = ProcessGroupNCCL(store, rank, size, opts)
        pg._set_sequence_number_for_group()   # as torch's own group helper does (store-based)
        try:                                 # create the communicator now, bound to this GPU
            pg.eager_connect_single_device(device)
        except Exception:  # noqa: BLE001 - older torch: the all-reduce below creates it
            pass
        group = Group(pg, rank, size, "nccl")
    else:
        pg = dist.ProcessGroupGloo(store, rank, size, timeout)
        pg._set_sequence_number_for_group()
        group = Group(pg, rank, size, "gloo")
    probe = torch.ones(1, device=device)     # every rank is connected before anything else runs
    group.all_reduce(probe)
    if int(probe.item()) != size:
        raise RuntimeError(f"the process group's probe all-reduce gave {probe.item()}, not {size}")
    return group

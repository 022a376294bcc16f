"""The worker process of ranks 1..N-1 (started with the spawn method by TPExecutor).

    hello -> join the process group -> build the shard (with its LoRAState's layers when
    spec.lora) -> ("loaded", blocks that fit)
    <- ("kv", num_blocks) -> KV cache + attention -> ("ready")
    then, until ("stop") or the pipe closes: ("step", StepMsg) | ("graphs", max_tokens, full_tokens) |
    ("call", fn, args) -> ("reply", ok, value)

Steps get no reply (rank 0 waits on the collectives, not on the pipe). Any exception is
sent as ("failed", traceback) and the process exits with code 1; rank 0 then reports the
rank and its traceback.
"""

from __future__ import annotations

import datetime
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class WorkerSpec:
    """What every rank builds (picklable: a folder path or a config, names, numbers)."""
    source: Any                    # a Hugging Face folder (str) or a transformers config
    load_format: str
    dtype: torch.dtype
    device_type: str               # "cpu" or "cuda": rank r uses cuda:r
    attention: Any                 # registered name, class or factory
    block_size: int
    num_blocks: int | None
    kv_cache_bytes: int | None
    gpu_memory_utilization: float
    cpu_kv_budget: int
    threads: int                   # torch threads of a worker on the CPU
    timeout_s: float
    quantization: str | None = None   # EngineConfig.quantization
    lora: dict | None = None       # LoRAState arguments (enable_lora): each rank builds its own
    profile_step: tuple[int, int] = (0, 0)   # (tokens, logits rows) of the largest step: its activations' room

    def device(self, rank: int) -> torch.device:
        return torch.device("cuda", rank) if self.device_type == "cuda" else torch.device("cpu")


def setup_rank(spec: WorkerSpec, rank: int, size: int, port: int,
               linear_method: Any = None) -> tuple[Any, Any]:
    """(group, model shard) of this rank: join the group through rank 0's TCPStore, load."""
    from toolkit.parallel.group import make_group
    from toolkit.parallel.model import build_shard

    device = spec.device(rank)
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    store = torch.distributed.TCPStore("127.0.0.1", port, size, False, timeout=timeout)
    group = make_group(store, rank, size, device, timeout)
    group.store = store                      # kept alive with the group
    return group, build_shard(spec.source, group, dtype=spec.dtype, device=device,
                              load_format=spec.load_format, quantization=spec.quantization,
                              linear_method=linear_method)


def worker_main(rank: int, size: int, port: int, conn: Any, spec: WorkerSpec) -> None:
    code = 0
    group = None
    try:
        if spec.device_type == "cuda":
            torch.cuda.set_device(rank)
        else:
            torch.set_num_threads(spec.threads)
        conn.send(("hello", os.getpid()))
        lora = None
        if spec.lora is not None:            # this rank's slots hold its slices of the adapters
            from toolkit.lora.state import LoRAState

            lora = LoRAState(**spec.lora, device=spec.device(rank))
        group, model = setup_rank(spec, rank, size, port,
                                  lora.linear_method() if lora is not None else None)
        if lora is not None:
            lora.attach(model)
        from toolkit.parallel.shard import kv_blocks_fit, make_kv_and_attention, run_rank
        from toolkit.worker.model_runner import ModelRunner

        device = spec.device(rank)
        conn.send(("loaded", kv_blocks_fit(model, spec.block_size, spec.dtype, device,
                                           num_blocks=spec.num_blocks, budget_bytes=spec.kv_cache_bytes,
                                           gpu_memory_utilization=spec.gpu_memory_utilization,
                                           cpu_budget=spec.cpu_kv_budget, profile_step=spec.profile_step)))
        kind, num_blocks = conn.recv()
        kv, attention = make_kv_and_attention(model, spec.attention, num_blocks, spec.block_size,
                                              spec.dtype, device)
        step = ModelRunner(model, attention, kv, device)
        conn.send(("ready", None))
        while True:
            msg = conn.recv()
            if msg[0] == "step":
                if lora is not None and msg[1].lora is not None:
                    lora.apply(msg[1].lora)      # slot loads and token slots before the forward
                run_rank(step, group, msg[1], msg[1].layout_on(device))
            elif msg[0] == "graphs":
                step.enable_cuda_graphs(*msg[1:])
            elif msg[0] == "call":               # fn(step, *args) on every rank
                try:
                    reply = ("reply", True, msg[1](step, *msg[2]))
                except Exception as e:  # noqa: BLE001 - the caller gets it; the worker goes on
                    reply = ("reply", False, f"rank {rank}: {type(e).__name__}: {e}")
                conn.send(reply)
            elif msg[0] == "stop":
                break
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass                                 # rank 0 went away: nothing to report to
    except BaseException:
        code = 1
        try:
            conn.send(("failed", f"rank {rank}: {traceback.format_exc()}"))
        except Exception:  # noqa: BLE001 - the pipe is gone too
            pass
    finally:
        if group is not None and code:
            group.abort()
        sys.stdout.flush()
        sys.stderr.flush()
        # skip interpreter teardown (library threads, CUDA context): the parent is waiting
        os._exit(code)

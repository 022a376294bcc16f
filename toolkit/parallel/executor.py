"""TPExecutor: tensor parallelism behind the Runner (`LLM(..., tensor_parallel_size=N)`).

Who drives. Rank 0 runs in the engine's own process (the driver, as in vLLM's V0 executor)
and ranks 1..N-1 are worker processes (spawned, one per GPU: rank r on cuda:r). The choice,
against "every rank is a worker and the engine only schedules" (vLLM V1's multiprocess
executor): the sampler, the grammars, the proposer and async scheduling's on-device token
feedback all stay in the process that holds them, unchanged — a user's sampler instance or
pipeline stage need not be picklable, and logits [N, V] never cross a process boundary (the
LM head's vocabulary parts are gathered by the collective straight into rank 0's device
memory, where the sampler runs as at TP=1). Pooling likewise: rank 0's hidden states are
whole (all-reduced, then the replicated final norm), so `execute(hidden=True)` hands them to
the Runner's Pooler in this process. The scheduler, allocator and samplers see a
Runner whose `forward(batch)` returns logits as before. The price: the engine's process
takes part in the collectives, so a dead worker must never leave it blocked in one — gloo
fails the collective as soon as a peer's socket closes; for NCCL a monitor thread aborts the
communicator (`Group.abort`) when a worker's process ends, and the next step raises.

One step: the Runner prepares the batch as at TP=1 (rank 0's device); `execute` sends each
worker a `StepMsg` (layout host arrays, row counts, CUDA-graph bucket, block copies, and with
multi-LoRA the step's LoRAStep: each rank loads its own slices of the adapters the step puts
in slots, read from the adapter's folder through its own host cache, and fills its per-token
slot indices; rank 0's Runner applied the same plan to rank 0's LoRAState) and
then every rank runs `run_rank` (the ModelRunner TP=1 runs) in lockstep (broadcast of ids / positions / rows, the
forward with two all-reduces a layer, the logits gather). With async scheduling, step N + 1's
message goes out while the GPUs still run step N: rank 0's launch returns before its kernels
end, and the workers queue theirs just as early.

Errors. A worker that dies (any exit, e.g. SIGKILL) makes the next or the current step raise
`WorkerDiedError` naming its rank, pid and exit code (and the traceback it sent, if any); an
exception inside a step on rank 0 leaves the ranks out of step, so it too ends the workers.
Either way the LLM cannot go on (a shard is gone): close() it and build a new one. `close()`
stops the workers (stop message, join, kill after a timeout); a finalizer does it for an LLM
that is dropped without close().

Multi-node data-parallel serving (a later issue) would need from this design: (1) an engine
that is a self-contained unit — one scheduler + one TPExecutor per replica, already true, the
executor holds no process-global state (no default process group; its own TCPStore on an
ephemeral port), so R replicas can share a host given disjoint GPU sets (today rank r is
cuda:r: a replica would need a device list / CUDA_VISIBLE_DEVICES per replica) or live on
different nodes; (2) the rendezvous address generalised from 127.0.0.1 to a node address only
if one replica spans nodes (TP across nodes is not the aim: DP replicas each within a node
need nothing more); (3) the front door (e.g. a Ray Serve deployment or a router in front of
`AsyncEngine.build(process=True)` replicas) routing by load and, for prefix caching, by
prompt-prefix affinity — the replica's `StepRecord`s (KV blocks used / cached, queue lengths)
are the load signal it would read; (4) `ProcessCore` starting its engine process as
non-daemonic, because a daemonic process may not spawn the TP workers (today TP runs in the
notebook / script process, not under `AsyncEngine.build(process=True)`); (5) health: the
WorkerDiedError here is what a replica manager would turn into "restart this replica".
"""

from __future__ import annotations

import functools
import inspect
import logging
import multiprocessing.connection as mpc
import os
import signal
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable

import torch

from toolkit.parallel.shard import StepMsg, kv_blocks_fit, make_kv_and_attention, run_rank
from toolkit.parallel.worker import WorkerSpec, worker_main
from toolkit.worker.executor import ForwardOutput
from toolkit.worker.model_runner import ModelRunner

log = logging.getLogger(__name__)


class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker process ended while the engine needed it."""


def check_devices(size: int, device: str, device_count: int) -> None:
    """ValueError when N ranks do not fit the devices: one GPU per rank on CUDA."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"with tensor_parallel_size > 1 the device must be 'cuda' (rank r uses cuda:r) "
                         f"or 'cpu', got {device!r}")
    if device == "cuda" and size > device_count:
        raise ValueError(f"tensor_parallel_size={size} needs {size} GPUs (one per rank); "
                         f"{device_count} visible")


def check_attention_spec(attention: Any) -> None:
    """Each rank builds its own backend: a name, class or factory, never an instance."""
    if not (isinstance(attention, (str, type, functools.partial)) or inspect.isfunction(attention)):
        raise ValueError(f"with tensor_parallel_size > 1, attention must be a registered name, a class "
                         f"or a factory (each rank builds its own over its KV heads), got the instance "
                         f"{attention!r}")


class TPExecutor:
    def __init__(self, source: Any, *, size: int, dtype: torch.dtype, device: str, attention: Any,
                 load_format: str, block_size: int, num_blocks: int | None, kv_cache_bytes: int | None,
                 gpu_memory_utilization: float, cpu_kv_budget: int,
                 startup_timeout: float = 1800.0, collective_timeout: float = 600.0,
                 quantization: str | None = None, lora: Any = None,
                 profile_step: tuple[int, int] = (0, 0)) -> None:
        from toolkit.models.loader import load_config
        from toolkit.parallel.sharding import check_tensor_parallel

        if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
            source = str(Path(os.fsdecode(source)))
            config = load_config(source)
        elif hasattr(source, "to_dict") and hasattr(source, "model_type"):
            config, load_format = source, "dummy"
        else:
            raise ValueError(f"with tensor_parallel_size > 1 the model must be a Hugging Face folder or a "
                             f"transformers config (each rank loads its own shard), got "
                             f"{type(source).__name__}")
        check_tensor_parallel(config, size)
        check_devices(size, device, torch.cuda.device_count() if device == "cuda" else 0)
        check_attention_spec(attention)
        if torch.multiprocessing.current_process().daemon:
            raise RuntimeError("tensor_parallel_size > 1 cannot start its worker processes from a daemonic "
                               "process (e.g. AsyncEngine.build(process=True)'s engine process); run "
                               "AsyncEngine(LLM(..., tensor_parallel_size=N)) (the loop on a thread) instead")
        self.size, self.device = size, torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
        spec = WorkerSpec(source, load_format, dtype, device, attention, block_size, num_blocks,
                          kv_cache_bytes, gpu_memory_utilization, cpu_kv_budget,
                          threads=max(1, (os.cpu_count() or 1) // size), timeout_s=collective_timeout,
                          quantization=quantization, lora=lora.spec() if lora is not None else None,
                          profile_step=profile_step)
        self.lora = lora                 # rank 0's LoRAState (the Runner applies each step's plan)
        self.closed, self.error = False, None
        self.group = None
        self._dead: tuple[int, int | None] | None = None       # (rank, exit code) seen by the monitor
        ctx = torch.multiprocessing.get_context("spawn")
        import datetime

        timeout = datetime.timedelta(seconds=collective_timeout)
        self.store = torch.distributed.TCPStore("127.0.0.1", 0, size, True, timeout=timeout,
                                                wait_for_workers=False)
        self.procs, self.conns = [], []
        self._stop_r, self._stop_w = ctx.Pipe(duplex=False)
        self._finalizer = weakref.finalize(self, _stop_workers, self.procs, self.conns)
        for rank in range(1, size):
            parent, child = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=worker_main, args=(rank, size, self.store.port, child, spec),
                               daemon=True, name=f"toolkit-tp-rank{rank}")
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        try:
            self._start(spec, startup_timeout, timeout)
        except BaseException:
            self.close()
            raise
        self._monitor = threading.Thread(target=self._watch, name="toolkit-tp-monitor", daemon=True)
        self._monitor.start()

    def _start(self, spec: WorkerSpec, startup_timeout: float, timeout) -> None:
        from toolkit.parallel.group import make_group
        from toolkit.parallel.model import build_shard

        for rank in range(1, self.size):
            self._expect(rank, "hello", startup_timeout)
        self.group = make_group(self.store, 0, self.size, self.device, timeout)
        self.model = build_shard(spec.source, self.group, dtype=spec.dtype, device=self.device,
                                 load_format=spec.load_format, quantization=spec.quantization,
                                 linear_method=self.lora.linear_method() if self.lora is not None else None)
        if self.lora is not None:
            self.lora.attach(self.model)
        fits = [kv_blocks_fit(self.model, spec.block_size, spec.dtype, self.device, num_blocks=spec.num_blocks,
                              budget_bytes=spec.kv_cache_bytes,
                              gpu_memory_utilization=spec.gpu_memory_utilization,
                              cpu_budget=spec.cpu_kv_budget, profile_step=spec.profile_step)]
        fits += [self._expect(rank, "loaded", startup_timeout)[1] for rank in range(1, self.size)]
        num_blocks = min(fits)                  # one allocator: every rank the same block count
        if num_blocks < 2:
            raise ValueError(f"the KV-cache budget holds {num_blocks} blocks on some rank (per rank: "
                             f"{fits}); at least 2 are needed")
        for conn in self.conns:
            conn.send(("kv", num_blocks))
        self.kv_cache, self.attention = make_kv_and_attention(self.model, spec.attention, num_blocks,
                                                              spec.block_size, spec.dtype, self.device)
        for rank in range(1, self.size):
            self._expect(rank, "ready", startup_timeout)
        self.runner = ModelRunner(self.model, self.attention, self.kv_cache, self.device)
        log.info("tensor parallel: %d ranks over %s, %d KV blocks each", self.size, self.group.backend,
                 num_blocks)

    # -- the Executor contract (toolkit/worker/executor.py) --
    supports_hidden = True             # rank 0's hidden states are whole (the pooler reads them)
    local_lm_head = False              # the LM head's vocabulary parts are gathered in execute()
    single_process = False             # each rank runs its part of the forward in its own process
    # after call()'s fn failed on rank 0, how long the workers' replies are awaited: one still
    # silent then waits in a collective rank 0 never joined (the executor fails)
    stray_reply_s = 120.0

    @property
    def graphs(self) -> Any:
        return self.runner.graphs

    def execute(self, batch: Any, hidden: bool = False, logits: bool = True) -> ForwardOutput:
        """The logits [N, V] (logits=False: None) and the prompt-logprob rows' logits [P, V] of a
        prepared Batch; hidden=True: rank 0's hidden states [T, H] too (the Executor contract)."""
        self._check_alive()
        try:
            rows = batch.logits_indices if logits else batch.logits_indices[:0]   # N = 0: no gather
            msg = StepMsg.of(batch, len(rows))
            for conn in self.conns:
                conn.send(("step", msg))
            prompt_rows = torch.tensor(batch.prompt_rows or [], dtype=torch.int64).to(self.device, non_blocking=True)
            packed = torch.cat([batch.input_ids, batch.positions, rows, prompt_rows])
            x, prompt, h = run_rank(self.runner, self.group, msg, batch.layout, packed)
            return ForwardOutput(x if logits else None, prompt, h if hidden else None)
        except BaseException as e:
            self._fail(e)
            if isinstance(e, Exception):
                raise self.error from e
            raise                            # Ctrl-C stays Ctrl-C (the workers are stopped)

    def enable_cuda_graphs(self, max_tokens: int, full_tokens: int | None = None) -> Any:
        """Every rank captures its piecewise graphs (NCCL calls inside); rank 0's StepGraphs
        (the Runner pads steps to its buckets) or None where graphs do not apply."""
        self._check_alive()
        for conn in self.conns:
            conn.send(("graphs", max_tokens, full_tokens))
        return self.runner.graphs if self.runner.enable_cuda_graphs(max_tokens, full_tokens) else None

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = 600.0) -> list[Any]:
        """fn(ModelRunner, *args) on every rank (fn picklable: a module-level function), the
        results in rank order; a rank's exception raises RuntimeError naming it."""
        self._check_alive()
        for conn in self.conns:
            conn.send(("call", fn, args))
        try:
            results = [fn(self.runner, *args)]
        except BaseException as e:           # the workers' replies are read all the same, so
            try:                             # the next call does not take them for its own
                for rank in range(1, self.size):
                    self._expect(rank, "reply", min(timeout, self.stray_reply_s))
            except Exception:                # a worker waits in a collective rank 0 never joined
                self._fail(e)
                raise self.error from e
            raise
        for rank in range(1, self.size):
            _, ok, value = self._expect(rank, "reply", timeout)
            if not ok:
                raise RuntimeError(f"tensor-parallel worker {value}")
            results.append(value)
        return results

    # -- health --
    def _check_alive(self) -> None:
        if self.closed:
            raise RuntimeError("this tensor-parallel executor is closed")
        if self.error is not None:
            raise self.error
        dead = self._dead_rank()
        if dead is not None:
            self._fail(None, dead)
            raise self.error

    def _dead_rank(self, wait: float = 0.0) -> int | None:
        end = time.monotonic() + wait
        while True:
            for rank, proc in enumerate(self.procs, start=1):
                if proc.exitcode is not None:
                    return rank
            if time.monotonic() >= end:
                return None
            time.sleep(0.05)

    def _fail(self, exc: BaseException | None, dead: int | None = None) -> None:
        """After a failed step or a dead worker: record the error, end every worker (the
        ranks are out of step), so nothing is left waiting in a collective."""
        if self.error is not None:
            return
        dead = dead if dead is not None else self._dead_rank(wait=5.0 if exc is not None else 0.0)
        if dead is not None:
            self.error = WorkerDiedError(self._death_message(dead))
        else:
            self.error = RuntimeError(f"a tensor-parallel step failed on rank 0 ({type(exc).__name__}: "
                                      f"{exc}); the ranks are out of step, so the workers were stopped: "
                                      "close() this LLM and build a new one")
        self._kill_all()

    def _death_message(self, rank: int) -> str:
        proc, conn = self.procs[rank - 1], self.conns[rank - 1]
        code = proc.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            try:
                how += f" (killed by {signal.Signals(-code).name})"
            except ValueError:
                pass
        sent = ""
        try:
            while conn.poll(0):
                msg = conn.recv()
                if msg[0] == "failed":
                    sent = f"; it reported:\n{msg[1]}"
        except (EOFError, OSError):
            pass
        return (f"tensor-parallel worker rank {rank} (pid {proc.pid}) died with {how}{sent}; the engine "
                f"cannot go on without its shard: close() this LLM and build a new one")

    def _watch(self) -> None:
        """Monitor thread: a worker that ends while the executor is open is recorded, the other
        workers are ended, and an NCCL group is aborted so rank 0 is not left in a collective."""
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.procs, start=1)}
        ready = mpc.wait(list(sentinels) + [self._stop_r])
        if self._stop_r in ready or self.closed:
            return
        rank = next(sentinels[s] for s in ready if s in sentinels)
        self._dead = (rank, self.procs[rank - 1].exitcode)
        log.error("tensor-parallel worker rank %d exited (code %s)", rank, self._dead[1])
        for p in self.procs:
            if p.exitcode is None:
                p.kill()
        if self.group is not None and self.group.backend == "nccl":
            self.group.abort()       # gloo fails by itself when a peer's socket closes

    def _expect(self, rank: int, kind: str, timeout: float | None) -> tuple:
        conn, proc = self.conns[rank - 1], self.procs[rank - 1]
        if not mpc.wait([conn, proc.sentinel], timeout):
            raise RuntimeError(f"tensor-parallel worker rank {rank} sent no {kind!r} within {timeout} s")
        try:
            msg = conn.recv() if conn.poll(0) else None
        except (EOFError, OSError):
            msg = None
        if msg is None:
            proc.join(5)
            raise WorkerDiedError(self._death_message(rank))
        if msg[0] == "failed":
            raise RuntimeError(f"tensor-parallel worker {msg[1]}")
        if msg[0] != kind:
            raise RuntimeError(f"tensor-parallel worker rank {rank} sent {msg[0]!r}, expected {kind!r}")
        return msg

    def _kill_all(self) -> None:
        for p in self.procs:
            if p.exitcode is None:
                p.kill()
        for p in self.procs:
            p.join(10)

    def close(self) -> None:
        """Stop the workers (a stop message; killed after 30 s) and release the group."""
        if self.closed:
            return
        self.closed = True
        try:
            self._stop_w.send(None)          # the monitor returns
        except Exception:  # noqa: BLE001
            pass
        _stop_workers(self.procs, self.conns)
        if self.group is not None:           # the workers are gone: end the communicator here (local)
            self.group.abort()
            self.group = None
        self._finalizer.detach()

    def __repr__(self) -> str:
        alive = sum(p.exitcode is None for p in self.procs) + (not self.closed)
        backend = self.group.backend if self.group is not None else "closed"
        return f"TPExecutor(size={self.size}, backend={backend}, {alive} ranks alive)"


def _stop_workers(procs: list, conns: list, timeout: float = 30.0) -> None:
    """Ask each worker to stop, wait, kill what is left; close the pipes."""
    for conn, p in zip(conns, procs):
        if p.exitcode is None:
            try:
                conn.send(("stop",))
            except (OSError, ValueError):
                pass
    end = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
        if p.exitcode is None:
            log.warning("tensor-parallel worker %s did not stop within %.0f s; killing it", p.name, timeout)
            p.kill()
            p.join(10)
    for conn in conns:
        conn.close()

"""Block allocator throughput: operations per second of allocate / free / lookup / publish.

Two workloads over the same seeded request stream for every allocator (CPU only):
- "alloc/free": requests take 1-8 blocks and are freed oldest first (no hashing);
- "prefix serving": each request looks up its hash chain (16 shared system prompts of
  4 blocks + 1-4 private blocks), allocates the misses, publishes them, and is freed
  later (tail first); 64 requests live at a time.
Each call is timed on its own (perf_counter_ns; ~0.1 us of the figure is the timer);
"total" is all calls over their summed time.

    python -m benchmarks blocks [--ops 100000] [--num-blocks 4096]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from toolkit.blocks.free_list import FreeListAllocator
from toolkit.blocks.hashing import hash_blocks
from toolkit.blocks.prefix_caching import PrefixCachingAllocator
from toolkit.blocks.reference import ReferenceAllocator

OPS = ("allocate", "free", "lookup", "publish")


class Timed:
    """Wraps an allocator; sums the time and counts the calls of each operation."""

    def __init__(self, alloc: Any) -> None:
        self.alloc = alloc
        self.ns = dict.fromkeys(OPS, 0)
        self.calls = dict.fromkeys(OPS, 0)

    def __call__(self, op: str, *args: Any) -> Any:
        fn = getattr(self.alloc, op)
        t = time.perf_counter_ns()
        out = fn(*args)
        self.ns[op] += time.perf_counter_ns() - t
        self.calls[op] += 1
        return out

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())


def alloc_free(a: Timed, num_ops: int, seed: int) -> dict[str, float]:
    rng, live = random.Random(seed), deque()
    while a.total_calls < num_ops:
        n = rng.randint(1, 8)
        if n <= a.alloc.num_free_blocks() and (len(live) < 256 or rng.random() < 0.5):
            live.append(a("allocate", n))
        elif live:
            a("free", live.popleft())
    return {}


def prefix_serving(a: Timed, num_ops: int, seed: int, block_size: int) -> dict[str, float]:
    rng = random.Random(seed)
    prompts = [hash_blocks(list(range(p * 1000, p * 1000 + 4 * block_size)), block_size) for p in range(16)]
    live: deque[list[int]] = deque()
    hit = want = 0
    uid = 0
    while a.total_calls < num_ops:
        if len(live) >= 64:
            a("free", live.popleft()[::-1])
            continue
        uid += 1
        tail = [hash(("private", uid, i)) & (2**128 - 1) for i in range(rng.randint(1, 4))]
        hashes = rng.choice(prompts) + tail
        got = a("lookup", hashes)
        hit, want = hit + len(got), want + len(hashes)
        need = len(hashes) - len(got)
        if need > a.alloc.num_free_blocks():
            a("free", got[::-1])
            if live:
                a("free", live.popleft()[::-1])
            continue
        new = a("allocate", need)
        for b, h in zip(new, hashes[len(got):]):
            a("publish", b, h)
        live.append(got + new)
    return {"hit_rate": hit / max(want, 1)}


def run(num_ops: int, num_blocks: int, block_size: int, seed: int) -> list[dict[str, Any]]:
    factories: dict[str, Callable[[], Any]] = {
        "free_list": lambda: FreeListAllocator(num_blocks, block_size),
        "prefix_caching": lambda: PrefixCachingAllocator(num_blocks, block_size),
        "reference": lambda: ReferenceAllocator(num_blocks, block_size),
    }
    rows = []
    for workload in ("alloc/free", "prefix serving"):
        for name, make in factories.items():
            a = Timed(make())
            extra = (alloc_free(a, num_ops, seed) if workload == "alloc/free"
                     else prefix_serving(a, num_ops, seed, block_size))
            row: dict[str, Any] = {"allocator": name, "workload": workload, "ops": a.total_calls}
            for op in OPS:
                row[f"{op}_per_s"] = a.calls[op] / (a.ns[op] / 1e9) if a.calls[op] else None
            row["total_per_s"] = a.total_calls / (sum(a.ns.values()) / 1e9)
            row.update(extra)
            rows.append(row)
    return rows


def show(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Block allocator operations per second (CPU, one thread)")
    for col in ("workload", "allocator", *OPS, "total", "hit rate"):
        table.add_column(col, justify="left" if col in ("workload", "allocator") else "right")
    fmt = lambda v: "-" if v is None else f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.0f} k"
    for r in rows:
        table.add_row(r["workload"], r["allocator"], *(fmt(r[f"{op}_per_s"]) for op in OPS),
                      fmt(r["total_per_s"]), f"{r['hit_rate']:.0%}" if "hit_rate" in r else "-")
    Console(width=120).print(table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=100_000, help="operations per allocator and workload")
    p.add_argument("--num-blocks", type=int, default=4096)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    rows = run(args.ops, args.num_blocks, args.block_size, args.seed)
    show(rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"config": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()

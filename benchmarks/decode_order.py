"""A list-scheduling model of one decode launch: how the order of its programs sets the tail.

Each (sequence, KV head) program takes time proportional to its keys; the GPU starts programs
in grid order on the first free of `sms x per_sm` slots. The makespan over the ideal (all work
spread evenly) is printed for the grid's old order (rows fastest: all of KV head 0, then head 1,
in sequence order) and the new one (rows sorted most keys first, a row's KV heads together),
for nano-like ragged contexts. A model, not a timing: RESULTS (q) has the GPU's figures.

    python benchmarks/decode_order.py
"""

from __future__ import annotations

import heapq
import random


def makespan(works: list[int], slots: int) -> float:
    free = [0.0] * slots
    for w in works:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


def main() -> None:
    rng = random.Random(0)
    heads, sms, per_sm = 8, 132, 4
    print("batch  contexts    old order  longest first")
    for batch, lo, hi in [(256, 150, 1100), (192, 300, 1400), (128, 500, 1700), (96, 600, 1800)]:
        ctx = [rng.randint(lo, hi) for _ in range(batch)]
        slots = sms * per_sm
        ideal = sum(ctx) * heads / slots
        old = [c for _ in range(heads) for c in ctx]
        new = [c for c in sorted(ctx, reverse=True) for _ in range(heads)]
        print(f"{batch:5d}  {lo:4d}-{hi:<4d}   {makespan(old, slots) / ideal:9.2f}x  {makespan(new, slots) / ideal:12.2f}x")


if __name__ == "__main__":
    main()

"""A scheduler's HTML: its limits, its policy, and its queues (each request with its
computed / total tokens and blocks), for notebooks (`SchedulerCore._repr_html_`)."""

from __future__ import annotations

from typing import Any

from toolkit.display import bar, chips, html_table


def _entry(req: Any) -> str:
    return f"{req.request_id}: {req.num_computed_tokens}/{req.num_tokens} tok, {len(req.block_ids)} blk"


def scheduler_html(s: Any) -> str:
    """The scheduler's settings and its running / waiting queues, in queue order."""
    alloc = s.allocator
    used = alloc.num_blocks - alloc.num_free_blocks()
    rows = {
        "policy": repr(getattr(s, "policy", "built in")),
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "max_model_len": s.max_model_len,
        "prefix caching": s.kv.enable_prefix_caching,
        f"running ({len(s.running)})": chips([_entry(r) for r in s.running], "#bfdbfe"),
        f"waiting ({len(s.waiting)})": chips([_entry(r) for r in s.waiting], "#fde68a"),
        "KV blocks": bar([("in use", used, "#93c5fd")], alloc.num_blocks),
    }
    return html_table(type(s).__name__, rows, kind="scheduler")

"""Readable reprs for attention backends (any object with the AttentionBackend fields):
the head geometry, the options, the KV cache it reads, and the plan of the last step."""

from __future__ import annotations

from typing import Any


def attention_fields(backend: Any) -> dict[str, Any]:
    """name -> value: heads (query / KV), head_dim, scale, sliding_window, soft_cap, cache."""
    cache = getattr(backend, "kv_cache", None)
    fields = {"heads": f"{backend.num_heads} query / {backend.num_kv_heads} KV",
              "head_dim": backend.head_dim, "scale": round(float(backend.scale), 6),
              "sliding_window": backend.sliding_window, "soft_cap": backend.soft_cap}
    if cache is not None:
        fields["kv cache"] = (f"{cache.num_layers} layers x {cache.num_blocks} blocks x "
                              f"{cache.block_size} tokens, {cache.dtype} on {cache.device}")
    layout = getattr(backend, "layout", None)
    fields["planned"] = ("no" if layout is None else
                         f"{layout.num_seqs} sequences, {layout.num_tokens} query tokens")
    return fields


def attention_repr(backend: Any, extra: str = "") -> str:
    f = attention_fields(backend)
    opts = "".join(f", {k}={f[k]}" for k in ("sliding_window", "soft_cap") if f[k] is not None)
    return (f"{type(backend).__name__}(heads={backend.num_heads}/{backend.num_kv_heads}, "
            f"d={backend.head_dim}{opts}, planned={f['planned']}{extra})")


def attention_html(backend: Any, extra: dict[str, Any] | None = None) -> str:
    from toolkit.display import html_table

    return html_table(type(backend).__name__, {**attention_fields(backend), **(extra or {})},
                      kind="attention")

"""What `repr(llm)`, `repr(llm.engine)` and their `_repr_html_` show: the parts and the
live state (queues, KV blocks, steps). One place, so the LLM and the Engine agree."""

from __future__ import annotations

from typing import Any

from toolkit.display import Raw, bar, html_table


def _html_or_repr(part: Any) -> Any:
    """A part's own HTML when it has one, else its repr."""
    if hasattr(part, "_repr_html_"):
        try:
            return Raw(part._repr_html_())
        except Exception:                  # a user's part whose HTML fails: show its repr
            pass
    return repr(part)


def engine_rows(engine: Any, html: bool) -> dict[str, Any]:
    """name -> value of an open engine: model, parts, KV cache, state, counters."""
    model = engine.model
    spec = model.spec
    model_desc = (f"{type(model).__name__} ({spec.architecture}, {spec.num_layers} layers, "
                  f"vocab {spec.vocab_size}, {spec.dtype} on {getattr(model, 'device', '?')})")
    show = _html_or_repr if html else repr
    r = engine.runner
    alloc = engine.allocator
    used = alloc.num_blocks - alloc.num_free_blocks()
    cached = alloc.num_cached_blocks()        # held or evictable: may overlap the blocks in use
    kv = (Raw(f"{bar([('in use', used, '#93c5fd')], alloc.num_blocks)} {cached} hold a cached prefix")
          if html else f"{used}/{alloc.num_blocks} blocks in use, {cached} hold a cached prefix")
    rows = {
        "model": model_desc,
        "scheduler": show(engine.scheduler),
        "allocator": repr(alloc),
        "sampler": show(r.sampler),
        "attention": show(r.attention),
        "kv cache": repr(r.kv_cache) + (f"; lossy, {cost}" if (cost := _fp8_cost(r.kv_cache)) else ""),
        "kv blocks": kv,
        "max_model_len": engine.max_model_len,
        "async scheduling": engine.async_scheduling,
        "steps run": engine.num_steps,
        "preemptions": engine.num_preemptions,
        "observers": len(engine.observers),
    }
    if engine.proposer is not None:
        rows["proposer"] = f"{engine.proposer!r}, k={engine.num_spec_tokens}"
    sleep = getattr(engine, "sleep_mode", None)
    if sleep is not None and (sleep.enabled or sleep.is_sleeping()):
        rows["sleep mode"] = repr(sleep)
    if (quant := _quantization(model)):
        rows["quantization"] = quant
    return rows


def engine_repr(engine: Any, name: str = "Engine") -> str:
    if engine is None or engine.closed:
        return f"{name}(closed)"
    r = engine.runner
    alloc = engine.allocator
    cost = _fp8_cost(r.kv_cache)
    fp8 = f", kv_cache_dtype=fp8 ({cost})" if cost else ""
    return (f"{name}(model={type(engine.model).__name__}, scheduler={type(engine.scheduler).__name__}, "
            f"allocator={type(alloc).__name__}, attention={type(r.attention).__name__}, "
            f"sampler={type(r.sampler).__name__}, kv={r.kv_cache.num_blocks}x{r.kv_cache.block_size} "
            f"tokens{fp8}{_quantization(engine.model, short=True)}, "
            f"running={_count(engine.scheduler, 'num_running')}, "
            f"waiting={_count(engine.scheduler, 'num_waiting')}, steps={engine.num_steps}"
            + (f", {engine.sleep_mode!r}" if getattr(engine, "sleep_mode", None) is not None
               and engine.sleep_mode.is_sleeping() else "") + ")")


def engine_html(engine: Any, name: str = "Engine") -> str:
    if engine is None or engine.closed:
        return html_table(name, {"state": "closed"}, kind=name.lower())
    return html_table(name, engine_rows(engine, html=True), kind=name.lower())


def _quantization(model: Any, short: bool = False) -> str:
    """The model's quantized-weight scheme and its measured cost (quantization/measured.py); ''
    for dense weights."""
    scheme = getattr(model, "quantization_scheme", None)
    if scheme is None:
        return ""
    from toolkit.models.quantization.measured import measured_cost

    if short:
        return f", quantization={scheme.method} ({measured_cost(scheme, short=True)})"
    return f"{scheme.method}: {scheme.label}; lossy, {measured_cost(scheme)}"


def _fp8_cost(kv_cache: Any) -> str:
    """What an fp8 KV cache costs, as measured (toolkit/worker/kv_scales.py); '' otherwise."""
    if not getattr(kv_cache, "is_fp8", False):
        return ""
    from toolkit.worker.kv_scales import MEASURED_COST

    return MEASURED_COST


def _count(scheduler: Any, name: str) -> Any:
    return getattr(scheduler, name, "?")

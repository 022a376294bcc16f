"""The proxy of prefill/decode disaggregation, in one process: each request is prefilled on
a producer engine (max_tokens=1), then continued on a consumer engine from the handed-off KV.

    outs = disaggregated_generate(producer.engine, consumer.engine, prompts, params)

Both engines run a PDConnector over one store (kv_role "kv_producer" / "kv_consumer"). The
producer prefills every prompt (its batch), the handoffs land in the store (the producer
steps until its saves are done), then the consumer runs every continuation (its batch).
Returns per prompt the output token ids: the producer's first token, then the consumer's.

A greedy request without penalties is handed off with its first token (`handoff_request`:
the consumer computes nothing of the prompt again). Any other request is sent as the prompt
alone, as vLLM's proxy does: the consumer loads all but the last prompt token, computes that
one and samples the first token itself, so a seed's draws and the penalties' counts run on
one engine from the first token, and the output equals the co-located engine's. The HTTP
form, across two processes, is toolkit/kv_transfer/http_proxy.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from toolkit.kv_transfer.pd import handoff_request


def _drain(engine: Any) -> dict[str, list[int]]:
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                done[o.request_id] = list(o.outputs[0].token_ids)
    return done


def disaggregated_generate(producer: Any, consumer: Any, prompts: Sequence[Sequence[int]], params: Any,
                           *, prefix: str = "pd") -> list[list[int]]:
    if params.n != 1 or params.best_of not in (None, 1):
        raise ValueError("disaggregated_generate runs one sample per prompt (n=1, no best_of)")
    ids = [f"{prefix}-{i}" for i in range(len(prompts))]
    first_params = dataclasses.replace(params, max_tokens=1)
    for rid, p in zip(ids, prompts):
        producer.add_request(list(p), first_params, request_id=rid, output_kind="final")
    first = _drain(producer)                       # includes the saves of the handoffs
    outs: dict[str, list[int]] = {}               # finished on the producer
    resampled: set[str] = set()                   # sent as the prompt alone
    for rid, p in zip(ids, prompts):
        toks = first[rid]
        stopped = toks and (toks[-1] == producer.eos_token_id and not params.ignore_eos
                            or toks[-1] in (params.stop_token_ids or ()))
        if params.max_tokens == 1 or stopped:
            outs[rid] = toks
            continue
        if _plain_greedy(params):
            cont, cparams = handoff_request(p, params, toks[0])
        else:                                      # the consumer samples the first token again
            cont, cparams = list(p), params
            resampled.add(rid)
        consumer.add_request(cont, cparams, request_id=rid, output_kind="final")
    rest = _drain(consumer)
    return [outs[rid] if rid in outs else rest[rid] if rid in resampled else first[rid] + rest[rid]
            for rid in ids]


def _plain_greedy(params: Any) -> bool:
    """Whether the output after the first token depends only on the tokens so far: greedy,
    and nothing that must see the first token as output (a penalty's counts, a bad word's
    start, a grammar's state). Then the first token can be handed over."""
    return (params.temperature == 0 and not params.presence_penalty and not params.frequency_penalty
            and params.repetition_penalty in (None, 1.0) and not params.bad_words
            and params.structured is None and params.guided_decoding is None
            and params.structured_outputs is None)

"""Which rows of a step made its sampler raise (issue 54 item 6).

A user's sampler stage or logits processor that raises for one request's row would end every
request of the step. When the whole-step call raises, the runner samples each row alone from
the same logits (tokens discarded: the step is abandoned either way) and reports the rows
that raise again as a RequestFault of their requests; the engine's loops end only those, and
the others are scheduled again (their tokens are granted again, as no scheduler update ran).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from toolkit.samplers.base import SamplingMetadata
from toolkit.types import RequestFault


def row_metadata(meta: SamplingMetadata, i: int) -> SamplingMetadata:
    """Row i of a step's metadata, built again from its host views (and its grammar mask)."""
    mask = None
    if meta.bitmask is not None:
        j = int(meta.bitmask_rows[i]) if meta.bitmask_rows is not None else i
        mask = meta.bitmask[j:j + 1]                 # [1, ceil(V/32)]
    return SamplingMetadata.build([meta.params[i]], [meta.prompt_token_ids[i]], [meta.output_token_ids[i]],
                                  meta.vocab_size, meta.device, eos_token_ids=[meta.eos_token_ids[i]],
                                  bitmask=mask, check_ids=False)


def attribute_fault(sampler: Callable[..., Any], logits: torch.Tensor, meta: SamplingMetadata,
                    request_ids: Sequence[str], error: BaseException) -> BaseException:
    """A RequestFault naming the requests whose row alone makes `sampler` raise, or `error`
    itself when none does or every one does (a sampler broken for all, or a fault of the
    batch as a whole: the old behaviour, every request ends). logits: [N, V], row i for
    request_ids[i]; a sampler that consumed them in place sees its own output again, which
    only decides who is blamed, never a token."""
    bad = []
    for i, rid in enumerate(request_ids):
        try:
            sampler(logits[i:i + 1].clone(), row_metadata(meta, i))
        except Exception:                    # noqa: BLE001 - any error of this row blames it
            bad.append(rid)
    if not bad or len(bad) == len(request_ids):
        return error
    return RequestFault(bad, f"sampling failed for request(s) {bad}: {type(error).__name__}: {error}")

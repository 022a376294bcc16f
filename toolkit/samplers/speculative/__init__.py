"""Speculative decoding: proposers draft k tokens per request, the rejection sampler verifies
them against the target's distribution in one forward (Leviathan et al., arXiv 2211.17192).

base.py      Draft, Proposer protocol, draft_budget (how many drafts a request can use)
ngram.py     prompt-lookup proposer (no model)
draft.py     draft-model proposer with its own paged KV (same block ids as the target)
truncate.py  truncated_model(model, n): the first n layers of a target, weights shared
oracle.py    benchmark proposer with a set acceptance rate
rejection.py SpecDecodeMetadata + RejectionSampler (the verifier; Triton or float64 twin)
metrics.py   drafted / accepted / acceptance rate / mean emitted per verification step
"""

from toolkit.samplers.speculative.base import Draft, Proposer, draft_budget

__all__ = ["Draft", "Proposer", "draft_budget"]

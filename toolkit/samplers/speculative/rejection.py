"""The verifier: target logits of every draft position (+ the bonus position) -> emitted tokens.

Row layout (the runner's): request b owns 1 + k_b consecutive logits rows; row j of it is the
target's prediction after its output + drafts[:j], so rows 0..k_b-1 verify drafts 0..k_b-1 and
row k_b is the bonus position. The target distribution p of a row is exactly what the sampler
would sample from: softmax of `Sampler.process(logits, meta)` (penalties, bans, temperature,
min_p, top_k, top_p); greedy rows use argmax of the processed logits (ties -> lowest id), as
the sampler does. Noise keys are the sampler's (`Sampler.keys`): seeded rows stay seeded.

The result stays on the device ([B, k_max + 1] padded with -1, plus counts); the engine makes
the step's one host transfer with `SpecSamplerOutput.tolist()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from toolkit.kernels import reference_spec
from toolkit.samplers.base import SamplingMetadata
from toolkit.transfer import to_device


@dataclass
class SpecDecodeMetadata:
    """The drafts being verified this step, one entry per sampling request in row order."""

    num_draft_tokens: list[int]          # host [B]: k_b (0 = a plain decode row)
    num_draft_tokens_t: Tensor           # int32 [B] on the device
    draft_token_ids: Tensor              # int64 [D], D = sum k_b
    draft_probs: Tensor | None           # float32 [D, V], or None: every draft is one-hot
    row_starts: Tensor                   # int64 [B]: first logits row of each request
    max_num_draft_tokens: int            # host: max k_b (sizes the output)

    @property
    def num_rows(self) -> int:
        return sum(self.num_draft_tokens) + len(self.num_draft_tokens)

    @classmethod
    def build(cls, draft_token_ids: Sequence[Sequence[int]], vocab_size: int,
              device: torch.device | str = "cpu",
              draft_probs: Sequence[Tensor | None] | None = None) -> SpecDecodeMetadata:
        """draft_token_ids[b]: the drafts request b verifies (may be empty); draft_probs[b]:
        float32 [len(draft_token_ids[b]), V] or None (one-hot). A mix is allowed: rows
        without probs get a one-hot row."""
        device = torch.device(device)
        ks = [len(d) for d in draft_token_ids]
        flat = [int(t) for d in draft_token_ids for t in d]
        bad = [t for t in flat if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"draft token ids must be in [0, {vocab_size}), got {bad[:5]}")
        probs = None
        if draft_probs is not None and any(p is not None for p in draft_probs):
            if len(draft_probs) != len(ks):
                raise ValueError(f"draft_probs needs one entry (tensor or None) per request: "
                                 f"{len(ks)}, got {len(draft_probs)}")
            rows = []
            for b, (d, p) in enumerate(zip(draft_token_ids, draft_probs)):
                if p is None:
                    p = torch.zeros(len(d), vocab_size, dtype=torch.float32)
                    p[torch.arange(len(d)), torch.as_tensor(list(d), dtype=torch.int64)] = 1.0
                if tuple(p.shape) != (len(d), vocab_size):
                    raise ValueError(f"draft_probs[{b}] must be [{len(d)}, {vocab_size}], "
                                     f"got {list(p.shape)}")
                rows.append(p.to(device=device, dtype=torch.float32))
            probs = torch.cat(rows).contiguous()
        k_t = torch.tensor(ks, dtype=torch.int32)
        return cls(
            num_draft_tokens=ks, num_draft_tokens_t=to_device(k_t, device),
            draft_token_ids=to_device(torch.tensor(flat, dtype=torch.int64), device),
            draft_probs=probs, row_starts=to_device(reference_spec.spec_row_starts(k_t), device),
            max_num_draft_tokens=max(ks, default=0))


@dataclass
class SpecSamplerOutput:
    token_ids: Tensor       # int64 [B, k_max + 1]: accepted drafts, then one more; -1 padding
    num_emitted: Tensor     # int32 [B]: accepted + 1
    num_draft_tokens: list[int]   # host [B], copied from the metadata (for metrics)

    def tolist(self) -> list[list[int]]:
        """The emitted tokens per request, with one device->host transfer."""
        both = torch.cat([self.num_emitted[:, None].to(torch.int64), self.token_ids], dim=1).tolist()
        return [row[1:1 + row[0]] for row in both]


def target_probs(processed: Tensor) -> Tensor:
    """softmax of processed logits float32 [R, V]; a row with no finite logit -> all zeros."""
    p = torch.softmax(processed.float(), dim=-1)
    return torch.nan_to_num(p, nan=0.0)


class RejectionSampler:
    """Verifies drafts against the target sampler's distribution.

    sampler: the engine's `toolkit.samplers.pipeline.Sampler` (its stages and generator define
    p and the noise keys); use_triton: None = the Triton kernel on CUDA, the twin elsewhere.
    """

    def __init__(self, sampler=None, *, use_triton: bool | None = None) -> None:
        if sampler is None:
            from toolkit.samplers.pipeline import Sampler

            sampler = Sampler()
        if not (hasattr(sampler, "process") and hasattr(sampler, "keys")):
            raise ValueError("RejectionSampler needs a sampler with process(logits, meta) and "
                             f"keys(meta, generator), like toolkit.samplers.pipeline.Sampler; "
                             f"got {type(sampler).__name__}")
        self.sampler, self.use_triton = sampler, use_triton

    def __call__(self, logits: Tensor, meta: SamplingMetadata, spec: SpecDecodeMetadata,
                 generator: torch.Generator | None = None) -> SpecSamplerOutput:
        """logits float32 [R, V] (R = sum (1 + k_b), the runner's rows) -> SpecSamplerOutput."""
        if logits.shape[0] != spec.num_rows or meta.num_rows != spec.num_rows:
            raise ValueError(f"the drafts need sum(1 + k_b) = {spec.num_rows} rows; got logits "
                             f"with {logits.shape[0]} and metadata with {meta.num_rows}")
        processed = self.sampler.process(logits, meta)                  # [R, V], -inf = excluded
        argmax = torch.argmax(processed, dim=-1)                         # [R] the sampler's greedy
        probs = target_probs(processed)                                  # [R, V]
        keys = self.sampler.keys(meta, generator)                        # [R]
        greedy = meta.greedy[spec.row_starts]                            # [B]
        return self.verify(probs, spec, keys, greedy, argmax)

    def verify(self, probs: Tensor, spec: SpecDecodeMetadata, keys: Tensor, greedy: Tensor,
               target_argmax: Tensor | None = None) -> SpecSamplerOutput:
        """Rejection sampling on given target probs float32 [R, V] (no sampler stages)."""
        fast = probs.is_cuda if self.use_triton is None else self.use_triton
        if fast:
            from toolkit.kernels.rejection_sample import rejection_sample
        else:
            rejection_sample = reference_spec.rejection_sample
        tokens, counts = rejection_sample(
            probs.contiguous(), spec.draft_token_ids, spec.draft_probs, spec.num_draft_tokens_t,
            keys, greedy, spec.max_num_draft_tokens, target_argmax)
        return SpecSamplerOutput(tokens, counts, list(spec.num_draft_tokens))

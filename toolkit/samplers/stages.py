"""The fast sampler's stages: batched logits transforms, one small class each.

A stage is any object with a `name` and `__call__(logits float32 [N, V], meta) -> [N, V]`;
it may work in place and returns the result. It may also say, by `active(meta) -> bool`,
that it leaves this batch as it is (the sampler then skips it; a stage without `active` is
always run). The tail temperature -> min_p -> top_k -> top_p is fused with the race into one
kernel by the sampler (`truncated_sample`) when the pipeline ends with these stages.
A stage branches only on host metadata (a field is None when no row uses the stage), never on
tensor values, so no stage syncs the host.
Rows that do not use a stage carry its neutral value (top_k 0, top_p 1, penalty 1 / 0, ...).
"""

from __future__ import annotations

import importlib
from typing import Callable, Protocol, runtime_checkable

import torch
from torch import Tensor

from toolkit.kernels import reference_sampling
from toolkit.samplers.base import SamplingMetadata

_KERNEL_MODULE = {
    "top_k_top_p_threshold": "toolkit.kernels.top_k_top_p",
    "gumbel_sample": "toolkit.kernels.gumbel_sample",
    "apply_token_bitmask": "toolkit.kernels.apply_bitmask",
    "truncated_sample": "toolkit.kernels.truncated_sample",
    "kth_largest": "toolkit.kernels.kth_largest",
    "apply_penalties": "toolkit.kernels.penalties",
    "gather_logprobs": "toolkit.kernels.logprobs",
}


def kernel(name: str, logits: Tensor, use_triton: bool | None) -> Callable:
    """The Triton op on CUDA (or when forced), else its torch twin of the same signature."""
    if logits.is_cuda if use_triton is None else use_triton:
        return getattr(importlib.import_module(_KERNEL_MODULE[name]), name)
    if name in ("truncated_sample", "gumbel_sample"):   # the twin's tokens, noise only where kept
        return getattr(importlib.import_module("toolkit.samplers.cpu_tail"), name)
    return getattr(reference_sampling, name)


@runtime_checkable
class Stage(Protocol):
    name: str

    def __call__(self, logits: Tensor, meta: SamplingMetadata) -> Tensor: ...


class _KernelStage:
    field: str = ""          # the metadata field that is None when no row uses the stage

    def __init__(self, use_triton: bool | None = None) -> None:
        self.use_triton = use_triton

    def active(self, meta: SamplingMetadata) -> bool:
        return getattr(meta, self.field) is not None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Penalties(_KernelStage):
    """Repetition (prompt + output tokens; divide positive logits, multiply negative ones),
    then frequency (x count in the output) and presence (once if in the output)."""

    name = "penalties"
    field = "repetition_penalty"

    def __call__(self, logits: Tensor, meta: SamplingMetadata) -> Tensor:
        if meta.repetition_penalty is None:
            return logits
        return kernel("apply_penalties", logits, self.use_triton)(
            logits, meta.prompt_tokens, meta.output_tokens, meta.repetition_penalty,
            meta.frequency_penalty, meta.presence_penalty, meta.penalty_rows)


class LogitBias(_KernelStage):
    name = "logit_bias"
    field = "bias"

    def __call__(self, logits: Tensor, meta: SamplingMetadata) -> Tensor:
        if meta.bias is None:
            return logits
        rows, toks, vals = meta.bias
        return logits.index_put_((rows, toks), vals, accumulate=True)


class _MaskStage(_KernelStage):
    """-inf where the bit of the packed int32 bitmask `meta.<field>` is 0."""

    rows_field: str | None = None        # meta.<rows_field>: per-row indices into the mask

    def __call__(self, logits: Tensor, meta: SamplingMetadata) -> Tensor:
        mask = getattr(meta, self.field)
        if mask is not None:
            rows = getattr(meta, self.rows_field) if self.rows_field else None
            kernel("apply_token_bitmask", logits, self.use_triton)(logits, mask, rows)
        return logits


class AllowedTokens(_MaskStage):
    """allowed_token_ids, packed on the host (rows without a list: all ones)."""

    name = "allowed_token_ids"
    field = "allowed_bitmask"


class _BanStage(_KernelStage):
    field: str

    def __call__(self, logits: Tensor, meta: SamplingMetadata) -> Tensor:
        pairs = getattr(meta, self.field)
        if pairs is None:
            return logits
        return logits.index_put_(pairs, torch.tensor(float("-inf"), device=logits.device))


class BadWords(_BanStage):
    """The last token of a bad word whose prefix ends the output (pairs built on the host)."""

    name = "bad_words"
    field = "bad_words"


class MinTokens(_BanStage):
    """EOS (unless ignore_eos) and stop_token_ids while fewer than min_tokens outputs exist."""

    name = "min_tokens"
    field = "min_tokens"


class GrammarBitmask(_MaskStage):
    """The grammar's packed bitmask (meta.bitmask, through meta.bitmask_rows when it is a
    table of grammar-state rows): -inf where the bit is 0."""

    name = "bitmask"
    field = "bitmask"
    rows_field = "bitmask_rows"


class Temperature(_KernelStage):
    """logits / T; greedy rows (T = 0) are left as they are (they take the argmax)."""

    name = "temperature"

    def active(self, meta: SamplingMetadata) -> bool:
        return not meta.all_greedy

    def __call__(self, logits: Tensor, meta: SamplingMetadata) -> Tensor:
        if meta.all_greedy:
            return logits
        t = torch.where(meta.greedy, torch.ones_like(meta.temperature), meta.temperature)
        return logits.div_(t[:, None])


class MinP(_KernelStage):
    """Drop tokens with p < min_p * p_max, i.e. logit < max logit + log(min_p)."""

    name = "min_p"
    field = "min_p"

    def __call__(self, logits: Tensor, meta: SamplingMetadata) -> Tensor:
        if meta.min_p is None:
            return logits
        cut = logits.amax(dim=-1) + torch.log(meta.min_p)                 # [N]; min_p 0 -> -inf
        return logits.masked_fill_(logits < cut[:, None], float("-inf"))


class _ThresholdStage(_KernelStage):
    def _cut(self, logits: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
        t = kernel("top_k_top_p_threshold", logits, self.use_triton)(logits, top_k, top_p)  # [N]
        return logits.masked_fill_(logits < t[:, None], float("-inf"))


class TopK(_ThresholdStage):
    """Keep the k largest logits; ties at the k-th value are all kept."""

    name = "top_k"
    field = "top_k"

    def __call__(self, logits: Tensor, meta: SamplingMetadata) -> Tensor:
        if meta.top_k is None:
            return logits
        return self._cut(logits, meta.top_k, torch.ones(meta.num_rows, device=logits.device))


class TopP(_ThresholdStage):
    """Keep the smallest set of most likely tokens with mass >= top_p; ties at the cut kept."""

    name = "top_p"
    field = "top_p"

    def __call__(self, logits: Tensor, meta: SamplingMetadata) -> Tensor:
        if meta.top_p is None:
            return logits
        zeros = torch.zeros(meta.num_rows, dtype=torch.int64, device=logits.device)
        return self._cut(logits, zeros, meta.top_p)


# the stages the sampler may fuse with the race, in the only order it fuses them
FUSED_TAIL = (Temperature, MinP, TopK, TopP)

# stages that change only the rows their parameters name, as SamplingMetadata.build counts
# them for `logprob_changed_rows` (the sampler saves those rows' raw logits alone)
ROW_SCOPED = (Penalties, LogitBias, AllowedTokens, BadWords, MinTokens, GrammarBitmask)


def fusable_tail(stages: list[Stage]) -> int:
    """Index where the pipeline's fusable tail starts (len(stages): none). The tail is a
    suffix of stages of exactly the FUSED_TAIL classes, in FUSED_TAIL's order."""
    i, rank = len(stages), len(FUSED_TAIL)
    while i > 0 and type(stages[i - 1]) in FUSED_TAIL:
        r = FUSED_TAIL.index(type(stages[i - 1]))
        if r >= rank:
            break
        i, rank = i - 1, r
    return i


def default_stages(use_triton: bool | None = None) -> list[Stage]:
    """The fixed order: penalties -> bias / allowed / bad words / min_tokens / grammar bitmask
    -> temperature -> min_p -> top_k -> top_p."""
    kinds = (Penalties, LogitBias, AllowedTokens, BadWords, MinTokens, GrammarBitmask,
             Temperature, MinP, TopK, TopP)
    return [k(use_triton) for k in kinds]

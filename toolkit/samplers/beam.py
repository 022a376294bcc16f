"""One beam-search step over next-token logprobs: a pure function the engine's loop calls.

Candidates are every (beam, token) extension scored by cumulative logprob; the step keeps
the best `num_candidates` of them (Hugging Face keeps 2 x num_beams so that beams ending in
EOS can be set aside and num_beams live ones remain). Ties go to the lower beam, then the
lower token id, so the result is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class BeamStep:
    parents: Tensor      # int64 [C]: index of the beam each candidate extends
    tokens: Tensor       # int64 [C]: the token appended
    scores: Tensor       # float [C]: cumulative logprob after the token, best first


def beam_search_step(cum_logprobs: Tensor, logprobs: Tensor, num_candidates: int) -> BeamStep:
    """cum_logprobs float [B] (of the live beams), logprobs float [B, V] (next token) -> the best
    num_candidates extensions (fewer if B * V is smaller), sorted by score, best first."""
    if logprobs.dim() != 2 or cum_logprobs.shape != logprobs.shape[:1]:
        raise ValueError(f"need cum_logprobs [B] and logprobs [B, V]; got "
                         f"{list(cum_logprobs.shape)} and {list(logprobs.shape)}")
    if num_candidates < 1:
        raise ValueError(f"num_candidates must be >= 1, got {num_candidates}")
    v = logprobs.shape[1]
    flat = (cum_logprobs[:, None] + logprobs).reshape(-1)                 # [B * V], beam-major
    order = flat.sort(descending=True, stable=True).indices[:num_candidates]   # ties: lower index
    return BeamStep(order // v, order % v, flat[order])


def length_normalized(cum_logprob: float, length: int, length_penalty: float = 1.0) -> float:
    """Hugging Face's final beam score: cum_logprob / length ** length_penalty."""
    return cum_logprob / (length ** length_penalty)

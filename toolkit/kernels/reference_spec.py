"""Float64 torch twin of the rejection-sampling kernel (kernels/rejection_sample.py).

Speculative decoding's verifier (Leviathan et al., arXiv 2211.17192), batched over requests.
Request b verifies k_b draft tokens; its target rows are row_start[b] .. row_start[b] + k_b
(k_b draft positions, then the bonus position), its draft rows row_start[b] - b .. + k_b - 1.

Random path, per draft position j (while every earlier draft was accepted):
  accept x_j with probability min(1, p_j(x_j) / q_j(x_j))   <=>   u_j * q_j(x_j) < p_j(x_j);
  at the first rejection emit a sample of normalize(max(p_j - q_j, 0)) and stop;
  when all k_b are accepted emit a sample of p at the bonus row.
A draft without probabilities is one-hot: q_j = e_{x_j}. A residual with no mass (p == q up to
rounding) falls back to p. Greedy path: accept while x_j == argmax p_j, then emit the argmax at the
first mismatch (or at the bonus row).

Randomness is counter-based, like the sampler's: every target row has an int64 key; the acceptance
uniform of row r is the hash of (key_r, ACCEPT_SALT), and a sample from weights w of row r is
argmax_v(log w_v + G_v) with Gumbel noise G_v from the hash of (key_r, v) (exponential race: no
normalisation, no host sync). The Triton kernel computes the same hashes bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from toolkit.kernels.reference_sampling import hash_uniform_bits

# token id of the acceptance uniform's hash: outside every vocabulary, so independent of the noise
ACCEPT_SALT = 0xFFFFFFFF


def _uniform64(keys: Tensor, token_ids: Tensor) -> Tensor:
    """u in (0, 1), float64, from keys int64 [..., 1] x token ids int64 [..., V] -> [..., V]."""
    bits = hash_uniform_bits(keys, token_ids)
    return (bits.to(torch.float64) + 0.5) * (1.0 / 4294967296.0)


def race_sample(weights: Tensor, keys: Tensor) -> Tensor:
    """One sample per row of the (unnormalised) non-negative weights float64 [M, V], keys int64 [M].

    argmax(log w + Gumbel); ties -> lowest id; a row without mass gives 0.
    """
    ids = torch.arange(weights.shape[1], device=weights.device, dtype=torch.int64)[None, :]
    g = -torch.log(-torch.log(_uniform64(keys[:, None], ids)))         # [M, V] Gumbel(0, 1)
    score = torch.log(weights) + g                                     # log 0 = -inf: never wins
    return torch.argmax(score, dim=-1)


def spec_row_starts(num_draft_tokens: Tensor) -> Tensor:
    """First target row of each request: int64 [B] exclusive cumsum of (k_b + 1)."""
    n = num_draft_tokens.to(torch.int64) + 1
    return torch.cumsum(n, 0) - n


def rejection_sample(
    target_probs: Tensor,               # float32 [R, V], R = sum_b (k_b + 1): drafts, then bonus
    draft_token_ids: Tensor,            # int64 [D], D = sum_b k_b (request-major)
    draft_probs: Tensor | None,         # float32 [D, V] draft distributions, or None (one-hot)
    num_draft_tokens: Tensor,           # int32 [B] k_b >= 0
    keys: Tensor,                       # int64 [R] noise key of each target row
    greedy: Tensor,                     # bool [B] greedy requests
    max_num_draft_tokens: int,          # host int >= max k_b: sizes the output without a sync
    target_argmax: Tensor | None = None,  # int64 [R] greedy token of each row (default argmax p)
) -> tuple[Tensor, Tensor]:
    """-> (tokens int64 [B, max_num_draft_tokens + 1] padded with -1, num_emitted int32 [B]).

    Row b emits its accepted drafts then one recovered-or-bonus token: num_emitted = accepted + 1.
    """
    dev = target_probs.device
    b_n, k_max = num_draft_tokens.shape[0], max_num_draft_tokens
    k = num_draft_tokens.to(torch.int64)                               # [B]
    row0 = spec_row_starts(num_draft_tokens)                           # [B]
    draft0 = row0 - torch.arange(b_n, device=dev)                      # [B]
    p = target_probs.to(torch.float64)
    if draft_probs is not None and draft_probs.shape[0] == 0:
        draft_probs = None                                             # no drafts at all: nothing to read
    if target_argmax is None:
        target_argmax = torch.argmax(target_probs, dim=-1)
    j = torch.arange(k_max, device=dev)[None, :]                       # [1, K]
    valid = j < k[:, None]                                             # [B, K]
    rows = torch.where(valid, row0[:, None] + j, 0)                    # [B, K] target rows
    drows = torch.where(valid, draft0[:, None] + j, 0)                 # [B, K] draft rows
    x = draft_token_ids[drows] if draft_token_ids.numel() else torch.zeros_like(rows)   # [B, K]

    # acceptance of each draft position, as if every earlier one had been accepted
    p_x = p[rows, x]                                                   # [B, K]
    q_x = (draft_probs.to(torch.float64)[drows, x] if draft_probs is not None
           else torch.ones_like(p_x))
    salt = torch.full((1, 1), ACCEPT_SALT, dtype=torch.int64, device=dev)
    u = _uniform64(keys[rows].reshape(-1, 1), salt).reshape(rows.shape)   # [B, K]
    ok = torch.where(greedy[:, None], x == target_argmax[rows], u * q_x < p_x) & valid
    n_acc = torch.cumprod(ok.to(torch.int64), dim=1).sum(dim=1) if k_max else torch.zeros_like(k)

    # the emitted last token comes from the first rejected row, or from the bonus row
    final = row0 + n_acc                                               # [B]
    rejected = n_acc < k                                               # [B]
    p_f = p[final]                                                     # [B, V]
    dfin = torch.where(rejected, draft0 + n_acc, 0)
    if draft_probs is not None:
        q_f = draft_probs.to(torch.float64)[dfin]
    else:
        q_f = torch.zeros_like(p_f)
        if draft_token_ids.numel():
            q_f[torch.arange(b_n, device=dev), draft_token_ids[dfin]] = 1.0
    q_f = q_f * rejected[:, None]                                      # bonus rows: q = 0
    resid = torch.clamp(p_f - q_f, min=0.0)
    resid = torch.where((resid.sum(dim=1) > 0)[:, None], resid, p_f)   # no mass left: sample p
    last = torch.where(greedy, target_argmax[final], race_sample(resid, keys[final]))

    out = torch.full((b_n, k_max + 1), -1, dtype=torch.int64, device=dev)
    jj = torch.arange(k_max + 1, device=dev)[None, :]
    out[:, :k_max] = torch.where(j < n_acc[:, None], x, out[:, :k_max])
    out = torch.where(jj == n_acc[:, None], last[:, None], out)
    return out, (n_acc + 1).to(torch.int32)

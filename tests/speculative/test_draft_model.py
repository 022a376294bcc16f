"""Draft-model proposer: its drafts equal a from-scratch recompute of the draft model's chain,
whatever happened between calls (partial acceptance, rollback, preemption, a block that moved)."""

from __future__ import annotations

from functools import partial

import random

import pytest
import torch
import transformers

from toolkit.attention.layerwise import build_attention
from toolkit.attention.torch_ref import TorchAttention
from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout
from toolkit.models import load_model
from toolkit.samplers.speculative.draft import DraftModelProposer
from toolkit.samplers.speculative.truncate import truncated_model
from toolkit.types import Request, SamplingParams

V, BS, NB = 101, 4, 96


@pytest.fixture(scope="module")
def target():
    cfg = transformers.Qwen3Config(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, intermediate_size=96,
                                   vocab_size=V, max_position_embeddings=256)
    return load_model(cfg)


@torch.inference_mode()
def recompute_logits(model, tokens: list[int]) -> torch.Tensor:
    """Logits [V] after `tokens`, from an empty cache (no incremental state at all)."""
    n = len(tokens)
    cache = KVCache(model.spec.num_layers, -(-n // BS), BS, model.spec.num_kv_heads, model.spec.head_dim)
    attn = build_attention(model.spec, partial(TorchAttention, cache))
    attn.plan(PagedKVLayout.build([list(range(cache.num_blocks))], [n], [n], BS))
    hidden = model.forward(torch.tensor(tokens), torch.arange(n), attn)
    return model.compute_logits(hidden[-1:])[0]


def greedy_chain(model, tokens: list[int], k: int) -> list[int]:
    out: list[int] = []
    for _ in range(k):
        out.append(int(torch.argmax(recompute_logits(model, tokens + out))))
    return out


class Blocks:
    """A toy allocator: hands out shuffled block ids so tables are never contiguous."""

    def __init__(self, rng: random.Random) -> None:
        self.free = list(range(NB))
        rng.shuffle(self.free)

    def grow(self, r: Request, positions: int) -> None:
        while len(r.block_ids) * BS < positions:
            r.block_ids.append(self.free.pop())


@pytest.mark.parametrize("num_layers", [1, 3])
def test_drafts_equal_a_fresh_recompute_through_rollback_and_preemption(target, num_layers):
    draft_model = truncated_model(target, num_layers)
    rng = random.Random(num_layers)
    proposer = DraftModelProposer(draft_model, num_blocks=NB, block_size=BS)
    for layer in proposer.kv_cache.layers:
        layer.fill_(float("nan"))                 # stale or unwritten KV would poison the drafts
    blocks = Blocks(rng)
    reqs = [Request(str(i), [rng.randrange(V) for _ in range(n)], SamplingParams(max_tokens=200),
                    max_model_len=256) for i, n in enumerate([5, 9, 2])]
    k = 3
    for step in range(7):
        for r in reqs:
            blocks.grow(r, r.num_tokens + k)      # k lookahead slots
        if step == 2:                             # preempt request 0: new blocks, counter bumps
            reqs[0].block_ids, reqs[0].num_preemptions = [], 1
            blocks.grow(reqs[0], reqs[0].num_tokens + k)
        if step == 3:                             # preempted and re-admitted into the SAME blocks,
            reqs[2].num_preemptions = 1           # which another request overwrote meanwhile
            for layer in proposer.kv_cache.layers:
                layer[:, reqs[2].block_ids] = float("nan")
        if step == 4:                             # copy-on-write moved request 1's first block
            reqs[1].block_ids[0] = blocks.free.pop()
        drafts = proposer.propose(reqs, k)
        for r, d in zip(reqs, drafts):
            assert d.probs is None
            assert d.token_ids == greedy_chain(draft_model, r.all_token_ids, k), (step, r.request_id)
        for r, d in zip(reqs, drafts):            # the target accepted a prefix, then its own token
            a = rng.randint(0, k)
            r.output_token_ids += d.token_ids[:a] + [rng.randrange(V)]
            if step == 5:                         # and then a plain decode step nobody drafted for
                r.output_token_ids.append(rng.randrange(V))
    if num_layers == target.spec.num_layers:           # a full-depth draft is the target itself
        r = reqs[2]
        blocks.grow(r, r.num_tokens + k)
        assert proposer.propose([r], k)[0].token_ids == greedy_chain(target, r.all_token_ids, k)


def test_k_is_cut_to_the_block_table_and_the_budget(target):
    proposer = DraftModelProposer(truncated_model(target, 1), num_blocks=NB, block_size=BS)
    r = Request("a", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=50), max_model_len=256)
    r.block_ids = [7, 8]                          # 8 slots: drafts at positions 6, 7 -> k <= 3
    assert len(proposer.propose([r], 5)[0].token_ids) == 3
    r.block_ids = [7]                             # the last token's own slot is missing
    assert proposer.propose([r], 5)[0].token_ids == []
    r.block_ids = [7, 8, 9, 10]
    r.sampling_params = SamplingParams(max_tokens=2)
    assert len(proposer.propose([r], 5)[0].token_ids) == 1


def test_sampled_drafts_return_their_distributions(target):
    draft_model = truncated_model(target, 2)
    proposer = DraftModelProposer(draft_model, num_blocks=NB, block_size=BS, temperature=0.8, seed=3)
    r = Request("a", [5, 6, 7, 8, 9], SamplingParams(max_tokens=50), max_model_len=256)
    r.block_ids = [0, 1, 2]
    d = proposer.propose([r], 4)[0]
    assert d.probs is not None and d.probs.shape == (4, V)
    for j in range(4):
        want = torch.softmax(recompute_logits(draft_model, r.all_token_ids + d.token_ids[:j]) / 0.8, -1)
        torch.testing.assert_close(d.probs[j], want, atol=1e-5, rtol=1e-4)


def test_truncated_model_shares_weights_and_leaves_the_target_whole(target):
    d = truncated_model(target, 2)
    assert target.spec.num_layers == 3 and len(target.model.layers) == 3
    assert d.spec.num_layers == 2 and d.target is target       # a view: every weight is the target's
    assert {id(p) for p in d.parameters()} == {id(p) for p in target.parameters()}
    with pytest.raises(ValueError, match=r"num_layers must be in \[1, 3\]"):
        truncated_model(target, 4)

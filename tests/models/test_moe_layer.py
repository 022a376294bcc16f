"""The MoE layer: its three arithmetic choices agree (kernels = "triton" under the interpreter,
"cpu", "torch"), tensor parallelism over gloo (ranks as threads) reproduces the unsharded
experts layer and whole MoE models, and OLMoE's full-width q/k norm survives the split."""

from __future__ import annotations

import datetime
import threading

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from moe_configs import MOE_FAMILIES, build_hf_moe
from paged import PagedRunner

from toolkit.models import load_model
from toolkit.models.layers.moe import FusedMoE, GroupedTopK, SparseMoeBlock
from toolkit.parallel.group import Group

# ---------------------------------------------------------------- ranks as threads (tests/engine/test_tensor_parallel.py)


@pytest.fixture(scope="module")
def groups() -> dict[int, list[Group]]:
    """Real gloo groups of 2 and 3 ranks in this process (one thread per rank)."""
    made = {}
    for size in (2, 3):
        store = dist.HashStore()
        out: list = [None] * size

        def join(r: int) -> None:
            pg = dist.ProcessGroupGloo(dist.PrefixStore(f"moe{size}", store), r, size,
                                       datetime.timedelta(seconds=60))
            out[r] = Group(pg, r, size, "gloo")

        _threads(size, join)
        made[size] = out
    return made


def _threads(size: int, fn) -> list:
    """fn(rank) on `size` threads at once (collectives meet); results in rank order."""
    results: list = [None] * size
    errors: list = []

    def run(r: int) -> None:
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    ts = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "a rank hung"
    if errors:
        raise errors[0]
    return results


def _experts_checkpoint(e: int, d: int, i: int, seed: int) -> dict[tuple[int, str], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ck = {}
    for x in range(e):
        ck[(x, "w1")], ck[(x, "w3")] = torch.randn(i, d, generator=g), torch.randn(i, d, generator=g)
        ck[(x, "w2")] = torch.randn(d, i, generator=g) / i
    return ck


def _load(layer: FusedMoE, ck) -> None:
    for sid, t in ck.items():
        layer.weight_loader(layer.w2_weight if sid[1] == "w2" else layer.w13_weight, t, sid)


@settings(max_examples=6)
@given(size=st.sampled_from([2, 3]), e=st.integers(1, 5), d=st.integers(1, 9), per=st.integers(1, 4),
       t=st.integers(1, 6), seed=st.integers(0, 99))
def test_tensor_parallel_experts_sum_to_the_full_layer(groups, size, e, d, per, t, seed):
    """Each rank holds its slice of every expert's intermediate features; after the all-reduce
    every rank's output is the full layer's."""
    i = per * size
    ck = _experts_checkpoint(e, d, i, seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(t, d, generator=g)
    k = min(2, e)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    w = torch.rand(t, k, generator=g)
    full = FusedMoE(e, d, i, dtype=torch.float32, device="cpu")
    _load(full, ck)
    want = full(x, w, ids)

    def rank(r: int):
        layer = FusedMoE(e, d, i, dtype=torch.float32, device="cpu", group=groups[size][r])
        _load(layer, ck)
        assert layer.w13_weight.shape == (e, 2 * per, d) and layer.w2_weight.shape == (e, d, per)
        return layer(x, w, ids)

    for got in _threads(size, rank):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


GROUPED = GroupedTopK(num_expert_group=3, topk_group=2, scoring_func="sigmoid", correction_bias=True,
                      routed_scaling_factor=1.5)


@pytest.mark.parametrize("grouped", [None, GROUPED])
@pytest.mark.parametrize("kernels", ["triton", "torch"])
def test_the_layer_s_arithmetic_choices_agree(kernels, grouped):
    """A SparseMoeBlock through the Triton kernel (interpreted) and the twins equals the CPU
    path, with softmax top-k and with grouped top-k (its bias loaded)."""
    e, d, i = 6, 12, 10
    ck = _experts_checkpoint(e, d, i, 7)
    g = torch.Generator().manual_seed(8)
    gate, x, bias = torch.randn(e, d, generator=g), torch.randn(9, d, generator=g), torch.randn(e, generator=g)
    out = {}
    for choice in ("cpu", kernels):
        block = SparseMoeBlock(e, 3, d, i, True, dtype=torch.float32, device="cpu", kernels=choice, grouped=grouped)
        block.gate.weight_loader(block.gate.weight, gate, None)
        if grouped is not None:
            p = block.gate.e_score_correction_bias
            p.weight_loader(p, bias, None)
        _load(block.experts, ck)
        out[choice] = block(x)
    torch.testing.assert_close(out[kernels], out["cpu"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_tensor_parallel_model_logits_equal_tp1(groups, family, tmp_path):
    """The family at TP=2 (each rank reads its slices of the folder) gives TP=1's logits on a
    ragged batch: attention heads, dense and expert MLPs, OLMoE's q/k norm all split."""
    hf = build_hf_moe(family)
    hf.save_pretrained(tmp_path)
    toks = [[5, 17, 99, 3, 42, 8, 150], [7, 7, 200]]

    def logits(group):
        model = load_model(str(tmp_path), group=group)
        runner = PagedRunner(model, block_size=4)
        return runner.step([runner.new_table(), runner.new_table()], toks, [0, 0])

    want = logits(None)
    got = _threads(2, lambda r: logits(groups[2][r]))
    torch.testing.assert_close(got[0], want, rtol=1e-4, atol=1e-4)
    assert got[1] is None                       # the logits are gathered to rank 0


class _Counting:
    """A rank's group that counts its all-reduces (the collectives still run)."""

    def __init__(self, group: Group) -> None:
        self.group, self.rank, self.size, self.backend, self.all_reduces = group, group.rank, group.size, group.backend, 0

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        self.all_reduces += 1
        return self.group.all_reduce(t)

    def __getattr__(self, name: str):
        return getattr(self.group, name)


def test_a_sparse_layer_with_shared_experts_all_reduces_once(groups, tmp_path):
    """dots.llm1 at TP=2: each sparse layer sums its experts' and its shared experts' partial
    sums and all-reduces once (vLLM's reduce_results=False on both), with TP=1's logits."""
    hf = build_hf_moe("dots1")
    hf.save_pretrained(tmp_path)
    c = hf.config
    toks = [[5, 17, 99, 3], [7, 7]]

    def logits(group):
        model = load_model(str(tmp_path), group=group)
        runner = PagedRunner(model, block_size=4)
        return runner.step([runner.new_table(), runner.new_table()], toks, [0, 0])

    want = logits(None)
    counting = [_Counting(g) for g in groups[2]]
    got = _threads(2, lambda r: logits(counting[r]))
    torch.testing.assert_close(got[0], want, rtol=1e-4, atol=1e-4)
    assert c.n_shared_experts >= 1 and c.first_k_dense_replace < c.num_hidden_layers
    # the vocabulary-parallel embedding's, then per layer o_proj's and the MLP's (a dense
    # layer's down_proj; a sparse layer's experts and shared experts together); the logits
    # are gathered, not reduced
    assert [g.all_reduces for g in counting] == [1 + 2 * c.num_hidden_layers] * 2

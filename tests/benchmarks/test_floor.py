"""benchmarks/floor.py: an offline workload walked at the roofline of each op."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from benchmarks import floor, roofline

G = SimpleNamespace(hidden=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate=128,
                    num_layers=2, vocab_size=100)
BW, MM = 1e12, 1e14


def _decode_ms(lens):
    return sum(roofline.floor_ms(ops, BW, MM) for ops in roofline.decode_step_work(G, lens).values())


def test_one_request_is_its_prefill_then_one_step_a_token():
    r = floor.workload_floor(G, [(10, 4)], max_num_seqs=8, copy_bw=BW, matmul_flops=MM)
    assert r["decode_steps"] == 3 and r["output_tokens"] == 4
    assert math.isclose(r["prefill_s"] * 1e3, sum(roofline.floor_ms(ops, BW, MM)
                                                  for ops in floor.prefill_work(G, [10]).values()))
    # the prefill made token 1 (context 11 for token 2's step), then contexts 12, 13
    assert math.isclose(r["decode_s"] * 1e3, sum(_decode_ms([c]) for c in (11, 12, 13)))
    assert math.isclose(r["tok_s"], 4 / r["seconds"])


def test_prompts_admitted_together_share_one_weight_read():
    def ms(ps):
        return sum(roofline.floor_ms(ops, BW, MM) for ops in floor.prefill_work(G, ps).values())

    assert ms([10, 20]) < ms([10]) + ms([20])
    # causal attention FLOPs count pairs within a prompt, not across
    att = lambda ps: floor.prefill_work(G, ps)["attention"][0][1]    # noqa: E731 - layer 0's
    assert math.isclose(att([10, 20]), att([10]) + att([20]))
    assert len(floor.prefill_work(G, [4])["gemm"]) == 4 * G.num_layers + 1   # + the LM head


def test_slots_bound_the_batch_and_free_on_finish():
    reqs = [(8, 3), (8, 5), (8, 2)]
    wide = floor.workload_floor(G, reqs, max_num_seqs=3, copy_bw=BW, matmul_flops=MM)
    one = floor.workload_floor(G, reqs, max_num_seqs=1, copy_bw=BW, matmul_flops=MM)
    assert wide["decode_steps"] == 4                     # the longest request's 5 - 1
    assert one["decode_steps"] == 2 + 4 + 1              # one after another
    assert one["seconds"] > wide["seconds"] and one["decode_only_tok_s"] < wide["decode_only_tok_s"]


def test_the_essential_floor_leaves_out_the_small_ops_only():
    reqs = [(8, 3), (12, 5)]
    full = floor.workload_floor(G, reqs, max_num_seqs=2, copy_bw=BW, matmul_flops=MM)
    lean = floor.workload_floor(G, reqs, max_num_seqs=2, copy_bw=BW, matmul_flops=MM, essential=True)
    assert lean["decode_steps"] == full["decode_steps"] and lean["seconds"] < full["seconds"]
    work = roofline.decode_step_work(G, [9, 13])
    small = sum(roofline.floor_ms(ops, BW, MM) for k, ops in work.items() if k not in floor.ESSENTIAL)
    assert small > 0 and set(floor.ESSENTIAL) <= set(work)


def test_a_request_of_one_token_needs_no_decode_step():
    r = floor.workload_floor(G, [(5, 1)], max_num_seqs=4, copy_bw=BW, matmul_flops=MM)
    assert r["decode_steps"] == 0 and r["decode_s"] == 0 and r["decode_only_tok_s"] == float("inf")


@pytest.mark.parametrize("bad", [[(0, 3)], [(4, 0)]])
def test_empty_prompt_or_output_is_refused(bad):
    with pytest.raises(ValueError, match="at least one"):
        floor.workload_floor(G, bad, max_num_seqs=2)

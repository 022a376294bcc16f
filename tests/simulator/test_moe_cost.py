"""The cost model on mixture-of-experts steps: the expected experts a step touches (against a
draw of uniform routings), the moe_experts feature and its model field, and a fit on the real
engine with a tiny Qwen3-MoE on the CPU that predicts held-out step shapes."""

from __future__ import annotations

import time

import numpy as np
import pytest
from transformers import LlamaConfig, MixtralConfig, Qwen3MoeConfig

from toolkit import LLM
from toolkit.simulator import FEATURES, CostModel, Simulator, make_trace, synthetic_lengths
from toolkit.simulator.calibrate import profile_engine
from toolkit.simulator.cost import as_features, experts_touched, moe_routing

MOE = FEATURES.index("moe_experts")
# 2 layers, 32 experts of 64, top-4 (benchmarks/sim_common.py's tiny-moe)
CFG = Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_experts=32,
                     num_experts_per_tok=4, norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=1024,
                     eos_token_id=2, bos_token_id=1)


@pytest.mark.parametrize("e,k", [(8, 2), (32, 4), (128, 8), (5, 5), (7, 1)])
def test_experts_touched_is_the_mean_over_uniform_routings(e, k):
    rng = np.random.default_rng(0)
    assert experts_touched(0, e, k) == 0.0 and experts_touched(1, e, k) == pytest.approx(k)
    for t in (2, 5, 16, 64):
        draws = [len({x for _ in range(t) for x in rng.choice(e, k, replace=False)}) for _ in range(400)]
        assert experts_touched(t, e, k) == pytest.approx(np.mean(draws), rel=0.03, abs=0.05)
    assert experts_touched(10_000, e, k) == pytest.approx(e)


def test_moe_routing_reads_each_family_s_config():
    assert moe_routing(CFG) == {"num_experts": 32, "top_k": 4}
    assert moe_routing(MixtralConfig(num_local_experts=6, num_experts_per_tok=2)) == {"num_experts": 6, "top_k": 2}
    assert moe_routing(LlamaConfig()) == {} and moe_routing(None) == {}


def test_the_moe_field_round_trips_and_is_checked():
    m = CostModel({"const": 1e-3, "moe_experts": 2e-5}, moe={"num_experts": 32, "top_k": 4})
    back = CostModel.from_dict(m.to_dict())
    assert back.moe == m.moe and "top-4 of 32" in repr(back)
    x = as_features(np.zeros(8))                                  # a vector recorded before the feature
    assert x.shape == (len(FEATURES),) and x[MOE] == 0
    assert CostModel.from_dict({"coef": {"const": 1.0}}).moe == {}
    with pytest.raises(ValueError, match="moe must be"):
        CostModel({"const": 1.0}, moe={"num_experts": 4, "top_k": 5})
    # a decode estimate counts the touched experts: batch 32 reads more than batch 1
    est = [m.finish_estimate(batch=b, context=0)(type("R", (), dict(
        num_tokens=0, num_computed_tokens=0, expected_output_len=2, num_output_tokens=1,
        sampling_params=None))(), 0.0) for b in (1, 32)]
    assert est[0] == pytest.approx(1e-3 + 4 * 2e-5) and est[1] > est[0] + 20 * 2e-5


@pytest.fixture(scope="module")
def moe_llm():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)                  # steadier step times on a shared CPU
    with LLM(CFG, device="cpu", dtype="float32", num_blocks=512, block_size=16, max_num_seqs=32,
             max_num_batched_tokens=512, enable_prefix_caching=False) as m:
        yield m
    torch.set_num_threads(threads)


def _decode_step(batch: int, context: int, e: int = 32, k: int = 4) -> np.ndarray:
    x = np.zeros(len(FEATURES))
    x[[0, 2, 3, MOE]] = 1, batch, batch * context, experts_touched(batch, e, k)
    return x


def _prefill_step(tokens: int, e: int = 32, k: int = 4) -> np.ndarray:
    x = np.zeros(len(FEATURES))
    x[[0, 1, 4, 5, MOE]] = 1, tokens, tokens * (tokens + 1) / 2 / 1000, 1, experts_touched(tokens, e, k)
    return x


def test_the_fit_tells_the_touched_experts_from_the_per_token_terms():
    """Steps priced by a known model with an expert term (5% noise): the fit recovers the
    per-expert seconds, and predicts small decode batches that a fit without the term (a
    line in the batch) gets wrong by more."""
    true = CostModel({"const": 1e-3, "prefill_tokens": 1e-5, "decode_seqs": 2e-5, "decode_kv_tokens": 1e-7,
                      "prefill_attn_ktokens": 5e-6, "prefill_seqs": 1e-4, "moe_experts": 4e-5},
                     moe={"num_experts": 32, "top_k": 4})
    rng = np.random.default_rng(0)
    xs = [_decode_step(b, c) for b in (1, 4, 16, 32, 64) for c in (32, 256)] + \
        [_prefill_step(p) for p in (16, 64, 256, 512)]
    samples = [(x, float(true.predict_features(x)) * rng.uniform(0.95, 1.05)) for x in xs]
    fit = CostModel.fit(samples, moe=true.moe)
    assert fit.coef["moe_experts"] == pytest.approx(4e-5, rel=0.25)
    line = CostModel.fit(samples, features=[f for f in FEATURES if f != "moe_experts"])
    held = [_decode_step(b, 64) for b in (2, 3, 6, 8)]
    err = {name: max(abs(m.predict_features(x) / true.predict_features(x) - 1) for x in held)
           for name, m in (("moe", fit), ("line", line))}
    assert err["moe"] < 0.05 and err["line"] > 2 * err["moe"]


def _quietest(llm, repeats: int = 2, **shapes) -> list[tuple[np.ndarray, float]]:
    """profile_engine in this thread's CPU seconds (one torch thread: the engine's work, not
    the other processes' on a shared host), `repeats` times; per shape the least."""
    runs = [profile_engine(llm, steps=6, warmup=2, clock=time.thread_time, **shapes) for _ in range(repeats)]
    return [min(same, key=lambda s: s[1]) for same in zip(*runs)]


def test_a_fit_on_the_engine_predicts_held_out_moe_steps(moe_llm):
    """Fitted on some decode batches, prefills and a mix of the real engine, the model orders
    held-out decode batches as measured and predicts them within 40% (CPU seconds: about 5% on
    an idle host, 26% seen with other test runs sharing its two cores); the touched-experts term fits the calibration steps better than a line in the
    batch does (about 0.5% mean error against 8%)."""
    cal = _quietest(moe_llm, decode=[(1, 32), (4, 32), (16, 32), (32, 48)], prefill=[32, 128, 256, (32, 4)],
                    mixed=[(8, 32, 128)])
    cost = CostModel.fit(cal, source="test", moe=moe_routing(CFG))
    line = CostModel.fit(cal, features=[f for f in FEATURES if f != "moe_experts"])
    assert cost.fit_error["mean_rel"] < line.fit_error["mean_rel"]
    held = _quietest(moe_llm, decode=[(2, 32), (24, 32)], prefill=[192])
    for x, y in held:
        assert x[MOE] > 0
        assert cost.predict_features(x) == pytest.approx(y, rel=0.4)
    (small, t_small), (large, t_large) = held[:2]
    assert t_small < t_large and cost.predict_features(small) < cost.predict_features(large)


def test_the_shipped_tiny_moe_model_drives_the_simulator():
    """cpu/tiny-moe (benchmarks/sim_calibrate.py --tiny-moe) runs a trace on the Simulator, and
    a decode step's modelled time rises with the experts its batch touches."""
    cost = CostModel.load("cpu/tiny-moe")
    assert cost.moe == {"num_experts": 32, "top_k": 4} and cost.coef["moe_experts"] > 0
    one, many = np.zeros(len(FEATURES)), np.zeros(len(FEATURES))
    one[[0, 2, MOE]] = 1, 1, experts_touched(1, 32, 4)
    many[[0, 2, MOE]] = 1, 16, experts_touched(16, 32, 4)
    assert cost.predict_features(many) > cost.predict_features(one) + 10 * cost.coef["moe_experts"]
    trace = make_trace(synthetic_lengths(40, seed=0, max_prompt=256, max_total=512), rate=50.0, seed=0)
    result = Simulator(policy="fcfs", cost=cost, num_blocks=1024, max_num_seqs=16).run(trace)
    assert len(result.requests) == 40

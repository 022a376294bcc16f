"""kv_cache_dtype="fp8" end to end on the tiny random Llama (CPU): it runs, nothing is NaN, its
greedy tokens agree with float32's to a measured degree (fp8 is lossy: not asserted equal),
the same byte budget holds more blocks, scales come from the argument, the checkpoint or a
calibration, and bad settings are refused with a message."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from toolkit import LLM, EngineConfig, SamplingParams
from toolkit.attention.torch_ref import TorchAttention
from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout
from toolkit.worker.kv_scales import calibrate, scale_pairs

PROMPTS = [[5 + (7 * i + 3 * j) % 500 for j in range(8 + 9 * i)] for i in range(6)]
MAX_NEW = 16


def _greedy(llm: LLM, logprobs: bool = False) -> list:
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True,
                        logprobs=0 if logprobs else None)
    return [o.outputs[0] for o in llm.generate(PROMPTS, sp, use_tqdm=False)]


def test_fp8_engine_runs_and_agrees_with_float32(tiny_llama_dir) -> None:
    """Agreement is measured teacher-forced (float32's greedy continuation as the prompt, the
    logprob of each next token and the argmax from prompt_logprobs): free-running greedy on a
    random-weight model is a cascade of near ties (measured 0.51-0.84 position by position
    depending on the scales) and says little."""
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=64) as ref:
        want = [o.token_ids for o in _greedy(ref)]
        seqs = [p + w for p, w in zip(PROMPTS, want)]
        ref_lp = _prompt_logprobs(ref, seqs)
    # a small pool (preemption) and prefix caching: fp8 blocks are shared and recomputed too
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", kv_cache_dtype="fp8", num_blocks=12,
             max_num_seqs=4) as llm:
        cache = llm.engine.runner.kv_cache
        assert cache.dtype == torch.float8_e4m3fn and cache.scales_source.startswith("calibrated")
        outs = _greedy(llm, logprobs=True)
        fp8_lp = _prompt_logprobs(llm, seqs)
        assert "kv_cache_dtype=fp8" in repr(llm)
    got = [o.token_ids for o in outs]
    assert all(len(g) == MAX_NEW and all(0 <= t < 517 for t in g) for g in got)
    lps = [lp for o in outs for step in o.logprobs for lp in step.values()]
    assert lps and all(math.isfinite(x) for x in lps)           # no NaN / inf anywhere
    top1, diffs = [], []
    for p, s, a, b in zip(PROMPTS, seqs, ref_lp, fp8_lp):
        for i in range(len(p), len(s)):                          # the continuation's positions
            assert all(math.isfinite(x) for x in b[i].values())
            diffs.append(abs(a[i][s[i]] - b[i][s[i]]))
            top1.append(max(b[i], key=b[i].get) == s[i])         # float32's argmax is s[i]
    agree, mean_diff = sum(top1) / len(top1), sum(diffs) / len(diffs)
    # measured: top-1 0.94, mean |logprob difference| 0.0023 nats (logprobs near -6: a random
    # model's flat distributions); a quantiser that forgets a scale moves logits by x100s
    print(f"fp8 vs float32 on the tiny model: teacher-forced top-1 {agree:.3f}, mean |dlogprob| "
          f"{mean_diff:.4f}")
    assert agree >= 0.8 and mean_diff < 0.02


def _prompt_logprobs(llm: LLM, seqs: list[list[int]]) -> list:
    sp = SamplingParams(max_tokens=1, prompt_logprobs=1)
    return [o.prompt_logprobs for o in llm.generate(seqs, sp, use_tqdm=False)]


def test_same_budget_holds_more_blocks(tiny_llama_dir) -> None:
    shape = dict(num_layers=2, block_size=16, num_kv_heads=2, head_dim=16)
    bf16 = KVCache.from_budget(dtype=torch.bfloat16, budget_bytes=2**20, **shape)
    fp8 = KVCache.from_budget(dtype=torch.float8_e4m3fn, budget_bytes=2**20, **shape)
    assert fp8.num_blocks == 2 * bf16.num_blocks and fp8.nbytes == bf16.nbytes
    budget = 2**20
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", kv_cache_bytes=budget) as a, \
            LLM(tiny_llama_dir, dtype="float32", device="cpu", kv_cache_bytes=budget,
                kv_cache_dtype="fp8_e4m3") as b:
        assert b.engine.num_blocks == 4 * a.engine.num_blocks   # 1 byte against float32's 4


def test_given_and_checkpoint_scales(tiny_llama_dir, tmp_path) -> None:
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=16, kv_cache_dtype="fp8",
             kv_scales=[(0.05, 0.02), (0.04, 0.03)]) as llm:
        cache = llm.engine.runner.kv_cache
        assert cache.scales_source == "given"
        assert cache.k_scales == pytest.approx([0.05, 0.04]) and cache.v_scales == pytest.approx([0.02, 0.03])
        assert all(len(o.token_ids) == MAX_NEW for o in _greedy(llm))
    # a checkpoint with vLLM's per-layer k_scale / v_scale tensors (loading skips them)
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "fp8_scales"
    shutil.copytree(tiny_llama_dir, folder)
    weights = load_file(str(Path(folder) / "model.safetensors"))
    for i in range(2):
        weights[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(0.01 * (i + 1))
        weights[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor([0.002 * (i + 1)])
    save_file(weights, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
    with LLM(str(folder), dtype="float32", device="cpu", num_blocks=16, kv_cache_dtype="fp8") as llm:
        cache = llm.engine.runner.kv_cache
        assert cache.scales_source == "checkpoint"
        assert cache.k_scales == pytest.approx([0.01, 0.02]) and cache.v_scales == pytest.approx([0.002, 0.004])
    with LLM(str(folder), dtype="float32", device="cpu", num_blocks=16) as llm:     # "auto" ignores them
        assert llm.engine.runner.kv_cache.dtype == torch.float32


def test_calibration_is_amax_over_vllm_constants(tiny_llama_dir) -> None:
    """Independent check: the calibration prompts prefilled into a float32 cache through the
    reference backend; each layer's largest |K| / 200 and |V| / 100 there are the scales."""
    from toolkit.models import load_model

    model = load_model(tiny_llama_dir, dtype=torch.float32, device="cpu")
    prompts = [PROMPTS[1], PROMPTS[4]]
    from toolkit.attention.layerwise import backend_kwargs

    kw = backend_kwargs(model.spec, model.spec.layer(0))
    k_s, v_s = calibrate(model, prompts, lambda c: TorchAttention(c, **kw), torch.float32,
                         torch.device("cpu"))
    cache = KVCache(model.spec.num_layers, 8, 16, model.spec.num_kv_heads, model.spec.head_dim)
    for layer in cache.layers:
        layer.fill_(0.0)
    lens = [len(p) for p in prompts]
    tables = [[0, 1], [2, 3, 4, 5]]
    attn = TorchAttention(cache, **kw)
    attn.plan(PagedKVLayout.build(tables, lens, lens, 16))
    model.forward(torch.tensor(prompts[0] + prompts[1]),
                  torch.cat([torch.arange(n) for n in lens]), attn)
    for i in range(model.spec.num_layers):
        assert k_s[i] == pytest.approx(float(cache[i][0].abs().max()) / 200, rel=1e-6)
        assert v_s[i] == pytest.approx(float(cache[i][1].abs().max()) / 100, rel=1e-6)


def test_config_validation() -> None:
    assert EngineConfig(kv_cache_dtype="fp8").resolve_kv_cache_dtype() == torch.float8_e4m3fn
    assert EngineConfig(device="cpu").resolve_kv_cache_dtype() == torch.float32
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of \('auto', 'fp8', 'fp8_e4m3'\)"):
        EngineConfig(kv_cache_dtype="int8")
    with pytest.raises(TypeError, match="kv_cache_dtype must be a string"):
        EngineConfig(kv_cache_dtype=8)
    with pytest.raises(ValueError, match="applies to an fp8 KV cache"):
        EngineConfig(kv_scales=(0.1, 0.1))
    for bad in [(0.1,), (0.0, 1.0), (float("inf"), 1.0), "0.1", [(0.1, 0.1), (0.1,)], [], (True, 1.0)]:
        with pytest.raises(ValueError, match="kv_scales"):
            EngineConfig(kv_cache_dtype="fp8", kv_scales=bad)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineConfig(kv_cache_dtype="fp8", tensor_parallel_size=2)
    assert scale_pairs((0.5, 0.25), 3) == ([0.5] * 3, [0.25] * 3)
    with pytest.raises(ValueError, match="has 1 pairs; the model has 2 layers"):
        scale_pairs([(0.5, 0.25)], 2)


def test_wrong_layer_count_is_refused_at_build(tiny_llama_dir) -> None:
    with pytest.raises(ValueError, match="the model has 2 layers"):
        LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=16, kv_cache_dtype="fp8",
            kv_scales=[(0.1, 0.1)] * 3)


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_fp8_engine_on_cuda(tiny_llama_dir, cuda_graphs: bool) -> None:
    """The CUDA path: Triton write_kv and paged attention over fp8, calibration through the
    Triton backend, CUDA graphs (scales are captured as constants: set before warm-up)."""
    opts = dict(dtype="bfloat16", device="cuda", num_blocks=64, cuda_graphs=cuda_graphs)
    with LLM(tiny_llama_dir, **opts) as ref:
        want = [o.token_ids for o in _greedy(ref)]
        seqs = [p + w for p, w in zip(PROMPTS, want)]
        ref_lp = _prompt_logprobs(ref, seqs)
    with LLM(tiny_llama_dir, kv_cache_dtype="fp8", **opts) as llm:
        assert llm.engine.runner.kv_cache.scales_source.startswith("calibrated")
        outs = _greedy(llm, logprobs=True)
        fp8_lp = _prompt_logprobs(llm, seqs)
    assert all(math.isfinite(x) for o in outs for step in o.logprobs for x in step.values())
    diffs = [abs(a[i][s[i]] - b[i][s[i]]) for p, s, a, b in zip(PROMPTS, seqs, ref_lp, fp8_lp)
             for i in range(len(p), len(s))]
    assert all(math.isfinite(d) for d in diffs) and sum(diffs) / len(diffs) < 0.05

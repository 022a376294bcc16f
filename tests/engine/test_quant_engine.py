"""Quantized weights inside the engine: LLM(quantization="fp8") and quantized checkpoints generate,
with speculative decoding (greedy equal to the same model without it), with an fp8 KV cache,
and the engine's repr labels the scheme with its measured cost."""

from __future__ import annotations

import random

import pytest

from toolkit import LLM, EngineConfig, SamplingParams

MAX_NEW = 16


def _prompts(n: int = 4) -> list[list[int]]:
    rng = random.Random(3)
    base = [rng.randrange(3, 517) for _ in range(8)]
    return [(base * 3)[: rng.randrange(6, 20)] + [rng.randrange(3, 517)] for _ in range(n)]


def _greedy(model_dir, **kw) -> tuple[list[list[int]], LLM]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    llm = LLM(model_dir, dtype="float32", device="cpu", num_blocks=64, **kw)
    outs = llm.generate(_prompts(), params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], llm


@pytest.fixture(scope="module")
def fp8_baseline(tiny_llama_dir):
    tokens, llm = _greedy(tiny_llama_dir, quantization="fp8")
    text, html = repr(llm), llm._repr_html_()
    llm.close()
    return tokens, text, html


def test_fp8_at_load_generates_and_is_labelled_lossy(fp8_baseline, tiny_llama_dir):
    tokens, text, html = fp8_baseline
    assert all(len(t) == MAX_NEW for t in tokens)
    assert "quantization=fp8" in text and "KL" in text
    assert "quantization" in html and "lossy" in html
    dense, llm = _greedy(tiny_llama_dir)
    assert "quantization" not in repr(llm)
    llm.close()
    agree = sum(a == b for x, y in zip(tokens, dense) for a, b in zip(x, y)) / sum(map(len, dense))
    assert agree > 0.5, "fp8 weights should mostly follow the float32 model"


@pytest.mark.parametrize("kw", [dict(speculative="ngram", num_speculative_tokens=3),
                                dict(speculative="draft", num_speculative_tokens=2, draft_model=1)])
def test_speculative_decoding_with_quantized_weights_equals_without(fp8_baseline, tiny_llama_dir, kw):
    tokens, llm = _greedy(tiny_llama_dir, quantization="fp8", **kw)
    drafted = llm.engine.spec_drafted
    llm.close()
    assert drafted > 0
    assert tokens == fp8_baseline[0]


def test_quantized_weights_with_an_fp8_kv_cache(tiny_llama_dir):
    tokens, llm = _greedy(tiny_llama_dir, quantization="fp8", kv_cache_dtype="fp8")
    text = repr(llm)
    llm.close()
    assert all(len(t) == MAX_NEW for t in tokens)
    assert "kv_cache_dtype=fp8" in text and "quantization=fp8" in text


def test_quantization_is_validated(tiny_llama_dir):
    with pytest.raises(ValueError, match="quantization must be None or one of"):
        EngineConfig(quantization="int3")
    with pytest.raises(TypeError, match="quantization must be a string"):
        EngineConfig(quantization=8)
    with pytest.raises(ValueError, match="no quantization_config"):
        LLM(tiny_llama_dir, dtype="float32", device="cpu", quantization="gptq")


# ---------------------------------------------------------------- CUDA: graphs, the fast kernels
@pytest.mark.gpu
def test_cuda_graphs_replay_quantized_layers(tiny_llama_dir, tmp_path):
    """fp8 W8A8 (cuBLASLt, bf16) and a W4A16 GPTQ checkpoint (Triton, fp32): graph replays give the
    eager run's tokens (bf16: nearly all of them, the batch buckets differ)."""
    from toolkit.models.quantization.export import write_quantized

    write_quantized(tiny_llama_dir, "gptq", tmp_path / "gptq", group=16)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    for folder, kw, exact in ((tiny_llama_dir, dict(quantization="fp8", dtype="bfloat16"), False),
                              (tmp_path / "gptq", dict(dtype="float32"), True)):
        runs = []
        for graphs in (True, False):
            with LLM(str(folder), device="cuda", cuda_graphs=graphs, **kw) as llm:
                runs.append([o.outputs[0].token_ids for o in llm.generate(_prompts(), params, use_tqdm=False)])
        if exact:
            assert runs[0] == runs[1]
        else:
            agree = sum(a == b for x, y in zip(*runs) for a, b in zip(x, y)) / sum(map(len, runs[1]))
            assert agree >= 0.9

"""A quantized checkpoint in the engine with tensor parallelism: LLM(tensor_parallel_size=2) over
gloo processes on a GPTQ (4-bit weight-only, group 16) checkpoint of the tiny Llama generates
TP=1's greedy tokens (fp32; each rank loads its slices of the packed words, zero points and
scales, and row-parallel ranks start on a group boundary); so do random weights in that layout."""

from __future__ import annotations

from toolkit import LLM, SamplingParams
from toolkit.models.quantization.export import write_quantized

PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 45)), [7, 1, 7, 1]]
OPTS = dict(dtype="float32", device="cpu", num_blocks=48, block_size=8, max_num_batched_tokens=32,
            max_num_seqs=8)                                          # 35 tokens: chunked prefill


def _greedy(llm: LLM) -> list[list[int]]:
    sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, sp, use_tqdm=False)]


def test_tp2_gptq_checkpoint_greedy_equals_tp1(tiny_llama_dir, tmp_path) -> None:
    write_quantized(tiny_llama_dir, "gptq", tmp_path / "gptq", group=16)
    with LLM(tmp_path / "gptq", **OPTS) as tp1:
        want = _greedy(tp1)
        assert "quantization=gptq" in repr(tp1)
    with LLM(tmp_path / "gptq", tensor_parallel_size=2, **OPTS) as tp2:
        got = _greedy(tp2)
        assert "quantization=gptq" in repr(tp2)
    assert all(len(t) == 8 for t in want)
    assert got == want


def test_tp2_random_gptq_weights_greedy_equals_tp1() -> None:
    """Random weights in a quantized layout (a config carrying a GPTQ quantization_config, no
    checkpoint) are drawn whole, so every tensor-parallel size runs the same model."""
    from transformers import LlamaConfig

    from toolkit.models.quantization.export import scheme_config

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                      intermediate_size=96, vocab_size=128, max_position_embeddings=128)
    cfg.quantization_config = scheme_config("gptq", 16, (32, 16))
    prompts = [[5, 6, 7, 8, 9], [70, 1, 7, 1]]
    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    runs = []
    for tp in (1, 2):
        with LLM(cfg, tensor_parallel_size=tp, **OPTS) as llm:
            runs.append([list(o.outputs[0].token_ids) for o in llm.generate(prompts, sp, use_tqdm=False)])
    assert all(len(t) == 6 for t in runs[0])
    assert runs[1] == runs[0]

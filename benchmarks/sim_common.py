"""What sim_calibrate.py and sim_validate.py share: the engine they measure (one config for
both, so the fitted cost model describes the engine the validation runs) and the shapes."""

from __future__ import annotations

from typing import Any

# engine settings of calibration and validation alike (GPU); --tiny shrinks them for the CPU.
# max_num_seqs 128, not 256: with 256 a few hundred ShareGPT requests never fill the batch
# (the engine takes every arrival in, and overload shows only as longer steps, no queue);
# with 128 a queue forms within a 400-request run at 1.25x saturation (the full-batch rate
# is ~8% below 256's by the simulator)
GPU_ENGINE = dict(dtype="bfloat16", max_num_seqs=128, max_num_batched_tokens=8192,
                  gpu_memory_utilization=0.85, max_model_len=8192, enable_prefix_caching=True)
TINY_ENGINE = dict(device="cpu", dtype="float32", num_blocks=1024, max_num_seqs=32,
                   max_num_batched_tokens=512, max_model_len=2048, enable_prefix_caching=True)

SHAPE_NAMES = {"qwen3": "qwen3-0.6b", "llama8b": "llama-3.1-8b", "tiny": "tiny-llama",
               "qwen3moe": "qwen3-30b-a3b", "tiny-moe": "tiny-moe"}
TINY_SHAPES = ("tiny", "tiny-moe")         # the CPU stand-ins


def tiny_config() -> Any:
    """A 2-layer Llama of hidden 64 (random weights): the CPU stand-in for a model shape."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048,
                       eos_token_id=2, bos_token_id=1)


def tiny_moe_config() -> Any:
    """A 2-layer Qwen3-MoE of hidden 64, 32 experts of 64, top-4 (random weights): the CPU
    stand-in for a mixture-of-experts shape (a decode batch of 1 touches 4 experts a layer,
    one of 32 about 23)."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_experts=32,
                          num_experts_per_tok=4, norm_topk_prob=True, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                          max_position_embeddings=2048, eos_token_id=2, bos_token_id=1)


def model_config(shape: str) -> Any:
    from toolkit.models.shapes import llama31_8b, qwen3_0_6b, qwen3_30b_a3b

    return {"qwen3": qwen3_0_6b, "llama8b": llama31_8b, "tiny": tiny_config, "qwen3moe": qwen3_30b_a3b,
            "tiny-moe": tiny_moe_config}[shape]()


def build_llm(shape: str, **overrides: Any) -> Any:
    """An LLM with random weights at the shape, with the engine settings above (overrides:
    other LLM arguments, e.g. attention=)."""
    import torch

    from toolkit import LLM

    if shape in TINY_SHAPES:
        torch.set_num_threads(1)            # steadier step times on a shared CPU
        return LLM(model_config(shape), **{**TINY_ENGINE, **overrides})
    return LLM(model_config(shape), **{**GPU_ENGINE, **overrides})


def release_llm(llm: Any) -> None:
    """Close an LLM and hand its memory back (weights, KV cache, the CUDA caching allocator's
    blocks) before the next engine of the process is built."""
    import gc

    import torch

    llm.close()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def engine_settings(llm: Any) -> dict:
    """The Simulator keyword arguments that mirror this engine's scheduler."""
    s = llm.engine.scheduler
    return dict(num_blocks=s.allocator.num_blocks, block_size=s.block_size, max_num_seqs=s.max_num_seqs,
                max_num_batched_tokens=s.max_num_batched_tokens, max_model_len=s.max_model_len,
                enable_prefix_caching=s.enable_prefix_caching, enable_chunked_prefill=s.enable_chunked_prefill,
                vocab_size=llm.engine.model.spec.vocab_size, async_output=llm.engine.async_scheduling)


# step shapes swept by the calibration: (batch, context) decodes, prefill chunks (P, or k
# prompts of P: (P, k), against one prompt of k * P they tell a prompt's own cost from its
# tokens'), and mixes (B, L, P) / (B, L, P, k); small batches too, where runs below
# saturation live
GPU_SWEEP = dict(
    decode=[(1, 256), (8, 512), (16, 256), (32, 512), (64, 256), (96, 512), (128, 512), (64, 1024),
            (128, 1024), (32, 2048), (128, 2048)],
    prefill=[128, 512, 1024, 2048, 4096, 8000, (32, 4), (128, 4), (256, 8)],
    # the last two: a prompt chunk beside many decodes in a graphed step (cost.mixed_ktokens)
    mixed=[(32, 512, 512), (120, 512, 2048), (64, 1024, 4096), (112, 1024, 1024), (32, 512, 128, 4),
           (16, 256, 64, 4), (120, 512, 384), (64, 1024, 256)],
    steps=10, warmup=3)
TINY_SWEEP = dict(decode=[(1, 32), (8, 64), (16, 128), (32, 64), (32, 160)],
                  prefill=[32, 128, 256, 448, (32, 4), (64, 4)],
                  mixed=[(8, 64, 128), (16, 64, 256), (8, 64, 32, 4)], steps=6, warmup=2)
# a mixture-of-experts shape: decode batches from 1 up (the experts a step touches rise from k
# toward E along them: cost.moe_experts), the rest as the dense sweeps
TINY_MOE_SWEEP = dict(decode=[(1, 32), (2, 32), (4, 64), (8, 64), (16, 64), (32, 64), (32, 160)],
                      prefill=[32, 128, 256, (32, 4)], mixed=[(8, 64, 128), (16, 64, 32, 4)], steps=6, warmup=2)
MOE_GPU_SWEEP = dict(GPU_SWEEP, decode=[(1, 256), (2, 256), (4, 256), (8, 512), (16, 256), (32, 512), (64, 256),
                                        (96, 512), (128, 512), (64, 1024), (128, 1024), (128, 2048)])

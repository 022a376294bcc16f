"""Tiny random Hugging Face checkpoints of the mixture-of-experts families (odd sizes, top-k 2
or 3 of 5-7 experts), for the MoE model tests."""

from __future__ import annotations

from typing import Any

import torch
from model_configs import randomize

MOE_FAMILIES = ["mixtral", "qwen3_moe", "olmoe", "dots1"]


def moe_config(family: str) -> Any:
    import transformers as tf

    small = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, vocab_size=211,
                 num_hidden_layers=3, max_position_embeddings=256, rms_norm_eps=1e-6)
    if family == "mixtral":      # 5 experts, top-2, always renormalised; head_dim 12 from hidden / heads
        return tf.MixtralConfig(**small, intermediate_size=40, num_local_experts=5, num_experts_per_tok=2,
                                tie_word_embeddings=False)
    if family == "qwen3_moe":    # 7 experts top-3 renormalised; layer 1 dense (mlp_only_layers); q/k norm per head
        return tf.Qwen3MoeConfig(**small, head_dim=16, intermediate_size=56, moe_intermediate_size=24,
                                 num_experts=7, num_experts_per_tok=3, norm_topk_prob=True,
                                 decoder_sparse_step=1, mlp_only_layers=[1], tie_word_embeddings=False)
    if family == "olmoe":        # 6 experts top-2, not renormalised; q/k norm over the full width; clip_qkv
        # 1.5 clips about 12% of the normed q/k values
        return tf.OlmoeConfig(**small, intermediate_size=36, num_experts=6, num_experts_per_tok=2,
                              norm_topk_prob=False, clip_qkv=1.5, pad_token_id=0, eos_token_id=1,
                              bos_token_id=2, tie_word_embeddings=False)
    if family == "dots1":        # 8 experts in 4 groups, the best 2 groups kept, top-3 by sigmoid + bias,
        # scaled by 2.5; one shared expert; layer 0 dense (first_k_dense_replace)
        return tf.Dots1Config(**small, head_dim=16, intermediate_size=56, moe_intermediate_size=24,
                              n_routed_experts=8, n_shared_experts=1, n_group=4, topk_group=2,
                              num_experts_per_tok=3, norm_topk_prob=True, routed_scaling_factor=2.5,
                              first_k_dense_replace=1, sliding_window=None, tie_word_embeddings=False)
    raise ValueError(family)


def build_hf_moe(family: str, seed: int = 0) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(moe_config(family), dtype=torch.float32,
                                             attn_implementation="eager").eval()
    randomize(model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):    # a buffer randomize() leaves at 0: make it steer
            b.copy_(torch.randn(b.shape, generator=g) * 0.1)
    return model

"""LoRA over quantized weights: the adapter wraps each layer's quantized method (load_model
rebuilds the LoRA linear_method around the quantization scheme). On a W4A16 checkpoint (weight
only, so its dequantized dense twin gives the same logits), each request's greedy output
equals PEFT's merged adapter on the dequantized dense model."""

from __future__ import annotations

from lora_adapters import make_adapter
from test_lora_engine import PROMPTS, hf_greedy

from toolkit import LLM, LoRARequest, SamplingParams
from toolkit.models.quantization.export import write_quantized


def test_adapters_over_w4a16_weights_equal_peft_on_the_dequantized_model(lora_base, tmp_path):
    from transformers import AutoModelForCausalLM

    _, src = lora_base
    q, dense_dir = tmp_path / "q", tmp_path / "dense"
    write_quantized(src, "ct_w4a16", q, dense_dst=dense_dir, group=16)
    dense = AutoModelForCausalLM.from_pretrained(dense_dir).eval()
    merged = make_adapter(dense, tmp_path / "lora", r=8, targets=["q_proj", "v_proj", "down_proj"],
                          alpha=16.0, seed=5)
    lora = LoRARequest("qvd8", 1, str(tmp_path / "lora"))
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    with LLM(str(q), enable_lora=True, max_loras=1, max_lora_rank=8, num_blocks=64, block_size=4,
             dtype="float32", device="cpu") as llm:
        method = llm.engine.model.model.layers[0].mlp.down_proj.method
        assert type(method).__name__ == "LoRALinearMethod"
        assert type(method.base).__name__ == "W4A16LinearMethod"     # LoRA wraps the quantized method
        outs = llm.generate(PROMPTS * 2, sp, lora_request=[lora] * 3 + [None] * 3, use_tqdm=False)
    for i, o in enumerate(outs):
        ref = merged if i < 3 else dense
        assert o.outputs[0].token_ids == hf_greedy(ref, PROMPTS[i % 3], 6), i
    assert [o.outputs[0].token_ids for o in outs[:3]] != [o.outputs[0].token_ids for o in outs[3:]]

"""Activation quantization fused with the norm / SiLU before a W8A8 layer
(toolkit/models/quantization/fusion.py), on a tiny INT8 W8A8 Llama under TRITON_INTERPRET=1:

* the fused path (RMSNorm -> codes -> qkv / gate_up, SiLU -> codes -> down_proj) gives the
  unfused path's logits (tolerance: the kernels differ from the unfused ones in summation
  order, not in arithmetic) and the same greedy tokens;
* on CUDA (`gpu`), fp8 and int8 in bf16, the same within bf16 tolerance;
* the wiring happens where it should and nowhere else: every decoder layer's three seams on
  the Triton path, none on the CPU path, none for fp8 under the interpreter (its fp8 cast is
  wrong), none for weight-only schemes; a W8A8 layer given a carrier it cannot use refuses it.
"""

from __future__ import annotations

import pytest
import torch
from model_configs import build_hf
from paged import PagedRunner

from toolkit.models import load_model
from toolkit.models.quantization import W8A8LinearMethod
from toolkit.models.quantization.carrier import QuantizedActivation
from toolkit.models.quantization.export import write_quantized
from toolkit.models.quantization.fusion import RMSNormQuant, SiluAndMulQuant, unfuse_activation_quant

TOKENS = [[5, 17, 99, 3, 42, 8, 150], [7, 7, 200]]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    def get(scheme: str):
        src, dst = tmp_path_factory.mktemp("dense"), tmp_path_factory.mktemp(scheme) / "q"
        build_hf("llama").save_pretrained(src)
        write_quantized(src, scheme, dst, group=16, block=(32, 16))
        return dst

    return get


def _logits(model) -> torch.Tensor:
    runner = PagedRunner(model, block_size=4)
    return runner.step([runner.new_table(), runner.new_table()], TOKENS, [0, 0])


def test_fused_int8_equals_unfused_under_the_interpreter(folder):
    model = load_model(folder("ct_int8"), kernels="triton")
    n = model.spec.num_layers
    assert model.fused_activation_quant == 3 * n
    layer = model.model.layers[0]
    assert isinstance(layer.input_layernorm.quant_out, RMSNormQuant)
    assert isinstance(layer.post_attention_layernorm.quant_out, RMSNormQuant)
    assert isinstance(layer.mlp.act, SiluAndMulQuant)
    assert model.model.norm.quant_out is None                 # the final norm feeds the dense LM head
    seen = []
    hook = layer.mlp.down_proj.register_forward_pre_hook(lambda mod, args: seen.append(type(args[0])))
    fused = _logits(model)
    hook.remove()
    assert seen == [QuantizedActivation]                      # the carrier really reached the layer
    unfuse_activation_quant(model)
    assert model.fused_activation_quant == 0 and layer.input_layernorm.quant_out is None
    unfused = _logits(model)
    assert not fused.isnan().any()
    torch.testing.assert_close(fused, unfused, rtol=1e-4, atol=1e-4 * unfused.abs().max().item())
    assert torch.equal(fused.argmax(-1), unfused.argmax(-1))


@pytest.mark.parametrize("scheme,kernels", [("ct_int8", "auto"), ("ct_fp8_dynamic", "triton"), ("ct_w4a16", "triton")])
def test_not_wired_off_the_triton_int8_path(folder, scheme, kernels):
    model = load_model(folder(scheme), kernels=kernels)
    assert model.fused_activation_quant == 0
    assert all(not isinstance(m.quant_out, RMSNormQuant) for m in model.modules() if hasattr(m, "quant_out"))


def test_w8a8_refuses_a_carrier_it_cannot_use():
    layer = torch.nn.Module()
    carrier = QuantizedActivation(torch.zeros(2, 4, dtype=torch.int8), torch.ones(2, 1), torch.float32)
    with pytest.raises(ValueError, match="cannot take"):
        W8A8LinearMethod(torch.float8_e4m3fn).apply(layer, carrier)
    assert torch.equal(carrier.dequantize(), torch.zeros(2, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["ct_fp8_dynamic", "ct_int8"])
def test_gpu_fused_bf16_equals_unfused(folder, scheme):
    """On CUDA the fusion is on by default (kernels="auto"); bf16 logits close to the unfused ones."""
    model = load_model(folder(scheme), dtype=torch.bfloat16, device="cuda")
    assert model.fused_activation_quant == 3 * model.spec.num_layers
    fused = _logits(model).float()
    unfuse_activation_quant(model)
    unfused = _logits(model).float()
    assert not fused.isnan().any()
    torch.testing.assert_close(fused, unfused, rtol=0.05, atol=0.05 * unfused.abs().max().item())
    assert (fused.argmax(-1) == unfused.argmax(-1)).float().mean() > 0.9

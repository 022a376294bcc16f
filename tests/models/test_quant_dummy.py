"""Random (load_format="dummy") weights in a quantized layout: a config that already carries a
quantization_config (GPTQ's g_idx, compressed-tensors' weight_shape, fp8 / int8 codes, packed
int4 words) loads, as benchmarks at real shapes need, with weights that are not degenerate:
every layer's dequantized weight has about the std random dense weights have (0.02), the
outputs are finite and depend on the input, and two loads draw the same weights.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from toolkit.models import load_model
from toolkit.models.layers.linear import ColumnParallelLinear, RowParallelLinear
from toolkit.models.quantization import W4A16LinearMethod, w4a16, w8a8
from toolkit.models.quantization.export import SCHEME_NAMES, scheme_config


def _config(scheme: str | None) -> LlamaConfig:
    c = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                    intermediate_size=96, vocab_size=128, max_position_embeddings=64)
    if scheme is not None:
        c.quantization_config = scheme_config(scheme, 16, (32, 16))
    return c


def _dense(layer) -> torch.Tensor:
    mod = w4a16 if isinstance(layer.method, W4A16LinearMethod) else w8a8
    return mod.dense_weight(layer)


def _linears(model):
    return [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))
            and m.method is not None]


@pytest.mark.parametrize("scheme", [*SCHEME_NAMES, "online_fp8"])
def test_random_weights_in_a_quantized_layout_load(scheme):
    online = scheme == "online_fp8"
    model = load_model(_config(None if online else scheme), quantization="fp8" if online else None)
    layers = _linears(model)
    assert len(layers) == 4 * model.spec.num_layers                    # qkv, o, gate_up, down
    for layer in layers:
        w = _dense(layer)
        assert w.isfinite().all() and 0.01 < w.std().item() < 0.04, (layer, w.std())
    ids = torch.tensor([3, 17, 99, 5])
    hidden = model.embed(ids)
    layer0 = model.model.layers[0]
    out = layer0.mlp(layer0.post_attention_layernorm(hidden)[0])       # [T, hidden]
    assert out.isfinite().all() and (out[0] - out[1]).abs().max() > 1e-4
    again = load_model(_config(None if online else scheme), quantization="fp8" if online else None)
    assert all(torch.equal(_dense(a), _dense(b)) for a, b in zip(layers, _linears(again)))   # seeded

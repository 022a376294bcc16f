"""Quantized weights as LinearMethods of the layers library: no model file changes.

    w8a8.py     FP8 / INT8 W8A8 (per-channel or per-tensor weights; dynamic per-token or static
                activations), FP8 weight-only, block-wise FP8, FP8 quantized at load time
    w4a16.py    4-bit weight-only: compressed-tensors pack-quantized, GPTQ, AWQ
    params.py   parameters that place their rank's part of each checkpoint tensor (TP)
    config.py   a checkpoint's quantization_config (or quantization="fp8") -> per-module methods
    measured.py the measured divergence of each scheme (reprs, docs)
    carrier.py  QuantizedActivation: per-token codes + scales a fused norm / SiLU hands a W8A8 layer
    fusion.py   wires those producers to their W8A8 consumers when a model loads (Triton path)

`load_model(folder, quantization=...)` and `EngineConfig.quantization` use
`quantization_method_fn`; a checkpoint with a quantization_config is read without being asked.
"""

from toolkit.models.quantization.config import QUANTIZATION_METHODS, QuantizationScheme, quantization_method_fn
from toolkit.models.quantization.w4a16 import W4A16LinearMethod
from toolkit.models.quantization.w8a8 import BlockFp8LinearMethod, OnlineFp8LinearMethod, W8A8LinearMethod

__all__ = ["QUANTIZATION_METHODS", "BlockFp8LinearMethod", "OnlineFp8LinearMethod", "QuantizationScheme",
           "W4A16LinearMethod", "W8A8LinearMethod", "quantization_method_fn"]

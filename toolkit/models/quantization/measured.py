"""What each quantized-weight scheme costs in accuracy, as measured (the FP8 KV cache's habit:
toolkit/worker/kv_scales.py): shown by the engine's repr and docs/guides/quantization.md.

Measured on the embedded SmolLM2-135M-Instruct against its float32 weights by
`python -m benchmarks quant_divergence` (teacher-forced next-token KL and top-1 agreement over
the float32 model's greedy continuations; greedy: the share of tokens before the first
difference). Checkpoints are round-to-nearest (toolkit/models/quantization/export.py); a
calibrated GPTQ / AWQ checkpoint of the same format is usually closer.
"""

from __future__ import annotations

from typing import Any

_ON = "measured on SmolLM2-135M vs float32 (4 prompts x 32 tokens, round-to-nearest): next-token KL "

# scheme family -> the measured figures
MEASURED: dict[str, str] = {
    "fp8": _ON + "8.7e-2 nats, total variation 0.108, top-1 85.2%, greedy equal for 32% of the tokens "
                 "before the first difference (per-channel weights, dynamic per-token activations)",
    "fp8-w8a16": _ON + "6.5e-2 nats, total variation 0.088, top-1 87.5%, greedy 27% (per-channel "
                       "weights, activations unquantized)",
    "fp8-block": _ON + "8.3e-2 nats, total variation 0.099, top-1 90.6%, greedy 25% (128 x 128 blocks, "
                       "1 x 128 activation groups)",
    "int8": _ON + "1.3e-1 nats, total variation 0.126, top-1 86.7%, greedy 59% (per-channel weights, "
                  "dynamic per-token activations)",
    "w4a16": _ON + "8.4e-1 nats (group 128 with zero points; group 64 symmetric: 9.8e-1), total "
                   "variation 0.33, top-1 61.7%, greedy 11%: a calibrated GPTQ / AWQ checkpoint is closer",
}


def family(key: str) -> str:
    """A QuantizationScheme.key (compressed-tensors: groups joined by '+') -> its MEASURED family."""
    first = key.split("+")[0]
    if first.startswith("fp8-block"):
        return "fp8-block"
    if first.startswith("fp8") and first.endswith("a16"):
        return "fp8-w8a16"
    if first.endswith("static"):                  # static activation scales: not measured
        return first
    for name in ("fp8", "int8", "w4a16"):
        if first.startswith(name):
            return name
    return first


def measured_cost(scheme: Any) -> str:
    """The measured figures of a scheme's family (or that there are none)."""
    got = MEASURED.get(family(getattr(scheme, "key", "")))
    return got if got is not None else "divergence not measured for this scheme"

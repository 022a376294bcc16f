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

# scheme family -> the measured figures
MEASURED: dict[str, str] = {}


def family(key: str) -> str:
    """A QuantizationScheme.key -> its family in MEASURED."""
    if key.startswith("fp8-block"):
        return "fp8-block"
    for name in ("fp8", "int8", "w4a16"):
        if key.startswith(name) or f"+{name}" in key:
            return name
    return key


def measured_cost(scheme: Any) -> str:
    """The measured figures of a scheme's family (or that there are none)."""
    got = MEASURED.get(family(getattr(scheme, "key", "")))
    return got if got is not None else "divergence not measured for this scheme"

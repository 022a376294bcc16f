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

# scheme family -> (next-token KL in nats, total variation, top-1 agreement, greedy share before
# the first difference, what was measured), 16 prompts x 128 tokens, round-to-nearest checkpoints
# (benchmarks/summaries: quant-divergence)
MEASURED: dict[str, tuple[float, float, float, float, str]] = {
    "fp8": (3.0e-2, 0.064, 0.939, 0.091, "per-channel weights, dynamic per-token activations"),
    "fp8-w8a16": (1.8e-2, 0.048, 0.955, 0.180, "per-channel weights, activations unquantized"),
    "fp8-block": (2.3e-2, 0.056, 0.946, 0.114, "128 x 128 blocks, 1 x 128 activation groups"),
    "int8": (3.6e-2, 0.069, 0.929, 0.081, "per-channel weights, dynamic per-token activations"),
    "w4a16": (3.5e-1, 0.231, 0.792, 0.021, "group 128 with zero points (group 64 symmetric: KL 4.3e-1); "
                                          "a calibrated GPTQ / AWQ checkpoint is closer"),
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


def measured_cost(scheme: Any, short: bool = False) -> str:
    """The measured figures of a scheme's family (or that there are none); short: KL and top-1."""
    got = MEASURED.get(family(getattr(scheme, "key", "")))
    if got is None:
        return "divergence not measured for this scheme"
    kl, tv, top1, greedy, what = got
    if short:
        return f"KL {kl:.1e}, top-1 {100 * top1:.1f}% vs float32 on SmolLM2-135M"
    return (f"measured on SmolLM2-135M vs float32 (16 prompts x 128 tokens, round-to-nearest): next-token "
            f"KL {kl:.1e} nats, total variation {tv:.3f}, top-1 {100 * top1:.1f}%, greedy equal for "
            f"{100 * greedy:.0f}% of the tokens before the first difference ({what})")

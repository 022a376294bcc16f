"""Quantized weights: what each scheme costs in accuracy, on the embedded SmolLM2-135M (CPU).

    python -m benchmarks quant_divergence [--quick]

Each scheme's checkpoint of the embedded model (float32) is written by
toolkit/models/quantization/export.py (round-to-nearest, in the format's own layout);
"fp8 (at load)" is LLM(quantization="fp8") on the float32 folder. Against the float32 model in
the same process, as benchmarks/fp8_kv.py measures the fp8 KV cache: each prompt followed by
float32's greedy continuation is prefilled through each engine (teacher-forced), and per
continuation position KL(p_fp32 || p_quant) and top-1 agreement are taken; plus greedy
agreement (the share of tokens before the first difference). Prints a table; writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.fp8_kv import GEN_TOKENS, PROMPTS, divergence, print_divergence, reference_run

# label -> (export scheme or None for quantization="fp8", group, block)
SCHEMES = {
    "fp8 W8A8 (at load: per-channel, dynamic per-token)": (None, 0, (0, 0)),
    "fp8 weights only (per-channel, activations unquantized)": ("ct_fp8_weight_only", 0, (0, 0)),
    "fp8 block 128x128 (per-token-group activations)": ("hf_fp8_block", 128, (128, 128)),
    "int8 W8A8 (per-channel, dynamic per-token)": ("ct_int8", 0, (0, 0)),
    "W4A16 group 64, symmetric": ("ct_w4a16", 64, (0, 0)),
    "W4A16 group 128, zero points (GPTQ / AWQ layout)": ("gptq", 128, (0, 0)),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="4 prompts x 32 tokens")
    p.add_argument("--only", default="", help="run the schemes whose label contains this")
    p.add_argument("--out", default="benchmarks/results/quant_divergence.json")
    args = p.parse_args()

    from toolkit import LLM
    from toolkit.models import default_model_path
    from toolkit.models.quantization.export import write_quantized

    n_prompts, gen = (4, 32) if args.quick else (len(PROMPTS), GEN_TOKENS)
    opts = dict(enable_prefix_caching=False, num_blocks=512, max_num_seqs=16)
    src = default_model_path()
    ref = LLM(str(src), **opts)
    prompts = [ref.engine.tokenize(t)[1] for t in PROMPTS[:n_prompts]]
    base = reference_run(ref, prompts, gen)
    res: dict[str, Any] = {"model": "SmolLM2-135M-Instruct (embedded), float32", "prompts": n_prompts,
                           "gen_tokens": gen, "schemes": {}}
    print(f"quantized weights vs float32 on the embedded model, {n_prompts} prompts x {gen} tokens:")
    with tempfile.TemporaryDirectory() as tmp:
        for label, (scheme, group, block) in SCHEMES.items():
            if args.only not in label:
                continue
            if scheme is None:
                llm = LLM(str(src), quantization="fp8", **opts)
            else:
                folder = Path(tmp) / scheme
                write_quantized(src, scheme, folder, group=group or 128, block=block if block[0] else (128, 128))
                llm = LLM(str(folder), **opts)
            d = divergence(base, llm, gen)
            d["scheme"] = repr(llm.engine.model.quantization_scheme)
            res["schemes"][label] = d
            print_divergence(label, d, gen)
            llm.close()
    ref.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()

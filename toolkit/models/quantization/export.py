"""Round-to-nearest quantized checkpoints in the published formats, from a local HF folder.

Each linear weight of the decoder layers (q/k/v/o, gate/up/down) is quantized by round-to-
nearest and stored as llm-compressor (compressed-tensors), AutoGPTQ, AutoAWQ and DeepSeek's
FP8 store theirs, under the tensor names those tools write (layouts: w4a16.py and w8a8.py;
tests/models/test_quantization.py checks them against compressed-tensors' own packer and
transformers loading them). Everything else stays dense. Optionally also written: the dense
folder whose weights are the dequantized ones (the oracle a quantized load is compared with).

Round-to-nearest, not GPTQ's or AWQ's calibrated search: the layouts are theirs, the values
are not (a calibrated checkpoint of the same format is usually closer to the dense model).
For tests and the divergence figures (benchmarks/quant_divergence.py); `python -m
toolkit.models.quantization.export SRC SCHEME DST` writes one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from toolkit.kernels import reference_quant as ref

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8 = torch.float8_e4m3fn


def _act(kind: str, dynamic: bool = True) -> dict:
    return {"num_bits": 8, "type": kind, "symmetric": True, "dynamic": dynamic,
            "strategy": "token" if dynamic else "tensor", "group_size": None, "block_structure": None,
            "actorder": None, "observer": None if dynamic else "minmax", "observer_kwargs": {}}


def _weights(kind: str, bits: int, strategy: str, group_size: int | None = None,
             symmetric: bool = True, block: list[int] | None = None) -> dict:
    return {"num_bits": bits, "type": kind, "symmetric": symmetric, "dynamic": False, "strategy": strategy,
            "group_size": group_size, "block_structure": block, "actorder": None, "observer": "minmax",
            "observer_kwargs": {}}


def ct_config(fmt: str, weights: dict, acts: dict | None) -> dict:
    """compressed-tensors' quantization_config as llm-compressor writes it."""
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "global_compression_ratio": None, "ignore": ["lm_head"], "kv_cache_scheme": None,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": acts, "output_activations": None}}}


def scheme_config(scheme: str, group: int = 128, block: tuple[int, int] = (128, 128)) -> dict:
    """The quantization_config each tool writes for `scheme` (SCHEME_NAMES)."""
    g2 = 2 * group                 # the asymmetric W4A16 scheme: twice the group (a second size)
    blk = [int(block[0]), int(block[1])]
    return {
        "ct_fp8_dynamic": lambda: ct_config("float-quantized", _weights("float", 8, "channel"), _act("float")),
        "ct_fp8_weight_only": lambda: ct_config("float-quantized", _weights("float", 8, "channel"), None),
        "ct_fp8_static": lambda: ct_config("float-quantized", _weights("float", 8, "tensor"), _act("float", dynamic=False)),
        "ct_int8": lambda: ct_config("int-quantized", _weights("int", 8, "channel"), _act("int")),
        "ct_w4a16": lambda: ct_config("pack-quantized", _weights("int", 4, "group", group), None),
        "ct_w4a16_asym": lambda: ct_config("pack-quantized", _weights("int", 4, "group", g2, symmetric=False), None),
        "ct_fp8_block": lambda: ct_config("float-quantized", _weights("float", 8, "block", block=blk),
                                          {**_act("float"), "strategy": "group", "group_size": blk[1]}),
        "hf_fp8_block": lambda: {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": blk,
                                 "modules_to_not_convert": ["lm_head"]},
        "gptq": lambda: {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False, "sym": False,
                         "checkpoint_format": "gptq", "damp_percent": 0.01, "true_sequential": True},
        "awq": lambda: {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"},
    }[scheme]()


SCHEME_NAMES = ("ct_fp8_dynamic", "ct_fp8_weight_only", "ct_fp8_static", "ct_int8", "ct_w4a16", "ct_w4a16_asym", "ct_fp8_block",
                "hf_fp8_block", "gptq", "awq")
STATIC_INPUT_SCALE = 4.0 / 448    # the static fp8 scheme's activation scale (inputs ~ N(0, 1))


def _groups(w: torch.Tensor, g: int) -> torch.Tensor:
    """[N, K] -> [N, G, g] (K padded with zeros to whole groups)."""
    n, k = w.shape
    pad = -(-k // g) * g - k
    return torch.nn.functional.pad(w, (0, pad)).reshape(n, -1, g)


def _int4_asym(w: torch.Tensor, g: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(unsigned codes [N, K] in 0..15, scales [N, G], unsigned zeros [N, G])."""
    wg = _groups(w, g)
    lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    zero = torch.round(-lo / scale).clamp(0, 15)
    q = (torch.round(wg / scale[..., None]) + zero[..., None]).clamp(0, 15)
    return q.reshape(w.shape[0], -1)[:, :w.shape[1]].to(torch.uint8), scale, zero.to(torch.uint8)


def _pack_cols(u: torch.Tensor, awq: bool = False) -> torch.Tensor:
    """uint [R, C] -> int32 [R, C / 8] packed along dim 1 (AWQ's interleaved order if awq)."""
    if awq:
        order = [0, 2, 4, 6, 1, 3, 5, 7]                 # nibble i holds column order[i]
        u = u.reshape(u.shape[0], -1, 8)[..., order].reshape(u.shape[0], -1)
    return ref.pack_int4(u)


def quantize_tensor(scheme: str, w: torch.Tensor, group: int = 128, block: tuple[int, int] = (128, 128),
                    input_scale: float = STATIC_INPUT_SCALE) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(checkpoint tensors by suffix, the dequantized fp32 weight) of one [N, K] weight."""
    w = w.float()
    n, k = w.shape
    if scheme in ("ct_fp8_dynamic", "ct_fp8_weight_only", "ct_int8"):
        dtype = torch.int8 if scheme == "ct_int8" else FP8
        q, s = ref.per_token_quant(w, dtype)                              # per output row
        return {"weight": q, "weight_scale": s}, q.float() * s
    if scheme == "ct_fp8_static":
        s = (w.abs().amax() / 448).reshape(1)
        q = (w / s).clamp(-448, 448).to(FP8)
        return {"weight": q, "weight_scale": s, "input_scale": torch.tensor([input_scale])}, q.float() * s
    if scheme in ("ct_fp8_block", "hf_fp8_block"):
        bn, bk = block
        nb, kb = -(-n // bn), -(-k // bk)
        wp = torch.nn.functional.pad(w, (0, kb * bk - k, 0, nb * bn - n)).reshape(nb, bn, kb, bk)
        s = (wp.abs().amax(dim=(1, 3)) / 448).clamp(min=1e-12)             # [nb, kb]
        q = (wp / s[:, None, :, None]).clamp(-448, 448).to(FP8).reshape(nb * bn, kb * bk)[:n, :k]
        deq = q.float() * s.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
        name = "weight_scale" if scheme == "ct_fp8_block" else "weight_scale_inv"
        return {"weight": q, name: s}, deq
    if scheme == "ct_w4a16":
        g = group
        wg = _groups(w, g)
        s = (wg.abs().amax(-1) / 7.5).clamp(min=1e-8)                      # [N, G]
        q = torch.round(wg / s[..., None]).clamp(-8, 7).reshape(n, -1)[:, :k]   # signed
        return ({"weight_packed": ref.pack_int4((q + 8).to(torch.uint8)), "weight_scale": s,
                 "weight_shape": torch.tensor([n, k])}, q * ref.group_expand(s, g, k))
    if scheme not in ("ct_w4a16_asym", "gptq", "awq"):
        raise ValueError(f"unknown scheme {scheme!r}; one of {SCHEME_NAMES}")
    g = 2 * group if scheme == "ct_w4a16_asym" else group
    u, s, z = _int4_asym(w, g)
    if scheme in ("gptq", "awq"):
        s = s.half().float()                                              # fp16 scales, as published
    deq = (u.float() - ref.group_expand(z.float(), g, k)) * ref.group_expand(s, g, k)
    if scheme == "ct_w4a16_asym":                                         # zp packed along N, + 8 offset
        return ({"weight_packed": ref.pack_int4(u), "weight_scale": s, "weight_shape": torch.tensor([n, k]),
                 "weight_zero_point": _pack_cols(z.t()).t().contiguous()}, deq)
    if scheme == "gptq":                                                   # zeros stored minus one
        return ({"qweight": ref.pack_int4(u).t().contiguous(),             # [K / 8, N]
                 "qzeros": _pack_cols(((z.to(torch.int32) - 1) & 15).t().contiguous()),      # [G, N / 8]
                 "scales": s.t().half().contiguous(), "g_idx": torch.arange(k, dtype=torch.int32) // g}, deq)
    return ({"qweight": _pack_cols(u.t().contiguous(), awq=True),          # [K, N / 8]
             "qzeros": _pack_cols(z.t().contiguous(), awq=True), "scales": s.t().half().contiguous()}, deq)


def write_quantized(src: str | Path, scheme: str, dst: str | Path, *, dense_dst: str | Path | None = None,
                    group: int = 128, block: tuple[int, int] = (128, 128),
                    input_scale: float = STATIC_INPUT_SCALE) -> None:
    """The `scheme` checkpoint of the HF folder src (config.json + safetensors) into dst, the
    other files (tokenizer, generation config) copied; and, if asked, the dequantized dense one."""
    import shutil

    from toolkit.models.weights import iterate_weights

    src = Path(src)
    config = json.loads((src / "config.json").read_text())
    if config.get("quantization_config"):
        raise ValueError(f"{src} is already quantized ({config['quantization_config'].get('quant_method')})")
    quant: dict[str, torch.Tensor] = {}
    dense: dict[str, torch.Tensor] = {}
    for name, t in iterate_weights(src, "safetensors"):
        parts = name.split(".")
        if name.endswith(".weight") and len(parts) >= 2 and parts[-2] in LINEARS:
            tensors, deq = quantize_tensor(scheme, t, group, block, input_scale)
            prefix = name[: -len("weight")]
            quant.update({prefix + k: v.contiguous() for k, v in tensors.items()})
            dense[name] = deq.to(t.dtype).contiguous()
        else:
            quant[name] = dense[name] = t.contiguous()
    outs = [(Path(dst), quant, scheme_config(scheme, group, block))]
    if dense_dst is not None:
        outs.append((Path(dense_dst), dense, None))
    for folder, tensors, qc in outs:
        folder.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.is_file() and f.name != "config.json" and not f.name.endswith((".safetensors", ".index.json", ".bin")):
                shutil.copy(f, folder / f.name)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps({**config, **({"quantization_config": qc} if qc else {})}, indent=2))


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description="write a round-to-nearest quantized checkpoint of a HF folder")
    p.add_argument("src")
    p.add_argument("scheme", choices=SCHEME_NAMES)
    p.add_argument("dst")
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--block", type=int, nargs=2, default=(128, 128))
    a = p.parse_args(argv)
    write_quantized(a.src, a.scheme, a.dst, group=a.group, block=tuple(a.block))


if __name__ == "__main__":
    main()

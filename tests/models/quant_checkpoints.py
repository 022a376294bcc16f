"""Quantized checkpoints of a Hugging Face model, written at test time in the published formats.

Each linear weight of the decoder layers (q/k/v/o, gate/up/down) is quantized by round-to-
nearest as llm-compressor / AutoGPTQ / AutoAWQ / DeepSeek's FP8 store it, under the tensor
names those tools write (formats: toolkit/models/quantization/w4a16.py and w8a8.py; checked
against compressed-tensors' own packer in test_quant_checkpoints.py). Everything else stays
dense. Returned beside the folder: the dense folder whose weights are the dequantized ones,
the oracle a quantized load is compared with.
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


SCHEMES = {  # name -> quantization_config
    "ct_fp8_dynamic": ct_config("float-quantized", _weights("float", 8, "channel"), _act("float")),
    "ct_fp8_static": ct_config("float-quantized", _weights("float", 8, "tensor"), _act("float", dynamic=False)),
    "ct_int8": ct_config("int-quantized", _weights("int", 8, "channel"), _act("int")),
    "ct_w4a16": ct_config("pack-quantized", _weights("int", 4, "group", 16), None),
    "ct_w4a16_asym": ct_config("pack-quantized", _weights("int", 4, "group", 32, symmetric=False), None),
    "ct_fp8_block": ct_config("float-quantized", _weights("float", 8, "block", block=[32, 16]),
                              {**_act("float"), "strategy": "group", "group_size": 16}),
    "hf_fp8_block": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 16],
                     "modules_to_not_convert": ["lm_head"]},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": False, "sym": False,
             "checkpoint_format": "gptq", "damp_percent": 0.01, "true_sequential": True},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 16, "zero_point": True, "version": "gemm"},
}
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


def quantize_tensor(scheme: str, w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(checkpoint tensors by suffix, the dequantized fp32 weight) of one [N, K] weight."""
    w = w.float()
    n, k = w.shape
    if scheme in ("ct_fp8_dynamic", "ct_int8"):
        dtype = FP8 if scheme == "ct_fp8_dynamic" else torch.int8
        q, s = ref.per_token_quant(w, dtype)                              # per output row
        return {"weight": q, "weight_scale": s}, q.float() * s
    if scheme == "ct_fp8_static":
        s = (w.abs().amax() / 448).reshape(1)
        q = (w / s).clamp(-448, 448).to(FP8)
        return {"weight": q, "weight_scale": s, "input_scale": torch.tensor([STATIC_INPUT_SCALE])}, q.float() * s
    if scheme in ("ct_fp8_block", "hf_fp8_block"):
        bn, bk = 32, 16
        nb, kb = -(-n // bn), -(-k // bk)
        wp = torch.nn.functional.pad(w, (0, kb * bk - k, 0, nb * bn - n)).reshape(nb, bn, kb, bk)
        s = (wp.abs().amax(dim=(1, 3)) / 448).clamp(min=1e-12)             # [nb, kb]
        q = (wp / s[:, None, :, None]).clamp(-448, 448).to(FP8).reshape(nb * bn, kb * bk)[:n, :k]
        deq = q.float() * s.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
        name = "weight_scale" if scheme == "ct_fp8_block" else "weight_scale_inv"
        return {"weight": q, name: s}, deq
    if scheme == "ct_w4a16":
        g = 16
        wg = _groups(w, g)
        s = (wg.abs().amax(-1) / 7.5).clamp(min=1e-8)                      # [N, G]
        q = torch.round(wg / s[..., None]).clamp(-8, 7).reshape(n, -1)[:, :k]   # signed
        return ({"weight_packed": ref.pack_int4((q + 8).to(torch.uint8)), "weight_scale": s,
                 "weight_shape": torch.tensor([n, k])}, q * ref.group_expand(s, g, k))
    u, s, z = _int4_asym(w, 32 if scheme == "ct_w4a16_asym" else 16)
    g = 32 if scheme == "ct_w4a16_asym" else 16
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


def write_quantized(hf: torch.nn.Module, scheme: str, folder: Path, dense_folder: Path) -> None:
    """The quantized checkpoint of `hf` into folder, its dequantized dense twin into dense_folder."""
    quant: dict[str, torch.Tensor] = {}
    dense: dict[str, torch.Tensor] = {}
    for name, t in hf.state_dict().items():
        parts = name.split(".")
        if name.endswith(".weight") and len(parts) >= 2 and parts[-2] in LINEARS:
            tensors, deq = quantize_tensor(scheme, t)
            prefix = name[: -len("weight")]
            quant.update({prefix + k: v.contiguous() for k, v in tensors.items()})
            dense[name] = deq.to(t.dtype).contiguous()
        else:
            quant[name] = dense[name] = t.contiguous()
    for f, tensors, qc in ((folder, quant, SCHEMES[scheme]), (dense_folder, dense, None)):
        f.mkdir(parents=True, exist_ok=True)
        if "lm_head.weight" in tensors and hf.config.tie_word_embeddings:
            del tensors["lm_head.weight"]
        save_file(tensors, str(f / "model.safetensors"), metadata={"format": "pt"})
        config = hf.config.to_dict()
        config["architectures"] = [type(hf).__name__]
        if qc is not None:
            config["quantization_config"] = qc
        (f / "config.json").write_text(json.dumps(config, indent=2, default=str))


__all__ = ["SCHEMES", "write_quantized", "quantize_tensor", "STATIC_INPUT_SCALE"]

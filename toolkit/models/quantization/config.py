"""A checkpoint's `quantization_config` (or `quantization="fp8"`) -> the LinearMethod of each layer.

`quantization_method_fn(hf_config, quantization)` returns a `QuantizationScheme`: called with a
linear layer's module name (Hugging Face's, e.g. "model.layers.3.mlp.down_proj"; merged layers
by their merged name, "...self_attn.qkv_proj"), it gives the layer's method, or None for a
dense layer (an ignored module, the LM head). None when the model is not quantized.

Read, as vLLM reads them:
    compressed-tensors   `config_groups` (each: `targets` = "Linear", exact names or "re:"
                         regexes; `weights`; `input_activations`), `ignore`, `format`
    fp8                  `activation_scheme`, `weight_block_size`, `modules_to_not_convert`
                         (or vLLM's `ignored_layers`)
    gptq                 `bits`, `group_size`, `desc_act`, `sym`, `checkpoint_format`
    awq                  `bits` / `w_bit`, `group_size` / `q_group_size`, `zero_point`,
                         `version`, `modules_to_not_convert`
A merged layer takes the scheme of its checkpoint parts (q_proj, k_proj, v_proj / gate_proj,
up_proj), which must agree. Anything else is refused with the method named and what is
supported listed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from toolkit.kernels.reference_quant import FP8
from toolkit.models.quantization.w4a16 import W4A16LinearMethod
from toolkit.models.quantization.w8a8 import (
    BlockFp8LinearMethod,
    OnlineFp8LinearMethod,
    W8A8LinearMethod,
)

SUPPORTED = {
    "fp8": "FP8 checkpoints (quant_method 'fp8': block-wise weight_block_size with weight_scale_inv, "
           "or per-tensor weight_scale with dynamic/static activations), and quantization='fp8' on a "
           "bf16/fp32 checkpoint (per-channel weights at load time, dynamic per-token activations)",
    "compressed-tensors": "llm-compressor's float-quantized FP8 (channel / tensor / block weights; "
                          "dynamic per-token, static per-tensor or no activation quantization), "
                          "int-quantized INT8 W8A8 (symmetric), pack-quantized 4-bit W4A16 (group or "
                          "channel, symmetric or with zero points)",
    "gptq": "4-bit, desc_act=False, checkpoint_format 'gptq' or 'gptq_v2'",
    "awq": "4-bit GEMM layout with zero points",
}
ALIASES = {"gptq_marlin": "gptq", "awq_marlin": "awq", "fp8_e4m3": "fp8"}
QUANTIZATION_METHODS = tuple(SUPPORTED)          # EngineConfig.quantization's names
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def supported_message() -> str:
    return "; ".join(f"{k}: {v}" for k, v in SUPPORTED.items())


def _refuse(method: str, what: str) -> ValueError:
    return ValueError(f"unsupported {method!r} quantization: {what}. Supported: {supported_message()}")


class QuantizationScheme:
    """module name -> LinearMethod | None, with the scheme's name and a label for reprs."""

    def __init__(self, method: str, label: str, choose: Callable[[str], Any], key: str) -> None:
        self.method, self.label, self._choose, self.key = method, label, choose, key

    def __call__(self, name: str) -> Any:
        parts = name.rsplit(".", 1)
        leaf = parts[-1]
        if leaf not in FUSED:
            return self._choose(name)
        prefix = parts[0] + "." if len(parts) == 2 else ""
        if self._choose(name) is None and self._explicitly_dense(name):
            return None
        chosen = [self._choose(prefix + p) for p in FUSED[leaf]]
        if any(repr(c) != repr(chosen[0]) for c in chosen):
            raise ValueError(f"{name} merges {list(FUSED[leaf])}, which the quantization config gives "
                             f"different schemes ({[repr(c) for c in chosen]}); they must agree")
        return chosen[0]

    def _explicitly_dense(self, name: str) -> bool:
        return getattr(self._choose, "ignores", lambda n: False)(name)

    def __repr__(self) -> str:
        return f"QuantizationScheme({self.method}: {self.label})"


class _Chooser:
    """A callable with an `ignores(name)` test, so a merged checkpoint name (Phi-3's qkv_proj)
    can be ignored by its own name."""

    def __init__(self, pick: Callable[[str], Any], ignores: Callable[[str], bool]) -> None:
        self.pick, self.ignores = pick, ignores

    def __call__(self, name: str) -> Any:
        return None if self.ignores(name) else self.pick(name)


def _match(target: str, name: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name


def _substring_ignores(entries: Any) -> Callable[[str], bool]:
    entries = list(entries or [])
    return lambda name: any(e in name for e in entries)


def quantization_method_fn(hf_config: Any, quantization: Any = None, *,
                           kernels: str = "auto") -> QuantizationScheme | None:
    """The per-module method fn of a model (module doc), or None when it is not quantized.
    quantization: None (the checkpoint's own config, if any), "fp8" (an unquantized checkpoint is
    quantized at load time; an fp8 one loads as it is), or a method that must match the
    checkpoint's; an EngineConfig is read for its `quantization`."""
    if quantization is not None and not isinstance(quantization, str):
        quantization = getattr(quantization, "quantization", quantization)
    if quantization is not None and not isinstance(quantization, str):
        raise TypeError(f"quantization must be a string or None, got {type(quantization).__name__}")
    if quantization is not None:
        quantization = ALIASES.get(quantization, quantization)
        if quantization not in SUPPORTED:
            raise ValueError(f"unknown quantization {quantization!r}; supported: {sorted(SUPPORTED)} "
                             f"({supported_message()})")
    qc = getattr(hf_config, "quantization_config", None)
    if qc is not None and not isinstance(qc, dict):
        qc = qc.to_dict() if hasattr(qc, "to_dict") else dict(vars(qc))
    if not qc:
        if quantization is None:
            return None
        if quantization != "fp8":
            raise ValueError(f"quantization={quantization!r} loads a checkpoint quantized with "
                             f"{quantization}, and this model's config.json has no quantization_config; "
                             "quantization='fp8' quantizes an unquantized checkpoint at load time")
        _check_dense_experts(hf_config, "fp8")
        method = OnlineFp8LinearMethod(kernels)
        return QuantizationScheme("fp8", "fp8 W8A8 quantized at load time (per-channel weights, dynamic "
                                  "per-token activations)", lambda name: method, "fp8-online")
    method_name = str(qc.get("quant_method", "")).lower()
    method_name = ALIASES.get(method_name, method_name)
    if method_name not in SUPPORTED:
        raise ValueError(f"unsupported quantization method {method_name or qc!r} in the checkpoint's "
                         f"quantization_config; supported: {supported_message()}")
    if quantization is not None and quantization != method_name:
        raise ValueError(f"quantization={quantization!r} does not match the checkpoint's quantization_config "
                         f"(quant_method {method_name!r}); pass quantization={method_name!r} or None")
    _check_dense_experts(hf_config, method_name)
    parse = {"compressed-tensors": _compressed_tensors, "fp8": _fp8, "gptq": _gptq, "awq": _awq}[method_name]
    return parse(qc, kernels)


def _check_dense_experts(hf_config: Any, method: str) -> None:
    n = getattr(hf_config, "num_local_experts", None) or getattr(hf_config, "num_experts", None)
    if n:
        raise _refuse(method, f"a mixture-of-experts model ({n} experts): quantized experts are not "
                      "supported yet (their FusedMoE layer is not a linear layer)")


# ---------------------------------------------------------------- compressed-tensors
def _ct_scheme(group: dict, fmt: str | None, kernels: str) -> tuple[Any, str, str]:
    """(method, label, key) of one compressed-tensors config group."""
    m = "compressed-tensors"
    w = group.get("weights") or {}
    a = group.get("input_activations")
    if group.get("output_activations"):
        raise _refuse(m, "output activation quantization")
    bits, kind, strategy = w.get("num_bits"), w.get("type", "int"), w.get("strategy")
    fmt = group.get("format") or fmt
    if w.get("actorder") in ("group", "dynamic"):
        raise _refuse(m, f"weights actorder={w.get('actorder')!r} (it needs g_idx)")
    if kind == "float" and bits == 8:
        if fmt not in (None, "float-quantized", "naive-quantized"):
            raise _refuse(m, f"fp8 weights in format {fmt!r}")
        if not w.get("symmetric", True):
            raise _refuse(m, "asymmetric fp8 weights")
        if strategy == "block":
            block = w.get("block_structure") or [128, 128]
            if a is not None and not (a.get("type") == "float" and a.get("dynamic") in (True, "local")
                                      and a.get("strategy") in ("group", "token")):
                raise _refuse(m, f"block-wise fp8 weights with activations {a!r}")
            acts = "dynamic" if a is not None else None
            return (BlockFp8LinearMethod(tuple(block), "weight_scale", kernels, acts),
                    f"fp8 block {list(block)} weights, {_block_acts(acts, block)}", f"fp8-block-{acts or 'a16'}")
        if strategy not in ("channel", "tensor"):
            raise _refuse(m, f"fp8 weight strategy {strategy!r}")
        acts = _ct_acts(m, a, "float")
        return (W8A8LinearMethod(FP8, strategy, acts, kernels), _label("fp8", strategy, acts),
                f"fp8-{strategy}-{acts or 'a16'}")
    if kind == "int" and bits == 8:
        if fmt not in (None, "int-quantized", "naive-quantized"):
            raise _refuse(m, f"int8 weights in format {fmt!r}")
        if not w.get("symmetric", True):
            raise _refuse(m, "asymmetric int8 weights")
        if strategy not in ("channel", "tensor"):
            raise _refuse(m, f"int8 weight strategy {strategy!r}")
        acts = _ct_acts(m, a, "int")
        if acts is None:
            raise _refuse(m, "int8 weight-only (W8A16)")
        return (W8A8LinearMethod(torch.int8, strategy, acts, kernels), _label("int8", strategy, acts),
                f"int8-{strategy}-{acts}")
    if kind == "int" and bits == 4:
        if fmt not in (None, "pack-quantized"):
            raise _refuse(m, f"4-bit weights in format {fmt!r} (pack-quantized is supported)")
        if a is not None:
            raise _refuse(m, "4-bit weights with quantized activations (W4A8)")
        if strategy not in ("group", "channel"):
            raise _refuse(m, f"4-bit weight strategy {strategy!r}")
        gs = w.get("group_size") if strategy == "group" else None
        sym = bool(w.get("symmetric", True))
        return (W4A16LinearMethod("compressed-tensors", gs, sym, kernels=kernels),
                f"int4 weights, group {gs or 'channel'}{'' if sym else ' with zero points'}, activations unquantized",
                f"w4a16-g{gs or 'channel'}")
    raise _refuse(m, f"weights of {bits} bits of type {kind!r}")


def _ct_acts(m: str, a: dict | None, kind: str) -> str | None:
    if a is None:
        return None
    if a.get("type", "int") != kind or a.get("num_bits") != 8:
        raise _refuse(m, f"{kind} weights with activations {a!r}")
    if not a.get("symmetric", True):
        raise _refuse(m, "asymmetric activation quantization")
    if a.get("dynamic") is True and a.get("strategy") == "token":
        return "dynamic"
    if not a.get("dynamic") and a.get("strategy") == "tensor":
        return "static"
    raise _refuse(m, f"activation strategy {a.get('strategy')!r} with dynamic={a.get('dynamic')!r}")


def _block_acts(acts: str | None, block: Any) -> str:
    return f"dynamic per-token-group (1 x {block[1]}) activations" if acts else "activations unquantized"


def _label(name: str, strategy: str, acts: str | None) -> str:
    a = {"dynamic": "dynamic per-token activations", "static": "static per-tensor activations",
         None: "activations unquantized"}[acts]
    return f"{name} W8A8 ({'per-channel' if strategy == 'channel' else 'per-tensor'} weights, {a})" if acts else \
        f"{name} weights ({strategy}), {a}"


def _compressed_tensors(qc: dict, kernels: str) -> QuantizationScheme:
    m = "compressed-tensors"
    if qc.get("format") == "dense" or qc.get("quantization_status") not in (None, "compressed", "frozen"):
        raise _refuse(m, f"format {qc.get('format')!r} with status {qc.get('quantization_status')!r}")
    groups = []
    for gname, group in (qc.get("config_groups") or {}).items():
        targets = list(group.get("targets") or [])
        bad = [t for t in targets if t != "Linear" and t[:1].isupper() and "." not in t]   # other classes
        if bad:
            raise _refuse(m, f"config group {gname!r} targets {bad} (supported: 'Linear', module names, 're:' regexes)")
        method, label, key = _ct_scheme(group, qc.get("format"), kernels)
        groups.append((targets, method, label, key))
    if not groups:
        raise _refuse(m, "no config_groups")
    ignore = list(qc.get("ignore") or [])

    def ignores(name: str) -> bool:
        return any(_match(t, name) for t in ignore)

    def pick(name: str) -> Any:
        for targets, method, _, _ in groups:
            if any(t == "Linear" or _match(t, name) for t in targets):
                return method
        return None

    labels = sorted({g[2] for g in groups})
    return QuantizationScheme(m, "; ".join(labels), _Chooser(pick, ignores), "+".join(sorted({g[3] for g in groups})))


# ---------------------------------------------------------------- fp8, gptq, awq
def _fp8(qc: dict, kernels: str) -> QuantizationScheme:
    acts = qc.get("activation_scheme", "dynamic")
    if acts not in ("dynamic", "static"):
        raise _refuse("fp8", f"activation_scheme {acts!r}")
    skip = _substring_ignores((qc.get("modules_to_not_convert") or []) + (qc.get("ignored_layers") or []))
    block = qc.get("weight_block_size")
    if block is not None:
        if acts != "dynamic":
            raise _refuse("fp8", "block-wise weights with static activation scales")
        method = BlockFp8LinearMethod(tuple(block), "weight_scale_inv", kernels, "dynamic")
        return QuantizationScheme("fp8", f"fp8 block {list(block)} weights, {_block_acts('dynamic', block)}",
                                  _Chooser(lambda n: method, skip), "fp8-block-dynamic")
    method = W8A8LinearMethod(FP8, "tensor", acts, kernels)
    return QuantizationScheme("fp8", _label("fp8", "tensor", acts), _Chooser(lambda n: method, skip),
                              f"fp8-tensor-{acts}")


def _gptq(qc: dict, kernels: str) -> QuantizationScheme:
    bits = qc.get("bits", 4)
    if bits != 4:
        raise _refuse("gptq", f"{bits}-bit weights")
    if qc.get("desc_act"):
        raise _refuse("gptq", "desc_act=True (act-order)")
    if qc.get("dynamic"):
        raise _refuse("gptq", "per-module `dynamic` overrides")
    if qc.get("lm_head"):
        raise _refuse("gptq", "a quantized lm_head")
    fmt = qc.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        raise _refuse("gptq", f"checkpoint_format {fmt!r}")
    gs = qc.get("group_size", 128)
    method = W4A16LinearMethod("gptq", gs, gptq_v2=fmt == "gptq_v2", kernels=kernels)
    inside = [n for block in (qc.get("modules_in_block_to_quantize") or []) for n in
              (block if isinstance(block, list) else [block])]

    def listed(name: str) -> bool:
        """In modules_in_block_to_quantize, itself or as a part of a listed merged module
        (Phi-3's qkv_proj); a merged module of the model is decided by its parts."""
        if any(name.endswith(m) for m in inside):
            return True
        prefix, _, leaf = name.rpartition(".")
        return any(leaf in parts and any(f"{prefix}.{merged}".endswith(m) for m in inside)
                   for merged, parts in FUSED.items())

    pick = (lambda n: method if listed(n) else None) if inside else (lambda n: method)
    return QuantizationScheme("gptq", f"int4 weights (GPTQ), group {gs if gs not in (None, -1) else 'channel'}, "
                              "activations unquantized", _Chooser(pick, lambda n: False),
                              f"w4a16-g{gs if gs not in (None, -1) else 'channel'}")


def _awq(qc: dict, kernels: str) -> QuantizationScheme:
    bits = qc.get("bits", qc.get("w_bit", 4))
    if bits != 4:
        raise _refuse("awq", f"{bits}-bit weights")
    version = str(qc.get("version", qc.get("backend", "gemm"))).lower()
    if version != "gemm":
        raise _refuse("awq", f"version {version!r}")
    if not qc.get("zero_point", True):
        raise _refuse("awq", "zero_point=False")
    gs = qc.get("group_size", qc.get("q_group_size", 128))
    method = W4A16LinearMethod("awq", gs, kernels=kernels)
    return QuantizationScheme("awq", f"int4 weights (AWQ), group {gs}, activations unquantized",
                              _Chooser(lambda n: method, _substring_ignores(qc.get("modules_to_not_convert"))),
                              f"w4a16-g{gs}")

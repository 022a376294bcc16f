"""Static per-layer K and V scales of an fp8 KV cache: given, from the checkpoint, or calibrated.

An fp8 (e4m3fn) cache stores K / k_scale and V / v_scale (one scale per layer each); e4m3
holds magnitudes up to 448, so a scale of amax / 448 maps a layer's largest value onto
e4m3's largest. Where the scales come from, first match wins:

1. `kv_scales=` given to the engine: one (k_scale, v_scale) pair for every layer, or a list
   of one pair per layer.
2. The checkpoint: tensors `model.layers.{i}.self_attn.k_scale` / `v_scale` (vLLM's and
   llm-compressor's names), or one `kv_scale` for both (AutoFP8's), in its safetensors.
3. Calibration at start-up, as vLLM does with `calculate_kv_scales` (amax of the first batch):
   one prefill of CALIBRATION_TEXTS (tokenised; seeded random token ids when the model has no
   tokenizer) through the model, writing into a temporary cache of the model's dtype; per
   layer, the largest |K| (after rotary) and |V| written gives k_scale = amax_K / 200 and
   v_scale = amax_V / 100: vLLM's constants (K_SCALE_CONSTANT, V_SCALE_CONSTANT), i.e. a
   headroom of 448/200 = 2.24x (K) and 4.48x (V) above the calibration's largest value before
   e4m3 saturates at 448. e4m3 being floating point, a scale sets the range, not the relative
   precision (3 mantissa bits whatever the scale); headroom costs only at the small end, where
   values fall into e4m3's subnormals. Of the scales tried (these, amax/448 and 2 x amax/448
   for both) these gave the lowest KL, though the three are within a few tens of percent of
   each other (`benchmarks/fp8_kv.py`; docs/decisions/0011-fp8-kv-cache-scales-and-fp16-math.md).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

import torch

from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout
from toolkit.kernels.reference import FP8_MAX

log = logging.getLogger(__name__)

K_HEADROOM = 448 / 200          # vLLM: k_scale = amax / K_SCALE_CONSTANT (200)
V_HEADROOM = 448 / 100          # vLLM: v_scale = amax / V_SCALE_CONSTANT (100)
# what fp8 costs, measured (`python -m benchmarks.fp8_kv --mode cpu`; docs/decisions/0011-*.md):
# shown by the engine's repr and docs/interfaces.md next to the knob
MEASURED_COST = ("measured on SmolLM2-135M vs float32: next-token KL 6.3e-3 nats, total variation "
                 "0.029, top-1 97.3%, greedy equal for 27% of 128 tokens before the first difference; "
                 "a bf16 cache: KL 2.6e-5, 89%")
CALIBRATION_SEED = 0
CALIBRATION_TEXTS = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden screw press. Within fifty years, "
    "presses in more than two hundred European cities had produced millions of books, and the "
    "price of a copy fell so far that reading spread well beyond monasteries and universities.",
    "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n    i = j = 0\n    out = []\n"
    "    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n"
    "        else:\n            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n",
    "Q: A train leaves at 14:35 and arrives at 18:10. How long is the journey? A: From 14:35 to "
    "18:35 is 4 hours; 18:10 is 25 minutes earlier, so the journey takes 3 hours 35 minutes. "
    "Q: What is 17% of 2,400? A: 10% is 240 and 7% is 168, so 17% is 408.",
    "User: Can you recommend a good way to learn a new language?\nAssistant: Practise a little "
    "every day, listen to native speakers, read simple books, and do not be afraid of mistakes; "
    "conversation partners and spaced-repetition flashcards help most learners stay consistent.",
)
CALIBRATION_RANDOM_SHAPE = (4, 96)     # prompts x tokens when the model has no tokenizer

_CKPT_NAME = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(k_scale|v_scale|kv_scale)$")


def scale_pairs(kv_scales: Any, num_layers: int | None) -> tuple[list[float], list[float]]:
    """(k_scales, v_scales) from one (k, v) pair for every layer or a list of per-layer pairs;
    num_layers None only validates a list's pairs. Raises ValueError naming what is valid."""
    valid = "one (k_scale, v_scale) pair of numbers > 0, or a list of one such pair per layer"

    def pair(x: Any) -> tuple[float, float] | None:
        if isinstance(x, (list, tuple)) and len(x) == 2 and all(
                isinstance(s, (int, float)) and not isinstance(s, bool) for s in x):
            k, v = float(x[0]), float(x[1])
            if math.isfinite(k) and math.isfinite(v) and k > 0 and v > 0:
                return k, v
            raise ValueError(f"kv_scales must be finite and > 0, got {x!r}")
        return None

    one = pair(kv_scales)
    if one is not None:
        n = num_layers or 1
        return [one[0]] * n, [one[1]] * n
    if not isinstance(kv_scales, (list, tuple)) or not kv_scales:
        raise ValueError(f"kv_scales must be {valid}; got {kv_scales!r}")
    pairs = [pair(x) for x in kv_scales]
    if any(p is None for p in pairs):
        raise ValueError(f"kv_scales must be {valid}; got {kv_scales!r}")
    if num_layers is not None and len(pairs) != num_layers:
        raise ValueError(f"kv_scales has {len(pairs)} pairs; the model has {num_layers} layers")
    return [p[0] for p in pairs], [p[1] for p in pairs]   # type: ignore[index]


def checkpoint_scales(folder: str | Path, num_layers: int) -> tuple[list[float], list[float]] | None:
    """Per-layer (k_scales, v_scales) stored in a safetensors checkpoint, None when it has none."""
    from toolkit.models.weights import resolve_format, shard_files

    folder = Path(folder)
    try:
        if resolve_format(folder, "auto") != "safetensors":
            return None
        files = shard_files(folder, "safetensors")
    except (FileNotFoundError, ValueError):
        return None
    from safetensors import safe_open

    found: dict[str, dict[int, float]] = {"k_scale": {}, "v_scale": {}}
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                m = _CKPT_NAME.match(name)
                if m is None:
                    continue
                layer, kind = int(m.group(1)), m.group(2)
                value = float(f.get_tensor(name).float().reshape(-1)[0])
                for k in (("k_scale", "v_scale") if kind == "kv_scale" else (kind,)):
                    found[k][layer] = value
    if not found["k_scale"] and not found["v_scale"]:
        return None
    want = set(range(num_layers))
    if set(found["k_scale"]) != want or set(found["v_scale"]) != want:
        raise ValueError(f"the checkpoint in {folder} has KV scales for layers "
                         f"{sorted(found['k_scale'])} (K) and {sorted(found['v_scale'])} (V) of "
                         f"{num_layers}; give kv_scales= to use an fp8 KV cache with it")
    return ([found["k_scale"][i] for i in range(num_layers)],
            [found["v_scale"][i] for i in range(num_layers)])


def calibration_prompts(tokenizer: Any, vocab_size: int) -> list[list[int]]:
    """Token ids of CALIBRATION_TEXTS, or seeded random ids when there is no tokenizer."""
    if tokenizer is not None:
        return [list(tokenizer.encode(t)) for t in CALIBRATION_TEXTS]
    g = torch.Generator().manual_seed(CALIBRATION_SEED)
    n, t = CALIBRATION_RANDOM_SHAPE
    return torch.randint(vocab_size, (n, t), generator=g).tolist()


class _AmaxRecorder:
    """An attention backend's stand-in that records max |K| and |V| per layer as they are written."""

    def __init__(self, backend: Any, num_layers: int) -> None:
        self.backend = backend
        self.k_amax: list[torch.Tensor | None] = [None] * num_layers
        self.v_amax: list[torch.Tensor | None] = [None] * num_layers

    # it must see every K/V: not the backend's fused write (rotary storing them itself)
    supports_fused_kv_write = False

    def __getattr__(self, name: str) -> Any:       # num_heads, scale, ...: the backend's
        return getattr(self.backend, name)

    def plan(self, layout: PagedKVLayout) -> None:
        self.backend.plan(layout)

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        for store, x in ((self.k_amax, k), (self.v_amax, v)):
            a = x.detach().abs().amax().float()
            store[layer] = a if store[layer] is None else torch.maximum(store[layer], a)
        self.backend.write_kv(layer, k, v)

    def run(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.backend.run(layer, q)


@torch.inference_mode()
def calibrate(model: Any, prompts: Sequence[Sequence[int]], make_attention: Callable[[KVCache], Any],
              dtype: torch.dtype, device: torch.device, block_size: int = 16,
              headroom: tuple[float, float] = (K_HEADROOM, V_HEADROOM),
              ) -> tuple[list[float], list[float]]:
    """(k_scales, v_scales): one prefill of the prompts (a ragged batch) through the model over a
    temporary cache of `dtype`; per layer k_scale = amax_K x headroom[0] / 448, v_scale = amax_V x
    headroom[1] / 448 (a layer whose K or V is all zero gets 1.0). make_attention(cache) builds
    the attention backend over that cache."""
    if min(headroom) <= 0 or not prompts or not all(prompts):
        raise ValueError("calibration needs non-empty prompts and headrooms > 0")
    blocks = [-(-len(p) // block_size) for p in prompts]
    cache = KVCache(model.spec.num_layers, sum(blocks), block_size, model.spec.num_kv_heads, model.spec.head_dim,
                    dtype, device)
    tables, start = [], 0
    for n in blocks:
        tables.append(list(range(start, start + n)))
        start += n
    lens = [len(p) for p in prompts]
    layout = PagedKVLayout.build(tables, lens, lens, block_size, device)
    recorder = _AmaxRecorder(make_attention(cache), model.spec.num_layers)
    recorder.plan(layout)
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=device)
    pos = torch.cat([torch.arange(n, dtype=torch.long) for n in lens]).to(device)
    model.forward(ids, pos, recorder)
    amax = torch.stack([torch.stack([k, v]) for k, v in zip(recorder.k_amax, recorder.v_amax)]).tolist()
    cache.close()
    scale = lambda a, h: a * h / FP8_MAX if a > 0 and math.isfinite(a) else 1.0
    bad = [i for i, (k, v) in enumerate(amax) if not (math.isfinite(k) and math.isfinite(v))]
    if bad:
        raise ValueError(f"calibration found non-finite K/V in layers {bad}: the model's "
                         "activations overflow; give kv_scales= instead")
    return [scale(k, headroom[0]) for k, _ in amax], [scale(v, headroom[1]) for _, v in amax]


def resolve_scales(kv_cache: KVCache, kv_scales: Any, folder: str | Path | None, model: Any,
                   tokenizer: Any, make_attention: Callable[[KVCache], Any], dtype: torch.dtype,
                   ) -> str:
    """Set an fp8 cache's scales (given, checkpoint, or calibrated); returns where they came from."""
    if kv_scales is not None:
        k, v = scale_pairs(kv_scales, kv_cache.num_layers)
        source = "given"
    else:
        found = checkpoint_scales(folder, kv_cache.num_layers) if folder is not None else None
        if found is not None:
            (k, v), source = found, "checkpoint"
        else:
            prompts = calibration_prompts(tokenizer, model.spec.vocab_size)
            k, v = calibrate(model, prompts, make_attention, dtype, kv_cache.device,
                             kv_cache.block_size)
            source = f"calibrated (amax_K / 200, amax_V / 100 over {sum(map(len, prompts))} tokens)"
    kv_cache.set_scales(k, v, source)
    log.info("fp8 KV scales %s: K %.3g..%.3g, V %.3g..%.3g", source, min(k), max(k), min(v), max(v))
    return source

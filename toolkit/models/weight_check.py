"""Check a whole weight update against a model before any tensor is copied (an update is all
or nothing: `LLM.update_weights` refuses it with every weight unchanged).

For each (checkpoint name, tensor) the check does what `load_weights` would decide, without
writing: the name maps to a parameter (and a shard of a merged one), the tensor has that
checkpoint tensor's full shape (`param.shards`, linear.py's module doc) and a dtype the
parameter can take. Native models (causal_lm.py) and the Transformers backend are checked;
for any other model `check_update` answers False and the caller keeps a rollback copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from toolkit.models.layers.parallel import shape_of

MAX_LISTED = 5     # problems named in the error


def check_update(model: Any, weights: Sequence[tuple[str, Any]]) -> bool:
    """True when every tensor has a place of its shape in the model; ValueError (TypeError for
    a wrong type) naming every problem otherwise; False when this model cannot be checked."""
    for i, item in enumerate(weights):
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(f"weights must be (checkpoint name, tensor) pairs; item {i} is "
                            f"{type(item).__name__}")
        name, t = item
        if not isinstance(name, str):
            raise TypeError(f"a checkpoint name must be a string, got {type(name).__name__} (item {i})")
        if not (isinstance(t, torch.Tensor) or hasattr(t, "get_shape")):
            raise TypeError(f"{name!r}: a weight must be a torch.Tensor, got {type(t).__name__}")
    if hasattr(model, "map_name") and hasattr(model, "named_parameters"):
        problems = _native(model, weights)
        if problems is None:
            return False
    elif hasattr(model, "hf") and hasattr(model.hf, "state_dict"):
        problems = _transformers(model, weights)
    else:
        return False
    if problems:
        listed = "; ".join(problems[:MAX_LISTED])
        more = f" (and {len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
        raise ValueError(f"update_weights refused, no weight was changed: {len(problems)} of "
                         f"{len(weights)} tensors do not fit {type(model).__name__}: {listed}{more}")
    return True


def _dtype_problem(name: str, t: Any, param: torch.Tensor) -> str | None:
    dtype = getattr(t, "dtype", None)
    if isinstance(dtype, torch.dtype) and param.is_floating_point() and not dtype.is_floating_point:
        return f"{name!r} is {dtype}, the parameter is {param.dtype} (give a floating-point tensor)"
    return None


def _native(model: Any, weights: Sequence[tuple[str, Any]]) -> list[str] | None:
    """The problems; None when a parameter does not declare its checkpoint shapes (`shards`)."""
    from toolkit.models.causal_lm import IGNORED_SUFFIXES

    params = dict(model.named_parameters())
    tied = getattr(model, "lm_head", 0) is None
    problems: list[str] = []
    for name, t in weights:
        if name.endswith(IGNORED_SUFFIXES) or (name == "lm_head.weight" and tied):
            continue                                   # load_weights skips them too
        target, shard = model.map_name(name)
        p = params.get(target)
        if p is None:
            problems.append(f"{name!r} has no place in the model (unknown name)")
            continue
        if not hasattr(p, "shards"):
            return None
        want = _shard_shape(p.shards, shard)
        if want is None:
            problems.append(f"{name!r} maps to shard {shard!r} of {target!r}, whose shards are "
                            f"{[sid for sid, _ in p.shards]}")
        elif tuple(shape_of(t)) != tuple(want):
            problems.append(f"{name!r} has shape {tuple(shape_of(t))}, the model expects {tuple(want)}")
        elif hasattr(p, "check_value"):            # read and checked, not kept (GPTQ's g_idx): its
            try:                                   # own check, now, not halfway through the load
                p.check_value(t, shard)
            except ValueError as e:
                problems.append(f"{name!r}: {e}")
        else:
            bad = _dtype_problem(name, t, p)
            if bad:
                problems.append(bad)
    return problems


def _shard_shape(shards: list[tuple[Any, tuple[int, ...]]], shard: Any) -> tuple[int, ...] | None:
    """The full checkpoint shape a shard id takes; None: not a shard of this parameter. Shard
    None on a merged parameter is its fused checkpoint tensor (rows of every shard)."""
    ids = [sid for sid, _ in shards]
    if shard in ids:
        return tuple(shards[ids.index(shard)][1])
    if shard is None and shards:
        first = tuple(shards[0][1])
        if all(tuple(s[1:]) == first[1:] for _, s in shards):
            return (sum(s[0] for _, s in shards),) + first[1:]
    return None


def _transformers(model: Any, weights: Sequence[tuple[str, Any]]) -> list[str]:
    from toolkit.models.transformers.weights import checkpoint_renamer
    from toolkit.models.transformers_backend import _tied_names

    state = model.hf.state_dict(keep_vars=True)
    tied = _tied_names(model.hf)
    rename = checkpoint_renamer(model.hf, state)
    problems: list[str] = []
    for name, t in weights:
        try:
            target = rename(name)
        except ValueError as e:
            problems.append(str(e))
            continue
        if target in tied or name.endswith("rotary_emb.inv_freq"):
            continue
        dest = state.get(target)
        if dest is None:
            problems.append(f"{name!r} has no place in the model (unknown name)")
        elif tuple(shape_of(t)) != tuple(dest.shape):
            problems.append(f"{name!r} has shape {tuple(shape_of(t))}, the model expects {tuple(dest.shape)}")
        else:
            bad = _dtype_problem(name, t, dest)
            if bad:
                problems.append(bad)
    return problems

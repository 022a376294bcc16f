"""ShardedLlama: one rank's part of the Llama-family decoder, and how it is filled.

It is `LlamaForCausalLM` built on a local copy of the config (num_attention_heads / N,
KV heads / N or 1, intermediate / N, vocab / N padded) with the layers that talk to the
other ranks swapped in: qkv_proj and gate_up_proj column-parallel, o_proj and down_proj
row-parallel (all-reduce), the embedding vocabulary-parallel (all-reduce) and the LM head's
logits gathered to rank 0. Everything else (norms, rotary, attention over this rank's KV
heads) is the unsharded model's code. `vocab_size` and `config` answer for the whole model.

Filling it: `load_shard(model, folder)` reads only this rank's slices of each checkpoint
tensor (safetensors `get_slice`); `random_shard(model)` draws the full random model TP=1
would draw (`loader.init_random`: the same generator, the same order, the same memory
layout), one full parameter at a time on this rank's device, and keeps this rank's slices.
For big shapes that costs one full parameter of extra memory at a time (Llama-3.1-70B's
gate_up_proj: 0.94 GB in bf16) and the whole model's generation time on every rank (in
parallel; ~the TP=1 init time).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from toolkit.models.llama import Geometry, LlamaForCausalLM, _matrix
from toolkit.parallel.group import Group
from toolkit.parallel.layers import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                     parallel_logits, vocab_slice)
from toolkit.parallel.sharding import TPShape, check_tensor_parallel


class ShardedLlama(LlamaForCausalLM):
    def __init__(self, config: Any, group: Group, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", eos_token_ids: list[int] | None = None) -> None:
        check_tensor_parallel(config, group.size)
        full = Geometry(config)
        tp = TPShape.of(full, group.rank, group.size)
        local = copy.deepcopy(config)
        local.num_attention_heads = full.num_heads // group.size
        local.num_key_value_heads = tp.local_kv_heads
        local.head_dim = full.head_dim
        local.intermediate_size = full.intermediate // group.size
        local.vocab_size = vocab_slice(full.vocab_size, group.rank, group.size)[1]
        super().__init__(local, dtype=dtype, device=device, eos_token_ids=eos_token_ids)
        self.config, self.full_geometry, self.tp, self.group = config, full, tp, group
        dev = self.device
        h, d, hkv, inter = full.num_heads, full.head_dim, full.num_kv_heads, full.intermediate
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.qkv_proj = ColumnParallelLinear(full.hidden, [(h * d, tp.q), (hkv * d, tp.kv), (hkv * d, tp.kv)],
                                                 full.qkv_bias, dtype, dev)
            attn.o_proj = RowParallelLinear(h * d, tp.q, full.hidden, full.o_bias, group, dtype, dev)
            mlp.gate_up_proj = ColumnParallelLinear(full.hidden, [(inter, tp.inter), (inter, tp.inter)],
                                                    full.mlp_bias, dtype, dev)
            mlp.down_proj = RowParallelLinear(inter, tp.inter, full.hidden, full.mlp_bias, group, dtype, dev)
        self.model.embed_tokens = VocabParallelEmbedding(full.vocab_size, full.hidden, group, dtype, dev)

    vocab_size = property(lambda self: self.full_geometry.vocab_size)

    def extra_repr(self) -> str:
        return f"rank {self.group.rank} of {self.group.size}, " + super().extra_repr()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)                 # [T, hidden], all-reduced

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """hidden [N, hidden] -> float32 logits [N, V] on rank 0, None on the others."""
        head = self.model.embed_tokens if self.geometry.tie_word_embeddings else self.lm_head
        return parallel_logits(hidden, head.weight, self.group, self.vocab_size)

    def local_tensor(self, name: str, full: Any) -> torch.Tensor:
        """This rank's part of checkpoint tensor `name` from `full`: a tensor, or a safetensors
        slice (only the rank's rows / columns are read). Vocabulary rows are zero-padded."""
        shape = full.get_shape() if hasattr(full, "get_shape") else list(full.shape)
        spec = self.tp.slice_of(name, len(shape))
        if spec is None:
            t = full[:] if hasattr(full, "get_shape") else full
        else:
            dim, s = spec
            t = full[s.start:s.start + s.size] if dim == 0 else full[:, s.start:s.start + s.size]
        if name.split(".")[-2:-1] in (["embed_tokens"], ["lm_head"]):
            per = self.model.embed_tokens.weight.shape[0]
            if t.shape[0] < per:
                t = torch.cat([t, t.new_zeros(per - t.shape[0], *t.shape[1:])])
        return t


def load_shard(model: ShardedLlama, folder: Path, fmt: str) -> None:
    """Fill the shard from a Hugging Face folder, reading only its slices; ValueError when a
    tensor the model needs is missing (as `load_model`)."""
    from toolkit.models.weights import shard_files

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for path in shard_files(folder, fmt):
            if fmt == "safetensors":
                from safetensors import safe_open

                with safe_open(str(path), framework="pt", device="cpu") as f:
                    for name in f.keys():
                        yield name, model.local_tensor(name, f.get_slice(name))
            else:
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
                for name, t in state.items():
                    yield name, model.local_tensor(name, t)
                del state

    _fill(model, tensors(), f"checkpoint in {folder}")


@torch.no_grad()
def random_shard(model: ShardedLlama, std: float = 0.02, seed: int = 0) -> None:
    """Fill the shard with its slices of the random model `load_model(config)` draws at TP=1."""
    _fill(model, ((name, model.local_tensor(name, t)) for name, t in
                  random_checkpoint(model.config, model.dtype, model.device, std, seed)), "random init")


def random_checkpoint(config: Any, dtype: torch.dtype, device: torch.device, std: float = 0.02,
                      seed: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, full tensor) of the random model TP=1 builds, one parameter at a
    time: `init_random`'s order, generator and memory layout (on the CPU a matrix's storage is
    [in, out]: `_matrix`), merged parameters split back into the checkpoint's tensors."""
    full = LlamaForCausalLM(config, dtype=dtype, device="meta")     # names and shapes only
    g = full.geometry
    gen = torch.Generator(device=device).manual_seed(seed)
    q, kv = g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim
    for name, p in full.named_parameters():
        t = (_matrix(p.shape[0], p.shape[1], dtype, device).data if p.dim() == 2
             else torch.empty(p.shape, dtype=dtype, device=device))
        if name.endswith("norm.weight"):
            t.fill_(1.0)
        elif name.endswith(".bias"):
            t.zero_()
        else:
            t.normal_(0.0, std, generator=gen)
        yield from _unmerge(name, t, [q, kv, kv], [g.intermediate, g.intermediate])


def _unmerge(name: str, t: torch.Tensor, qkv: list[int], gate_up: list[int]
             ) -> Iterable[tuple[str, torch.Tensor]]:
    for merged, subs, sizes in ((".qkv_proj.", ("q_proj", "k_proj", "v_proj"), qkv),
                                (".gate_up_proj.", ("gate_proj", "up_proj"), gate_up)):
        if merged in name:
            return [(name.replace(merged, f".{sub}."), part) for sub, part in zip(subs, t.split(sizes))]
    return [(name, t)]


def _fill(model: ShardedLlama, tensors: Iterable[tuple[str, torch.Tensor]], what: str) -> None:
    loaded = model.load_weights(tensors)
    missing = [f"{name}" + (f" (part {i} of {n})" if n > 1 else "")
               for name, n in model.expected_weights().items() for i in range(n)
               if (name, i) not in loaded]
    if missing:
        raise ValueError(f"{what} lacks {len(missing)} tensor(s) the model needs: "
                         f"{missing[:8]}{' ...' if len(missing) > 8 else ''}")


def build_shard(source: Any, group: Group, *, dtype: torch.dtype, device: torch.device,
                load_format: str = "auto") -> ShardedLlama:
    """This rank's model from a Hugging Face folder (its slices only) or a config (random)."""
    from toolkit.models.loader import _eos_token_ids, load_config, model_class
    from toolkit.models.weights import resolve_format

    folder = None
    if isinstance(source, (str, Path)):
        folder = Path(source)
        config = load_config(folder)
    else:
        config, load_format = source, "dummy"
    if not issubclass(model_class(config), LlamaForCausalLM):
        raise ValueError(f"tensor parallelism supports the Llama-family decoder; "
                         f"{model_class(config).__name__} is not one")
    model = ShardedLlama(config, group, dtype=dtype, device=device,
                         eos_token_ids=_eos_token_ids(folder, config))
    if load_format == "dummy":
        random_shard(model)
    else:
        load_shard(model, folder, resolve_format(folder, load_format))
    if model.device.type == "cuda":       # the full random tensors' memory back before the KV sizing
        torch.cuda.empty_cache()
    return model.eval()

"""CausalLM: what every native model file shares — the spec, the LM head, loading and random
weights — so a family file holds only its layers and its checkpoint names.

Loading (vLLM's weight-loader design): a checkpoint tensor's name is mapped to a parameter
(and, for a merged projection, a shard id: `stacked`), and the parameter's own
`weight_loader` places this rank's part of it (linear.py's module doc). Random weights go
through the same loaders: each checkpoint tensor is drawn whole (its full shape, a generator
seeded by its name), so every tensor-parallel size draws the same model.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any, Callable

import torch
from torch import nn

from toolkit.models.base import LayerAttention, ModelSpec, eos_ids, in_vocabulary
from toolkit.models.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from toolkit.models.layers.linear import LinearMethod
from toolkit.models.layers.parallel import single_process
from toolkit.models.ops import model_ops

# buffers some checkpoints carry that no layer holds (fp8 KV scales: worker/kv_scales.py)
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "self_attn.k_scale", "self_attn.v_scale",
                    "self_attn.kv_scale")


class CausalLM(nn.Module):
    """Base of the native decoders. A subclass builds `self.model` (embed_tokens, layers,
    norm: Hugging Face's module names) and, unless tied, `self.lm_head`, then calls
    `self.finish(...)` with the numbers of its spec."""

    # checkpoint submodule -> (the merged submodule here, shard id), e.g. q_proj -> (qkv_proj, "q")
    stacked: dict[str, tuple[str, Any]] = {}
    final_logit_softcap: float | None = None

    def __init__(self, config: Any, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", group: Any = None, kernels: str = "auto",
                 eos_token_ids: list[int] | None = None,
                 linear_method: Callable[[str], LinearMethod | None] | None = None) -> None:
        super().__init__()
        self.config, self.dtype, self.device = config, dtype, torch.device(device)
        # the layer's name (Hugging Face's module path) -> its arithmetic; None: dense. What a
        # quantization config or LoRA plugs in, with no change to a model file
        self.linear_method = linear_method
        self.group = group if group is not None else single_process()
        self.ops = model_ops(self.device, kernels)
        self._eos = tuple(eos_token_ids) if eos_token_ids is not None else eos_ids(config)
        self.max_model_len = int(getattr(config, "max_position_embeddings", 2048))

    # ------------------------------------------------------------------ building
    def layout(self) -> dict[str, Any]:
        """dtype / device / group keywords of the layers."""
        return dict(dtype=self.dtype, device=self.device, group=self.group)

    def linear(self, prefix: str) -> dict[str, Any]:
        """The keywords of the linear layer named `prefix` (e.g. "model.layers.3.mlp.down_proj"):
        layout() and the LinearMethod linear_method chose for it."""
        method = self.linear_method(prefix) if self.linear_method is not None else None
        return dict(self.layout(), method=method)

    def make_head(self, vocab_size: int, hidden: int, tied: bool) -> None:
        self.model.embed_tokens = VocabParallelEmbedding(vocab_size, hidden, **self.layout())
        self.lm_head = None if tied else ParallelLMHead(vocab_size, hidden, **self.layout())

    def finish(self, *, num_heads: int, num_kv_heads: int, head_dim: int, hidden: int,
               vocab_size: int, layers: list[LayerAttention], **capabilities: bool) -> None:
        arch = (getattr(self.config, "architectures", None) or [type(self).__name__])[0]
        self.spec = ModelSpec(architecture=arch, num_layers=len(layers), num_heads=num_heads,
                              num_kv_heads=num_kv_heads, head_dim=head_dim, hidden_size=hidden,
                              vocab_size=vocab_size, dtype=self.dtype, max_model_len=self.max_model_len,
                              eos_token_ids=in_vocabulary(self._eos, vocab_size), layers=tuple(layers),
                              **capabilities)

    # ------------------------------------------------------------------ the contract
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids int64 [T] -> [T, hidden]."""
        return self.model.embed_tokens(input_ids)

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
        """hidden [N, hidden] -> float32 logits [N, V] (written into `out` when given, TP=1);
        None on ranks other than 0 of a tensor-parallel group."""
        head = self.lm_head if self.lm_head is not None else self.model.embed_tokens
        if self.group.size == 1:          # one GEMM, into `out` when given
            logits = self.ops.lm_head_logits(hidden, head.weight, out=out)
        else:                             # each rank's vocabulary rows, gathered to rank 0
            logits = head.logits(hidden, self.ops.lm_head_logits)
        cap = self.final_logit_softcap
        if cap is not None and logits is not None:    # Gemma 2: cap * tanh(logits / cap)
            logits.div_(cap).tanh_().mul_(cap)
        return logits

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[tuple[str, int]]:
        """Place checkpoint tensors (Hugging Face names; tensors or safetensors slice handles)
        in the parameters. Returns the (parameter, shard index) pairs written. ValueError on a
        name with no place in the model or a shape mismatch (naming both shapes)."""
        params = dict(self.named_parameters())
        loaded: set[tuple[str, int]] = set()
        for name, tensor in weights:
            if name.endswith(IGNORED_SUFFIXES) or (name == "lm_head.weight" and self.lm_head is None):
                continue
            target, shard = self.map_name(name)
            if target not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no place in {type(self).__name__} "
                                 f"(model_type {getattr(self.config, 'model_type', '?')!r}); is it "
                                 f"the right architecture?")
            p = params[target]
            try:
                p.weight_loader(p, tensor, shard)
            except ValueError as e:
                raise ValueError(f"{name!r}: {e}") from None
            ids = [sid for sid, _ in p.shards]
            if shard is None and None not in ids:     # a fused checkpoint tensor filled every shard
                loaded.update((target, i) for i in range(len(ids)))
            else:
                loaded.add((target, ids.index(shard)))
        return loaded

    def map_name(self, name: str) -> tuple[str, Any]:
        """(parameter name, shard id) of a checkpoint tensor."""
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in self.stacked:
            merged, shard = self.stacked[parts[-2]]
            return ".".join(parts[:-2] + [merged, parts[-1]]), shard
        return name, None

    def expected_weights(self) -> dict[str, int]:
        """Parameter name -> how many checkpoint tensors fill it (3 for qkv, 2 for gate_up)."""
        return {name: len(p.shards) for name, p in self.named_parameters()}

    @torch.no_grad()
    def init_random(self, std: float = 0.02, seed: int = 0) -> None:
        """Random weights through the loaders (module doc): matrices N(0, std), biases 0, norms
        at their checkpoint's neutral value, the same for every tensor-parallel size."""
        for name, p in self.named_parameters():
            if p.init is None:              # read-and-checked checkpoint tensors hold nothing
                continue
            for sid, shape in p.shards:
                full = torch.empty(shape, dtype=self.dtype, device=self.device)
                if callable(p.init):        # a quantized layout: (shape, generator, std) -> the tensor
                    gen = torch.Generator(device=self.device).manual_seed(
                        seed * 1_000_003 + zlib.crc32(f"{name}:{sid}".encode()))
                    full = p.init(shape, gen, std)
                elif p.init == "normal":
                    gen = torch.Generator(device=self.device).manual_seed(
                        seed * 1_000_003 + zlib.crc32(f"{name}:{sid}".encode()))
                    full.normal_(0.0, std, generator=gen)
                else:
                    full.fill_(1.0 if p.init == "ones" else 0.0)
                p.weight_loader(p, full, sid)

    def extra_repr(self) -> str:
        s = self.spec
        windows = sorted({x.window for x in s.layers if x.window is not None})
        return (f"{s.architecture}, layers={s.num_layers}, hidden={s.hidden_size}, heads="
                f"{s.num_heads}/{s.num_kv_heads} (q/kv) x {s.head_dim}, vocab={s.vocab_size}"
                + (f", windows={windows}" if windows else "")
                + f", dtype={self.dtype}, device={self.device}"
                + (f", rank {self.group.rank} of {self.group.size}" if self.group.size > 1 else ""))

"""Phi-3 (and Phi-4-mini): the Llama decoder with fused checkpoint tensors (`qkv_proj`,
`gate_up_proj` stored already merged) and, where the config says so, partial rotary."""

from __future__ import annotations

from typing import Any

from toolkit.models.layers.rotary import rope_parameters
from toolkit.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    stacked: dict = {}        # the checkpoint's names are the merged ones: no mapping

    def __init__(self, config: Any, **kw: Any) -> None:
        if rope_parameters(config)["rope_type"] == "longrope":
            raise ValueError("Phi-3's longrope scaling (the 128k-context variants) is not supported; "
                             "the 4k-context variants and rope types default / linear / llama3 / yarn are")
        super().__init__(config, family="phi3", **kw)

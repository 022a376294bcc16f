"""Multi-LoRA: many PEFT adapters on one base model in one batch (docs/guides/lora.md).

    request.py     LoRARequest (vLLM's), the prefix-cache salt of an adapter
    peft.py        reading a PEFT folder
    pool.py        AdapterPool: device slots, LRU, reference counts (reference.py: its twin)
    host_cache.py  adapters kept on the host (max_cpu_loras)
    layer.py       LoRALinearMethod: a base LinearMethod plus the batched shrink / expand
    state.py       LoRAState: the runner's side (slot loads, per-token slot indices)
"""

from toolkit.lora.request import LoRARequest

__all__ = ["LoRARequest"]

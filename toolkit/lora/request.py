"""LoRARequest: which adapter a request runs with (vLLM's class and field names)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoRARequest:
    """An adapter named by the user: `lora_name` (what the server's `model` field addresses),
    `lora_int_id` (a positive integer unique per adapter: the pool's and the prefix cache's
    key), `lora_path` (a local PEFT folder: adapter_config.json + adapter_model.safetensors).
    Positional order as vLLM's: LoRARequest("sql", 1, "/adapters/sql")."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise TypeError(f"LoRARequest.lora_name must be a non-empty string, got {self.lora_name!r}")
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool):
            raise TypeError(f"LoRARequest.lora_int_id must be an integer, got "
                            f"{type(self.lora_int_id).__name__} {self.lora_int_id!r}")
        if self.lora_int_id < 1:
            raise ValueError(f"LoRARequest.lora_int_id must be >= 1 (0 is the base model), got {self.lora_int_id}")
        if not isinstance(self.lora_path, str) and not hasattr(self.lora_path, "__fspath__"):
            raise TypeError(f"LoRARequest.lora_path must be a folder path, got {type(self.lora_path).__name__}")
        object.__setattr__(self, "lora_path", str(self.lora_path))

    # vLLM's aliases
    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path


def adapter_salt(lora_int_id: int, salt: int = 0) -> int:
    """The prefix-cache extra key of a request running adapter lora_int_id (0: the base model
    keeps `salt` unchanged): a signed 64-bit mix of both, so two adapters never share KV
    blocks and the same adapter does."""
    if not lora_int_id:
        return salt
    h = hashlib.blake2b(f"lora:{lora_int_id}:{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little", signed=True)

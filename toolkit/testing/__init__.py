"""Public conformance suites: check your own component the way the toolkit checks its own.

Imports are lazy (PEP 562) so `import toolkit.testing` pulls in no hypothesis state machine
until one is used. Add a suite by adding its names to `_EXPORTS`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "check_allocator": "toolkit.testing.allocator",
    "allocator_state_machine": "toolkit.testing.allocator",
    "check_scheduler": "toolkit.testing.scheduler", "scheduler_machine": "toolkit.testing.scheduler",
    "triton_compiles": "toolkit.kernels.compiles",
    "check_tool_format": "toolkit.testing.tool_parser",
    "check_router": "toolkit.testing.router",
    "check_adapter_pool": "toolkit.testing.lora_pool", "adapter_pool_machine": "toolkit.testing.lora_pool",
    "check_kv_connector": "toolkit.testing.kv_connector",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'toolkit.testing' has no attribute {name!r}; "
                             f"available: {sorted(_EXPORTS)}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

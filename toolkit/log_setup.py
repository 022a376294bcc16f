"""What `LLM(...)` is doing at start-up, visible in a plain script (vLLM's habit).

The toolkit logs its start-up (the model loaded, the KV cache's size, kernels compiled,
graphs captured) at INFO on the `toolkit` loggers, which Python shows only at WARNING unless
the program configures logging. `configure_logging()`, called when an LLM is built (never
at import), puts a stderr handler on the `toolkit` logger when neither it nor the root
logger has one, so a script sees those lines; a program that configured logging keeps its
own. Off with `TOOLKIT_CONFIGURE_LOGGING=0` (or vLLM's `VLLM_CONFIGURE_LOGGING=0`); the
level with `TOOLKIT_LOGGING_LEVEL` (default INFO; `WARNING` quiets start-up).
"""

from __future__ import annotations

import logging
import os

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_FORMAT = "%(levelname)s %(asctime)s %(name)s: %(message)s"


class ToolkitHandler(logging.StreamHandler):
    """The handler configure_logging adds (its class marks it: added once)."""


def configure_logging() -> None:
    """Add a stderr handler to the `toolkit` logger unless logging is configured already or
    the environment turns it off. Idempotent."""
    if "0" in (os.environ.get("TOOLKIT_CONFIGURE_LOGGING", "1"), os.environ.get("VLLM_CONFIGURE_LOGGING", "1")):
        return
    logger = logging.getLogger("toolkit")
    if logger.handlers or logging.getLogger().handlers:
        return                          # the program's (or this function's earlier) configuration
    level = os.environ.get("TOOLKIT_LOGGING_LEVEL", "INFO").upper()
    if level not in _LEVELS:
        raise ValueError(f"TOOLKIT_LOGGING_LEVEL must be one of {', '.join(_LEVELS)}; got {level!r}")
    handler = ToolkitHandler()          # stderr, as vLLM's
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(level)

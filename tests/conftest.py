"""Test-session setup: Triton's interpreter on machines without CUDA, hypothesis profiles,
and the `gpu` marker (skipped without a CUDA device)."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

if not torch.cuda.is_available():
    # Must be set before any @triton.jit function is created (i.e. before toolkit kernels import).
    os.environ.setdefault("TRITON_INTERPRET", "1")

# ci: no shrink phase. A stateful machine's failure (the scheduler storms) took minutes of
# shrinking before it was reported; without shrinking it is reported as found, in seconds,
# with the blob that reproduces it: run that test with HYPOTHESIS_PROFILE=dev to shrink it
settings.register_profile(
    "ci", max_examples=25, deadline=None, derandomize=True, print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev", max_examples=100, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

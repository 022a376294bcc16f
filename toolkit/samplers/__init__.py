"""Samplers: logits [N, V] + SamplingMetadata -> tokens (+ logprobs).

`Sampler` (pipeline.py) is the fast batched path, `ReferenceSampler` (reference.py) the
float64 oracle; `stages.py` holds the composable stages, `beam.py` one beam-search step.
"""

from toolkit.samplers.base import SamplerOutput, SamplingMetadata, seed_key
from toolkit.samplers.pipeline import Sampler
from toolkit.samplers.reference import ReferenceSampler
from toolkit.samplers.stages import Stage, default_stages

__all__ = ["Sampler", "ReferenceSampler", "SamplingMetadata", "SamplerOutput", "Stage",
           "default_stages", "seed_key"]

"""The layers model files are built from: linear layers over a swappable LinearMethod (one
code path at TP=1 and TP>1), the vocab-parallel embedding and LM head, norms, rotary
variants, GLU activations and the attention layer. See each module's docstring."""

from toolkit.models.layers.attention import Attention
from toolkit.models.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from toolkit.models.layers.linear import (ColumnParallelLinear, LinearMethod, RowParallelLinear,
                                          UnquantizedLinearMethod, column, merged_column, qkv,
                                          replicated)
from toolkit.models.layers.norm import GemmaRMSNorm, LayerNorm, RMSNorm
from toolkit.models.layers.rotary import RotaryEmbedding

__all__ = ["Attention", "ColumnParallelLinear", "GemmaRMSNorm", "LayerNorm", "LinearMethod",
           "ParallelLMHead", "RMSNorm", "RotaryEmbedding", "RowParallelLinear",
           "UnquantizedLinearMethod", "VocabParallelEmbedding", "column", "merged_column", "qkv",
           "replicated"]

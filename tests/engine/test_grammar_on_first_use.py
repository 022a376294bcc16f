"""The grammar package (and outlines-core under it) loads on a structured request's first use,
not when an engine is built: an engine without it generates plain text (a GPU machine image
lacking outlines-core failed every LLM(...) once, through EngineConfig.grammar_limits)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
sys.modules["outlines_core"] = None          # import outlines_core raises ImportError
from transformers import LlamaConfig
from toolkit import LLM, SamplingParams
c = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                intermediate_size=64, vocab_size=64, max_position_embeddings=64)
llm = LLM(c, device="cpu", dtype="float32", num_blocks=16)
out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3), use_tqdm=False)
assert len(out[0].outputs[0].token_ids) == 3
assert "toolkit.samplers.grammar.compiled" not in sys.modules
print("ok")
"""


def test_an_engine_builds_and_generates_without_the_grammar_package():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]

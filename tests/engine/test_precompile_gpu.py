"""The warm-up's parallel compile on CUDA (EngineConfig.compile_workers): its collecting pass
launches nothing and corrupts nothing (greedy tokens equal an engine that compiled in turn,
for a dense and an MoE model, each started in a new process with an empty Triton cache), and
the compiles it hands the workers are the ones the warm-up then needs (they hit the cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

_CHILD = """
import json, sys, time
from transformers import LlamaConfig, Qwen3MoeConfig
from toolkit import LLM, SamplingParams
cfg = (LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                   num_key_value_heads=4, vocab_size=8000, max_position_embeddings=2048)
       if sys.argv[1] == "dense" else
       Qwen3MoeConfig(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=8,
                      num_experts_per_tok=2, vocab_size=8000, max_position_embeddings=2048))
llm = LLM(cfg, dtype="bfloat16", max_num_seqs=16, max_num_batched_tokens=1024, max_model_len=1024,
          gpu_memory_utilization=0.3, compile_workers=int(sys.argv[2]))
sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
out = llm.generate([[5, 6, 7, 8], list(range(10, 300)), [3] * 40], sp, use_tqdm=False)
print("RESULT " + json.dumps(dict(startup=llm.engine.startup, tokens=[list(o.outputs[0].token_ids) for o in out])))
"""


def _start(model: str, workers: int, cache: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, model, str(workers)], capture_output=True, text=True,
                          check=False, env={**os.environ, "TRITON_CACHE_DIR": cache}, timeout=300)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_parallel_compile_gives_the_same_tokens_and_leaves_little_to_compile(model, tmp_path):
    in_turn = _start(model, 0, str(tmp_path / "a"))
    parallel = _start(model, 4, str(tmp_path / "b"))
    assert parallel["tokens"] == in_turn["tokens"]
    s0, s1 = in_turn["startup"], parallel["startup"]
    assert "precompiled" not in s0 and s1["precompiled"] > 0
    # what the workers compiled, the warm-up loads from the cache: its own compiling is a
    # fraction of the in-turn engine's (captures' own kernels still compile in turn)
    assert s1["compile_s"] < 0.5 * s0["compile_s"], (s0, s1)

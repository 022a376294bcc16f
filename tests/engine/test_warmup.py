"""The warm-up's dummy steps (run inside LLM(...) on CUDA) leave no trace: the same greedy
outputs after it, every block free, no penalty row. On the CPU it is called directly (no graphs: two sizes), with and without the parallel
compile's collecting pass (which finds no Triton launch there; on a GPU:
tests/engine/test_precompile_gpu.py)."""

from __future__ import annotations

import pytest

from toolkit import LLM, SamplingParams
from toolkit.worker.warmup import warm_up


@pytest.mark.parametrize("compile_workers", [0, 2])
def test_warm_up_leaves_outputs_and_blocks_alone(tiny_llama_dir, compile_workers):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9], [10] * 30, [11, 12]]
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=32, block_size=4) as llm:
        before = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=32, block_size=4,
             enable_prefix_caching=False) as llm:
        took = warm_up(llm.engine.runner, max_num_batched_tokens=64, block_size=4, num_blocks=32,
                       show_progress=False, compile_workers=compile_workers)
        # the CPU has no Triton compiles or graphs: all of it ran the dummy steps
        assert took["warmup_s"] > 0 and took["compile_s"] == took["capture_s"] == 0, took
        assert len(llm.engine.runner.penalty_history) == 0     # its penalised dummies left no row
        if compile_workers:        # the collecting pass ran too: nothing to compile on the CPU
            assert (took["precompiled"], took["precompile_cached"], took["precompile_unseen"]) == (0, 0, 0), took
        after = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert llm.engine.allocator.num_free_blocks() == 32
    assert after == before

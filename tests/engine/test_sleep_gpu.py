"""Sleep mode on CUDA: the device memory really goes back to the driver (as this process and
another process see it), host copies are pinned, and the CUDA graphs rebuilt on wake replay
the same greedy tokens as before sleep."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig

from toolkit import LLM, SamplingParams

pytestmark = pytest.mark.gpu

SP = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 200)), [3] * 40, [7, 1] * 9]


def _config() -> LlamaConfig:
    return LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                       num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096,
                       eos_token_id=2, bos_token_id=1, tie_word_embeddings=False)


def _free_elsewhere() -> int:
    """Free device memory as a fresh process sees it (the driver's count, not this allocator's)."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.mem_get_info()[0])"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def _tokens(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, SP, use_tqdm=False)]


@pytest.fixture(scope="module")
def llm():
    # no prefix caching: sleep and update_weights empty the prefix cache, so a generate after
    # them would run whole prefills where the one before hit cached blocks (the last prompt
    # tokens in a GEMM of another M): bf16 results of different computations, and random
    # weights' near-tied logits flip greedy tokens. Without it every generate of the same
    # prompts runs the same steps, and only the restored weights, KV and graphs can differ.
    with LLM(_config(), dtype="bfloat16", enable_sleep_mode=True, gpu_memory_utilization=0.3,
             max_num_seqs=8, enable_prefix_caching=False) as engine:
        yield engine


def test_sleep_returns_the_memory_to_the_driver(llm) -> None:
    _tokens(llm)
    kv = llm.engine.runner.kv_cache
    weights = sum(p.untyped_storage().nbytes() for p in llm.engine.model.parameters())
    expect = kv.nbytes + weights
    torch.cuda.synchronize()
    here, there = torch.cuda.mem_get_info()[0], _free_elsewhere()
    llm.sleep(level=1)
    assert llm.engine.sleep_mode.freed_bytes == expect
    after_here, after_there = torch.cuda.mem_get_info()[0], _free_elsewhere()
    assert after_here - here >= 0.95 * expect, (here, after_here, expect)
    assert after_there - there >= 0.95 * expect, (there, after_there, expect)
    stored = llm.engine.runner.executor.runner.sleeper.asleep["weights"]
    assert all(st.host is not None and st.host.is_pinned() for st in stored)
    llm.wake_up()
    assert torch.cuda.mem_get_info()[0] <= after_here - 0.95 * expect


def test_cuda_graphs_replay_the_same_tokens_after_wake(llm) -> None:
    runner = llm.engine.runner
    assert runner.graphs is not None, "this test needs CUDA graphs"
    before = _tokens(llm)
    old = runner.graphs
    for level in (1, 1):
        llm.sleep(level)
        assert runner.graphs is None and runner.sample_graphs is None
        llm.wake_up()
        assert runner.graphs is not None and runner.graphs is not old
        assert _tokens(llm) == before                 # captured again at the first steps
        g = runner.graphs
        assert g.num_full_replays + g.num_piecewise_replays > 0
        assert _tokens(llm) == before                 # and replayed from the new graphs


def test_level2_update_equals_the_model_it_came_from(llm) -> None:
    before = _tokens(llm)
    weights = [(n, p.detach().clone()) for n, p in _checkpoint(llm)]
    llm.sleep(level=2)
    llm.wake_up(tags=["weights"])
    assert float(sum(p.float().abs().sum() for p in llm.engine.model.parameters())) == 0.0
    llm.update_weights((n, t.cpu()) for n, t in weights)          # from host tensors
    llm.wake_up(tags=["kv_cache"])
    assert _tokens(llm) == before
    llm.update_weights(weights)                                    # from device tensors
    assert _tokens(llm) == before


def _checkpoint(llm: LLM):
    """The model's weights under checkpoint names (q/k/v and gate/up split again)."""
    model = llm.engine.model
    inverse = {merged: [] for merged, _ in model.stacked.values()}
    for ck, (merged, sid) in model.stacked.items():
        inverse[merged].append((ck, sid))
    for name, p in model.named_parameters():
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in inverse:
            layer = next(m for m in model.modules() if getattr(m, "weight", None) is p or getattr(m, "bias", None) is p)
            for ck, sid in inverse[parts[-2]]:
                rows = layer.parts[sid][1]
                yield ".".join(parts[:-2] + [ck, parts[-1]]), p.narrow(0, layer.offsets[sid], rows.size)
        else:
            yield name, p

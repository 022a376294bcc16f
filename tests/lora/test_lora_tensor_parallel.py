"""Multi-LoRA under tensor parallelism: LLM(tensor_parallel_size=2) over gloo processes on the
CPU, a batch mixing base requests and adapters of different ranks and targets (column- and
row-parallel layers, merged qkv / gate_up parts), with more adapters than slots so ranks
reload slots mid-run: greedy tokens equal tensor_parallel_size=1's (fp32, logits far from
ties: the tiny model of conftest.py)."""

from __future__ import annotations

import pytest

from toolkit import LLM, LoRARequest, SamplingParams

PROMPTS = [[5, 17, 99, 3, 250, 41, 7, 8, 9, 11, 12, 13, 400, 401, 402, 403, 404, 405],
           [300, 301, 7, 7, 19], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]]
# max_num_batched_tokens=16: the 18- and 19-token prompts prefill in two chunks
OPTS = {"enable_lora": True, "max_loras": 2, "max_lora_rank": 16, "max_cpu_loras": 2, "num_blocks": 64,
        "block_size": 4, "max_num_seqs": 3, "max_num_batched_tokens": 16}


def _run(llm: LLM, adapters, names: list[str | None]) -> list[list[int]]:
    reqs = [None if n is None else LoRARequest(n, adapters[n][0], str(adapters[n][1])) for n in names]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(names))]
    sp = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sp, lora_request=reqs, use_tqdm=False)]


def test_tp2_mixed_adapters_equal_tp1(lora_base, adapters):
    _, folder = lora_base
    # three adapters on two slots (an eviction and a reload on every rank), base requests between
    names = [None, "qv8", "all4", "mlp16", None, "all4", "qv8"]
    with LLM(str(folder), **OPTS) as tp1:
        want = _run(tp1, adapters, names)
        base = _run(tp1, adapters, [None] * len(names))
    assert all(w != b for w, b, n in zip(want, base, names) if n is not None)   # the adapters act
    with LLM(str(folder), tensor_parallel_size=2, **OPTS) as tp2:
        assert _run(tp2, adapters, names) == want
        loads = tp2.engine.runner.lora.num_loads
        assert loads > 2                                  # slots were refilled mid-run
        # every rank mirrors rank 0's slots and loaded as often (each from its own folder read)
        ranks = tp2.engine.runner.executor.call(_lora_slots)
        assert ranks[0] == ranks[1] and ranks[0][1] == loads
        pool = tp2.engine.scheduler.lora_pool
        assert pool.num_free_slots() == pool.num_slots


def _lora_slots(runner) -> tuple:
    """On each rank (executor.call): what its slots hold and how many loads it made."""
    from toolkit.lora.layer import LoRALinearMethod

    state = next(m.method.state for m in runner.model.modules()
                 if isinstance(getattr(m, "method", None), LoRALinearMethod))
    return list(state.slot_holds), state.num_loads


@pytest.mark.gpu
def test_tp2_nccl_cuda_graphs_with_adapters_equal_tp1(lora_base, adapters):
    """On 2 GPUs: NCCL, CUDA graphs whose inputs include each rank's slot-index buffer, fp32
    greedy with base and adapter requests equal to TP=1."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    _, folder = lora_base
    names = [None, "qv8", "all4", "mlp16", None, "all4", "qv8"]
    opts = {**OPTS, "dtype": "float32", "device": "cuda", "cuda_graphs": True, "max_num_batched_tokens": 64}
    with LLM(str(folder), **opts) as tp1:
        want = _run(tp1, adapters, names)
    with LLM(str(folder), tensor_parallel_size=2, **opts) as tp2:
        assert tp2.engine.runner.graphs is not None
        assert _run(tp2, adapters, names) == want
        assert tp2.engine.runner.graphs.graphs                 # steps replayed graphs

"""Multi-LoRA where requests enter other ways or adapters go missing: requests admitted through
a KV connector (a PD consumer) take their adapter's slot like any other (max_loras=1, two
adapters: greedy equal to the co-located engine); an adapter whose folder moved after
add_request, once dropped from the host cache, fails its own requests alone (RequestFault),
and the base model's and other adapters' requests finish with their tokens; a pooling request
with an adapter is refused (pooling runs the base model)."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from toolkit import LLM, LoRARequest, SamplingParams
from toolkit.kv_transfer.kv_store import MemoryKVStore
from toolkit.kv_transfer.pd import PDConnector, handoff_request
from toolkit.types import RequestFault

BS = 4
PROMPTS = [list(range(10, 27)), list(range(100, 113))]
SP = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)


def _reqs(adapters) -> list[LoRARequest]:
    return [LoRARequest(n, adapters[n][0], str(adapters[n][1])) for n in ("qv8", "all4")]


def test_pd_consumer_requests_take_their_adapter_slot(lora_base, adapters):
    _, folder = lora_base
    kw = dict(enable_lora=True, max_loras=1, max_lora_rank=16, block_size=BS, num_blocks=64)
    loras = _reqs(adapters)
    with LLM(str(folder), **kw) as ref:
        want = [o.outputs[0].token_ids for o in ref.generate(PROMPTS, SP, lora_request=loras, use_tqdm=False)]
    store = MemoryKVStore((2, 2, BS, 2, 16), torch.float32, 256)
    with LLM(str(folder), kv_connector=PDConnector(store, BS, "kv_producer"), **kw) as prod, \
            LLM(str(folder), kv_connector=PDConnector(store, BS, "kv_consumer", load_async=False), **kw) as cons:
        first = {}
        for i, (p, lora) in enumerate(zip(PROMPTS, loras)):
            prod.engine.add_request(p, dataclasses.replace(SP, max_tokens=1), request_id=f"r{i}",
                                    output_kind="final", lora_request=lora)
        while prod.engine.has_unfinished():
            first.update({o.request_id: list(o.outputs[0].token_ids) for o in prod.engine.step()})
        e = cons.engine
        for i, (p, lora) in enumerate(zip(PROMPTS, loras)):
            cont, params = handoff_request(p, SP, first[f"r{i}"][0])
            e.add_request(cont, params, request_id=f"r{i}", output_kind="final", lora_request=lora)
        got = {}
        while e.has_unfinished():
            got.update({o.request_id: first[o.request_id] + list(o.outputs[0].token_ids) for o in e.step()})
        assert e.scheduler.connector.num_loaded_blocks > 0          # the prompts came through the store
        assert not e.scheduler._lora_held and e.scheduler.lora_pool.num_free_slots() == 1
    assert [got[f"r{i}"][:5] for i in range(2)] == want


def test_an_adapter_folder_gone_before_its_load_fails_only_its_requests(lora_base, adapters, tmp_path):
    _, folder = lora_base
    moved = tmp_path / "qv8"
    shutil.copytree(adapters["qv8"][1], moved)
    gone = LoRARequest("qv8", adapters["qv8"][0], str(moved))
    other = _reqs(adapters)[1]
    with LLM(str(folder), enable_lora=True, max_loras=1, max_cpu_loras=1, max_lora_rank=16, block_size=BS,
             num_blocks=64) as llm:
        want = {"base": llm.generate([PROMPTS[0]], SP, use_tqdm=False)[0].outputs[0].token_ids,
                "other": llm.generate([PROMPTS[1]], SP, lora_request=other, use_tqdm=False)[0].outputs[0].token_ids}
        e = llm.engine
        e.add_request(PROMPTS[0], SP, request_id="base", output_kind="final")
        e.add_request(PROMPTS[0], SP, request_id="gone", output_kind="final", lora_request=gone)
        e.add_request(PROMPTS[1], SP, request_id="other", output_kind="final", lora_request=other)
        shutil.rmtree(moved)        # checked at add_request; the host cache (1 adapter) now holds the other
        got, faults = {}, []
        while e.has_unfinished():   # what the server's engine loop does with a RequestFault
            try:
                got.update({o.request_id: o.outputs[0].token_ids for o in e.step()})
            except RequestFault as f:
                faults.append((f.request_ids, str(f)))
                e.abort(f.request_ids)
        assert [ids for ids, _ in faults] == [["gone"]] and "'qv8' could not be loaded again" in faults[0][1]
        assert got == want
        s = e.scheduler
        assert not s._lora_held and s.lora_pool.num_free_slots() == 1
        assert e.allocator.num_free_blocks() == e.allocator.num_blocks


def test_a_pooling_request_with_an_adapter_is_refused(lora_base, adapters):
    from toolkit import PoolingParams

    _, folder = lora_base
    with LLM(str(folder), enable_lora=True, max_loras=1, max_lora_rank=16, block_size=BS, num_blocks=16) as llm:
        with pytest.raises(ValueError, match="pooling requests .* run the base model"):
            llm.engine.add_request(PROMPTS[0], PoolingParams(task="embed"), lora_request=_reqs(adapters)[0])
        assert not llm.engine.has_unfinished()


def test_an_unreadable_or_malformed_folder_is_a_value_error_naming_it(tmp_path):
    """Corrupt weights, a missing folder, bad JSON, a non-numeric lora_alpha: ValueError
    saying what is wrong with which folder (not safetensors' or json's own error)."""
    import json

    from toolkit.lora.peft import read_adapter

    def folder(name, config, weights=b"garbage"):
        f = tmp_path / name
        f.mkdir()
        (f / "adapter_config.json").write_text(config)
        (f / "adapter_model.safetensors").write_bytes(weights)
        return f

    ok_config = json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]})
    cases = [(folder("corrupt", ok_config), "cannot read the LoRA adapter's weights"),
             (tmp_path / "missing", "does not exist"),
             (folder("badjson", "{r: 4"), "not valid JSON"),
             (folder("alpha", json.dumps({"r": 4, "lora_alpha": "sixteen"})), "lora_alpha must be a number")]
    from safetensors.torch import save_file

    weights = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(8, 16),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(16, 8)}
    save_file(weights, str(tmp_path / "w.safetensors"))
    cases.append((folder("rank", ok_config, (tmp_path / "w.safetensors").read_bytes()),
                  "has rank 8 but adapter_config.json says r=4"))
    for path, message in cases:
        with pytest.raises(ValueError, match=message) as e:
            read_adapter(path, 1, "x", max_rank=16)
        assert str(path) in str(e.value)

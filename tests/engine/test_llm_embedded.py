"""The engine on the embedded SmolLM2-135M-Instruct: chat greedy equals HF generate on the
same weights; stop strings are found in the incremental text and removed from it."""

from __future__ import annotations

import pytest
import torch

from toolkit import LLM, SamplingParams

QUESTIONS = ["What is the capital of France?", "Name two prime numbers."]
MAX_NEW = 16


@pytest.fixture(scope="module")
def llm():
    with LLM(dtype="float32", device="cpu", max_num_seqs=4) as engine:
        yield engine


@pytest.fixture(scope="module")
def chat_ids(llm):
    from toolkit.models import apply_chat_template

    tok = llm.tokenizer
    return [tok.encode(apply_chat_template(tok, [{"role": "user", "content": q}]), add_special_tokens=False)
            for q in QUESTIONS]


@pytest.mark.slow          # the embedded model and HF's generate: 33 s on a cold 2-core runner
def test_chat_greedy_equals_hf(llm, chat_ids):
    from transformers import AutoModelForCausalLM
    from toolkit.models import default_model_path

    hf = AutoModelForCausalLM.from_pretrained(default_model_path(), dtype=torch.float32).eval()
    outs = llm.chat([[{"role": "user", "content": q}] for q in QUESTIONS],
                    SamplingParams(temperature=0, max_tokens=MAX_NEW), use_tqdm=False)
    for ids, out in zip(chat_ids, outs):
        x = torch.tensor([ids])
        ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW, do_sample=False)
        ref_ids = ref[0, len(ids):].tolist()
        eos = llm.engine.eos_token_id
        if eos in ref_ids:                       # HF keeps the EOS; so do we (finish reason "stop")
            ref_ids = ref_ids[: ref_ids.index(eos) + 1]
        assert out.outputs[0].token_ids == ref_ids
        assert out.text == llm.tokenizer.decode(ref_ids, skip_special_tokens=True)


def test_stop_string_is_removed_and_finishes(llm):
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW)
    full = llm.chat([{"role": "user", "content": QUESTIONS[0]}], params, use_tqdm=False)[0].text
    words = full.split()
    assert len(words) >= 3, full
    stop = words[2]
    i = full.index(stop)
    free = llm.engine.scheduler.allocator.num_free_blocks()
    out = llm.chat([{"role": "user", "content": QUESTIONS[0]}],
                   SamplingParams(temperature=0, max_tokens=MAX_NEW, stop=[stop]), use_tqdm=False)[0]
    assert out.text == full[:i]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert llm.engine.scheduler.allocator.num_free_blocks() == free   # blocks freed at once
    assert not llm.engine.has_unfinished()


def test_n_samples_and_seed_reproducible(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8, n=3, seed=123)
    a = llm.generate(["Once upon a time"], params, use_tqdm=False)[0]
    b = llm.generate(["Once upon a time", "Another prompt in the batch"], [params, SamplingParams(max_tokens=4)],
                     use_tqdm=False)[0]
    assert len(a.outputs) == 3
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1, "the n samples should differ"

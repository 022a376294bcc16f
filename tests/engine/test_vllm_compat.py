"""A vLLM user's code runs unchanged: guided_decoding / structured_outputs, bad words as text,
best_of, BeamSearchParams, dict prompts, RequestOutput.prompt for chat, unique request ids."""

from __future__ import annotations

import dataclasses

import pytest

from toolkit import LLM, BeamSearchParams, SamplingParams
from toolkit.samplers.grammar import Structured


@pytest.fixture(scope="module")
def tok():
    from toolkit.models import default_model_path, load_tokenizer

    return load_tokenizer(default_model_path())      # ids < 517 decode to ordinary text


@pytest.fixture(scope="module")
def llm(tok):
    """A one-layer random Llama with SmolLM2's vocabulary, so text and chat prompts work."""
    import torch
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=256,
                      eos_token_id=tok.eos_token_id, bos_token_id=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    with LLM(cfg, tokenizer=tok, dtype="float32", device="cpu", num_blocks=64, block_size=4,
             max_model_len=256) as llm:
        yield llm


@dataclasses.dataclass
class GuidedDecodingParams:              # vLLM's class, as a user's import would give it
    json: object = None
    regex: str | None = None
    choice: list | None = None
    grammar: str | None = None
    json_object: bool | None = None
    whitespace_pattern: str | None = None


def test_guided_decoding_and_structured_outputs_read_as_structured():
    for kw in ({"guided_decoding": GuidedDecodingParams(choice=["yes", "no"])},
               {"structured_outputs": {"choice": ["yes", "no"]}},
               {"structured": {"choice": ["yes", "no"]}}):
        sp = SamplingParams(**kw)
        assert sp.structured == Structured.choice(["yes", "no"]), kw
        assert sp.guided_decoding is None and sp.structured_outputs is None
    assert SamplingParams(guided_decoding={"regex": "[0-9]+"}).structured == Structured.regex("[0-9]+")
    assert SamplingParams(guided_decoding={"json": {"type": "integer"}}).structured.kind == "json"
    assert SamplingParams(guided_decoding={"json_object": True}).structured.kind == "json_object"
    with pytest.raises(ValueError, match="grammar"):
        SamplingParams(guided_decoding=GuidedDecodingParams(grammar="root ::= 'a'"))
    with pytest.raises(ValueError, match="exactly one"):
        SamplingParams(guided_decoding={"regex": "a", "choice": ["b"]})
    with pytest.raises(ValueError, match="one of structured, guided_decoding"):
        SamplingParams(structured={"regex": "a"}, guided_decoding={"regex": "b"})
    with pytest.raises(ValueError, match="unknown key"):
        SamplingParams(guided_decoding={"regx": "a"})
    # a copy (the engine's per-sample params) keeps the spec
    sp = SamplingParams(guided_decoding={"regex": "[ab]+"})
    assert dataclasses.replace(sp, n=1).structured == sp.structured


def test_guided_choice_through_the_engine(llm):
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=8, guided_decoding={"choice": ["yes", "no"]}),
                       use_tqdm=False)[0]
    assert out.text in ("yes", "no")


def test_bad_words_as_text_are_never_generated(llm, tok):
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    free = llm.generate([[5, 6, 7]], greedy, use_tqdm=False)[0]
    word = tok.decode(free.token_ids[:1])                 # the first greedy token, as text
    banned = llm.generate([[5, 6, 7]], dataclasses.replace(greedy, bad_words=[word]),
                          use_tqdm=False)[0]
    assert free.token_ids[0] not in banned.token_ids[:1]
    assert banned.token_ids[0] != free.token_ids[0]
    from toolkit.engine.vllm_compat import tokenize_bad_words

    words = tokenize_bad_words(tok, ["cat", [7, 8]])
    assert words[0] == tok.encode("cat", add_special_tokens=False) and [7, 8] in words
    assert tok.encode(" cat", add_special_tokens=False) in words      # vLLM's leading-space form
    with pytest.raises(ValueError, match="bad_words"):
        SamplingParams(bad_words=[""])


def test_best_of_returns_the_n_most_likely_of_best_of(llm):
    sp = SamplingParams(n=2, best_of=5, max_tokens=4, seed=3, ignore_eos=True)
    out = llm.generate([[5, 6, 7]], sp, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1]
    assert all(c.logprobs is None for c in out.outputs), "logprobs were not asked for"
    every = llm.generate([[5, 6, 7]], dataclasses.replace(sp, n=5, best_of=None, logprobs=0),
                         use_tqdm=False)[0]
    best = sorted(c.cumulative_logprob for c in every.outputs)[-2:]
    assert sorted(c.cumulative_logprob for c in out.outputs) == pytest.approx(best)
    assert not llm.engine.has_unfinished() and not llm.engine.best_of._wanted
    with pytest.raises(ValueError, match="best_of"):
        SamplingParams(n=3, best_of=2)


def test_beam_search_params_and_dict_prompts(llm):
    p = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    a = llm.beam_search([{"prompt_token_ids": [5, 6, 7]}], p)
    b = llm.beam_search([[5, 6, 7]], 2, 3, ignore_eos=True)
    c = llm.beam_search([[5, 6, 7]], beam_width=2, max_tokens=3, ignore_eos=True)
    assert [s.tokens for s in a[0].sequences] == [s.tokens for s in b[0].sequences] == \
        [s.tokens for s in c[0].sequences]
    with pytest.raises(TypeError, match="beam_width"):
        llm.beam_search([[5]], max_tokens=3)
    assert a[0].sequences[0].text == a[0].texts[0]
    with pytest.raises(ValueError, match="temperature"):
        BeamSearchParams(beam_width=2, max_tokens=3, temperature=0.5)
    with pytest.raises(TypeError, match="beam_width"):
        BeamSearchParams(beam_width=2.0, max_tokens=3)
    outs = llm.generate([{"prompt": "hello"}, {"prompt_token_ids": [5, 6]}],
                        SamplingParams(max_tokens=2), use_tqdm=False)
    assert outs[0].prompt == "hello" and outs[1].prompt_token_ids == [5, 6]
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate([{"multi_modal_data": 1}], use_tqdm=False)


def test_chat_fills_the_prompt_and_ids_are_unique_across_calls(llm):
    conv = [{"role": "user", "content": "hi"}]
    out = llm.chat(conv, SamplingParams(max_tokens=2), use_tqdm=False)[0]
    assert out.prompt and "hi" in out.prompt
    ids = [o.request_id for _ in range(3) for o in llm.generate([[5], [6]], SamplingParams(max_tokens=1),
                                                                  use_tqdm=False)]
    assert len(set(ids)) == len(ids)
    e = llm.engine
    nxt = str(int(max(ids, key=int)) + 1)
    e.add_request([5], SamplingParams(max_tokens=1), request_id=nxt)   # the next automatic id, taken
    auto = e.add_request([5], SamplingParams(max_tokens=1))
    assert auto != nxt
    while e.has_unfinished():
        e.step()

"""Token -> bytes for byte-level BPE (three real tokenizers) and sentencepiece (a built one)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from toolkit.samplers.grammar import VocabularyCache, build_vocabulary
from toolkit.samplers.grammar.vocabulary import gpt2_byte_decoder


def test_gpt2_byte_decoder_is_a_bijection() -> None:
    dec = gpt2_byte_decoder()
    assert len(dec) == 256 and sorted(dec.values()) == list(range(256))
    assert dec["Ġ"] == ord(" ") and dec["Ċ"] == ord("\n") and dec["a"] == ord("a")


@pytest.mark.parametrize("family", ["smollm2", "qwen3", "gpt2"])
def test_real_tokenizers_map_tokens_to_their_decoded_bytes(zoo, family: str) -> None:
    tok = zoo.tokenizer(family)
    vocab = zoo.compiler(family).vocab
    assert vocab.encoding == "byte_level"
    assert vocab.eos_token_ids == (tok.eos_token_id,)
    for i in tok.all_special_ids:
        assert vocab.token_bytes[i] is None, f"special token {i} must be excluded"
    text = 'Hello, wörld! {"key": [1, 2.5e-3, null]}\n\t日本語 ✓'
    ids = tok.encode(text, add_special_tokens=False)
    assert vocab.decode_bytes(ids) == text.encode("utf-8")
    # every single token: its bytes are what the tokenizer decodes (when that is valid UTF-8)
    for i in range(0, len(tok), 97):
        b = vocab.token_bytes[i]
        if b is None:
            continue
        try:
            s = b.decode("utf-8")
        except UnicodeDecodeError:
            continue                               # a partial character: only whole texts decode
        assert tok.decode([i], clean_up_tokenization_spaces=False) == s, i


def test_qwen3_non_special_added_tokens_are_literal(zoo) -> None:
    tok = zoo.tokenizer("qwen3")
    vocab = zoo.compiler("qwen3").vocab
    think = tok.convert_tokens_to_ids("<think>")
    assert vocab.token_bytes[think] == b"<think>"


def _sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "<0xC3>": 4, "<0xA9>": 5,
             "▁": 6, "a": 7, "b": 8, "▁a": 9, "▁ab": 10, "{": 11, "}": 12}
    bpe = models.BPE(vocab=vocab, merges=[("▁", "a"), ("▁a", "b")], unk_token="<unk>", byte_fallback=True)
    t = Tokenizer(bpe)
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def test_sentencepiece_metaspace_and_byte_fallback() -> None:
    tok = _sentencepiece_tokenizer()
    vocab = build_vocabulary(tok)
    assert vocab.encoding == "sentencepiece"
    assert vocab.token_bytes[3] == b"\n" and vocab.token_bytes[4] == b"\xc3"
    assert vocab.token_bytes[10] == b" ab" and vocab.token_bytes[6] == b" "
    assert vocab.token_bytes[0] is None and vocab.token_bytes[2] is None   # unk, eos
    assert vocab.decode_bytes([9, 4, 5, 3]) == " aé\n".encode()


def test_vocab_size_and_extra_eos() -> None:
    tok = _sentencepiece_tokenizer()
    vocab = build_vocabulary(tok, vocab_size=40, eos_token_ids=[2, 12])
    assert vocab.bitmask_width == 2 and len(vocab.token_bytes) == 40
    assert vocab.eos_token_ids == (2, 12) and vocab.token_bytes[12] is None
    small = build_vocabulary(tok, vocab_size=11)
    assert len(small.token_bytes) == 11 and small.fingerprint != vocab.fingerprint
    with pytest.raises(ValueError, match="eos_token_ids"):
        build_vocabulary(tok, vocab_size=2)


def test_vocabulary_cache_reuses_per_tokenizer() -> None:
    cache = VocabularyCache()
    tok = _sentencepiece_tokenizer()
    a = cache.get(tok)
    assert cache.get(tok) is a and len(cache) == 1
    assert cache.get(tok, vocab_size=64) is not a
    other = _sentencepiece_tokenizer()
    b = cache.get(other)
    assert b is not a and b.fingerprint == a.fingerprint

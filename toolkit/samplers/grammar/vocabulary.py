"""The outlines-core `Vocabulary` of a transformers tokenizer: token id -> the bytes it decodes to.

A grammar constrains *bytes*, so every token must be mapped back to the bytes it adds to
the text:
- byte-level BPE (GPT-2, Qwen, SmolLM2, Llama 3): each char of a token stands for one byte
  through GPT-2's printable byte alphabet ("Ġ" = b" ");
- sentencepiece (Llama 2, Mistral): "▁" is a space and "<0xNN>" is the raw byte NN;
- added tokens that are not special ("<think>" in Qwen3) decode to their literal text.
Special tokens are left out (a grammar never produces them); the EOS ids are left out of
the map too: outlines-core allows its EOS in final states only, and `TokenizerVocabulary`
carries the extra EOS ids a model stops on (Qwen's <|im_end|> and <|endoftext|>).
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import outlines_core

_SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")   # immutable pattern, no state


def gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's `bytes_to_unicode` inverted: printable char -> the byte it stands for (256 entries)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def detect_token_encoding(tokenizer: Any) -> str:
    """'byte_level', 'sentencepiece' or 'plain': how the tokenizer spells bytes in its vocabulary.

    Read from the fast tokenizer's decoder (ByteLevel / ByteFallback / Metaspace), else guessed
    from the vocabulary ("Ġ" tokens = byte-level, "▁" tokens = sentencepiece).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.decoder is not None:
        decoder = repr(backend.decoder)      # e.g. "Sequence(decoders=[Replace(...), ByteFallback()])"
        if "ByteLevel" in decoder:
            return "byte_level"
        if "ByteFallback" in decoder or "Metaspace" in decoder or "\u2581" in decoder:
            return "sentencepiece"
    if getattr(tokenizer, "byte_decoder", None) is not None:
        return "byte_level"
    vocab = tokenizer.get_vocab()
    if any(t.startswith("Ġ") for t in vocab):
        return "byte_level"
    if any(t.startswith("\u2581") for t in vocab):
        return "sentencepiece"
    return "plain"


def token_to_bytes(token: str, encoding: str, byte_decoder: dict[str, int]) -> bytes:
    """The bytes one vocabulary entry adds to the decoded text."""
    if encoding == "byte_level":
        try:
            return bytes(byte_decoder[c] for c in token)
        except KeyError:        # a token outside the byte alphabet: its literal text
            return token.encode("utf-8")
    if encoding == "sentencepiece":
        m = _SP_BYTE.fullmatch(token)
        if m:
            return bytes([int(m.group(1), 16)])
        return token.replace("\u2581", " ").encode("utf-8")
    return token.encode("utf-8")


@dataclass(frozen=True)
class TokenizerVocabulary:
    """What a grammar needs of a tokenizer.

    token_bytes[i] = the bytes of token i, or None when excluded (special, EOS, beyond
    vocab_size). `vocab_size` is the model's logits width V (>= len(tokenizer) when the
    embedding is padded); bitmask rows have ceil(V / 32) int32 words.
    """

    vocabulary: outlines_core.Vocabulary = field(repr=False)
    token_bytes: tuple[bytes | None, ...] = field(repr=False)
    eos_token_ids: tuple[int, ...]          # [0] is outlines-core's EOS; all stop in final states
    vocab_size: int
    encoding: str
    fingerprint: str                        # sha1 of the mapping: the tokenizer's cache identity

    @property
    def bitmask_width(self) -> int:
        return (self.vocab_size + 31) // 32

    def decode_bytes(self, token_ids: Sequence[int]) -> bytes:
        """The bytes the grammar saw for these tokens (EOS and excluded tokens add nothing)."""
        return b"".join(self.token_bytes[t] or b"" for t in token_ids)


def build_vocabulary(tokenizer: Any, vocab_size: int | None = None,
                     eos_token_ids: Sequence[int] | None = None) -> TokenizerVocabulary:
    """Map every token of `tokenizer` to its bytes and build outlines-core's Vocabulary.

    vocab_size: the model's logits width (default len(tokenizer)); ids >= vocab_size are left
    out. eos_token_ids: the ids that end a sequence (default [tokenizer.eos_token_id]).
    """
    if eos_token_ids is None:
        eos = getattr(tokenizer, "eos_token_id", None)
        eos_token_ids = [] if eos is None else [eos]
    eos_ids = tuple(dict.fromkeys(int(e) for e in eos_token_ids))
    if not eos_ids:
        raise ValueError("the tokenizer has no eos_token_id; pass eos_token_ids=[...] "
                         "(a grammar ends only on an EOS token)")
    size = len(tokenizer) if vocab_size is None else int(vocab_size)
    if size <= max(eos_ids):
        raise ValueError(f"eos_token_ids {list(eos_ids)} must be < vocab_size={size}")

    encoding = detect_token_encoding(tokenizer)
    byte_decoder = gpt2_byte_decoder()
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= {i for i, tok in added.items() if getattr(tok, "special", False)}
    special |= set(eos_ids)

    table: list[bytes | None] = [None] * size
    mapping: dict[bytes, list[int]] = {}
    for token, i in tokenizer.get_vocab().items():
        if i >= size or i in special:
            continue
        if i in added:           # a non-special added token: its literal text
            b = str(getattr(added[i], "content", token)).encode("utf-8")
        else:
            b = token_to_bytes(token, encoding, byte_decoder)
        if not b:                # an empty token would let the grammar loop without progress
            continue
        table[i] = b
        mapping.setdefault(b, []).append(i)
    if not mapping:
        raise ValueError("the tokenizer has no non-special tokens to build a grammar vocabulary from")

    h = hashlib.sha1(f"{encoding}|{size}|{eos_ids}".encode())
    for i, b in enumerate(table):
        if b is not None:
            h.update(i.to_bytes(4, "little") + len(b).to_bytes(2, "little") + b)
    return TokenizerVocabulary(
        vocabulary=outlines_core.Vocabulary(eos_ids[0], mapping), token_bytes=tuple(table),
        eos_token_ids=eos_ids, vocab_size=size, encoding=encoding, fingerprint=h.hexdigest())


class VocabularyCache:
    """One `TokenizerVocabulary` per (tokenizer object, vocab_size, eos ids); the tokenizer is
    held weakly so a dropped tokenizer frees its vocabulary."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, int | None, tuple[int, ...] | None],
                            tuple[weakref.ref, TokenizerVocabulary]] = {}

    def get(self, tokenizer: Any, vocab_size: int | None = None,
            eos_token_ids: Sequence[int] | None = None) -> TokenizerVocabulary:
        eos = None if eos_token_ids is None else tuple(eos_token_ids)
        key = (id(tokenizer), vocab_size, eos)
        hit = self._entries.get(key)
        if hit is not None and hit[0]() is tokenizer:
            return hit[1]
        vocab = build_vocabulary(tokenizer, vocab_size, eos_token_ids)
        self._entries = {k: v for k, v in self._entries.items() if v[0]() is not None}
        self._entries[key] = (weakref.ref(tokenizer), vocab)
        return vocab

    def __len__(self) -> int:
        return sum(1 for r, _ in self._entries.values() if r() is not None)

"""Grammar-constrained sampling over outlines-core: regex, JSON schema, choice, any JSON object.

    compiler = GrammarCompiler(tokenizer, vocab_size=V)          # one per engine (tokenizer)
    future = compiler.compile_async(Structured.json(schema))     # at add_request
    grammar = future.result().new_grammar()                      # once future.done()
    fill_batch_bitmask(bitmask, [grammar, None, ...])            # each step, on the CPU
    slots = table.rows([grammar, None, ...])                     # or: rows kept on the device
    grammar.accept([token])                                      # after sampling

See base.py for the `Grammar` contract, batch.py for the step's row layout and mask_cache.py
for the device table of state rows (`MaskTable`, what the engine uses).
"""

from toolkit.samplers.grammar.base import Grammar
from toolkit.samplers.grammar.batch import (
    allocate_token_bitmask,
    fill_batch_bitmask,
    fill_grammar_rows,
)
from toolkit.samplers.grammar.compiled import CompiledGrammar
from toolkit.samplers.grammar.compiler import GrammarCache, GrammarCompiler
from toolkit.samplers.grammar.mask_cache import MaskTable
from toolkit.samplers.grammar.outlines_backend import OutlinesGrammar
from toolkit.samplers.grammar.spec import Structured
from toolkit.samplers.grammar.vocabulary import (
    TokenizerVocabulary,
    VocabularyCache,
    build_vocabulary,
)

__all__ = [
    "CompiledGrammar",
    "Grammar",
    "GrammarCache",
    "GrammarCompiler",
    "MaskTable",
    "OutlinesGrammar",
    "Structured",
    "TokenizerVocabulary",
    "VocabularyCache",
    "allocate_token_bitmask",
    "build_vocabulary",
    "fill_batch_bitmask",
    "fill_grammar_rows",
]

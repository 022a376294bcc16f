"""Issue 54 item 10: the generate bar moves during a long first prefill (prompt chunks count)
and shows vLLM's "est. speed input: ... toks/s, output: ... toks/s" after it."""

from __future__ import annotations

import re

import torch
from transformers import LlamaConfig

from toolkit import LLM, SamplingParams

PARAMS = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0)


def test_bar_moves_in_the_first_prefill_and_shows_input_and_output_speed(monkeypatch):
    from toolkit import progress

    seen: list[tuple[int, str]] = []               # (ticks so far, the text after the bar)
    ticks = [0]

    class Bar:
        def update(self, n=1):
            ticks[0] += n

        def set_info(self, text):
            seen.append((ticks[0], text))

    class Cm:
        def __enter__(self):
            return Bar()

        def __exit__(self, *a):
            return None

    monkeypatch.setattr(progress, "progress_bar", lambda **k: Cm())
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=300, max_position_embeddings=256, eos_token_id=2)
    torch.manual_seed(0)
    with LLM(cfg, dtype="float32", device="cpu", num_blocks=32, block_size=4, max_num_batched_tokens=16,
             max_num_seqs=2, enable_prefix_caching=False) as llm:
        llm.generate([[7] * 40], PARAMS)                          # a prompt of three 16-token chunks
    speeds = [tuple(float(x.replace(",", "")) for x in
                    re.fullmatch(r"est\. speed input: ([\d,]+) toks/s, output: ([\d,]+) toks/s; "
                                 r"running \d+, waiting \d+", text).groups()) for _, text in seen]
    # the first chunk's step: the bar moved by 16 prompt tokens, input speed > 0, no output yet
    assert seen[0][0] == 16 and speeds[0][0] > 0 and speeds[0][1] == 0
    assert speeds[-1][1] > 0                                       # decodes counted as output
    assert seen[-1][0] >= 40                                       # (finished() tops the last token up)


def test_the_speed_text_counts_prompt_and_sampled_tokens():
    from toolkit.engine.observe import StepRecord
    from toolkit.progress import TokenProgress

    class Engine:
        class output_processor:
            sequence_ids = staticmethod(lambda rid: [rid])
            num_prompt_tokens = staticmethod(lambda rid: 100)

    now = [0.0]
    tp = TokenProgress(Engine(), {"a": 0}, [PARAMS], enabled=False, clock=lambda: now[0])
    got = []
    tp.bar = type("B", (), {"update": lambda self, n: None, "set_info": lambda self, t: got.append(t)})()
    now[0] = 2.0
    tp._on_step(StepRecord(step=0, start_time=0, duration=1, grants={"a": 100}, num_prefill_tokens=100))
    now[0] = 4.0
    tp._on_step(StepRecord(step=1, start_time=0, duration=1, grants={"a": 5}, num_decode_tokens=5,
                           num_draft_tokens=4, num_accepted_tokens=2))   # 1 + 2 accepted drafts sampled
    assert got == ["est. speed input: 50 toks/s, output: 0 toks/s; running 0, waiting 0",
                   "est. speed input: 25 toks/s, output: 1 toks/s; running 0, waiting 0"]

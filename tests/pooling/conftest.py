"""Fixtures of the pooling tests: tiny random decoder and BERT checkpoints saved once per module."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent.parent / "models"))   # model_configs (tiny configs)


def tiny_bert_config(**kw):
    import transformers as tf

    return tf.BertConfig(vocab_size=211, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=80, max_position_embeddings=64, type_vocab_size=2, **kw)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """name -> (HF model, folder): "qwen3" (a decoder), "bert", "bert_cls" (one label)."""
    made = {}

    def get(name: str):
        if name not in made:
            from model_configs import build_hf, randomize

            if name == "qwen3":
                hf = build_hf("qwen3")
            else:
                import transformers as tf

                torch.manual_seed(0)
                if name == "bert":
                    hf = tf.BertModel(tiny_bert_config(), add_pooling_layer=False)
                else:
                    hf = tf.BertForSequenceClassification(tiny_bert_config(num_labels=1))
                hf = hf.eval()
                randomize(hf)
            folder = tmp_path_factory.mktemp(name)
            hf.save_pretrained(folder)
            made[name] = (hf, folder)
        return made[name]

    return get

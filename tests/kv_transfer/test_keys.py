"""Store keys: the prefix hashes are the same in another process (another hash seed), and
the namespace changes with the model's files and with every part of the KV layout."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from toolkit.blocks.hashing import hash_blocks
from toolkit.kv_transfer.keys import block_key, model_identity, namespace

TOKENS = [5, 17, 300, 2, 9, 9, 41, 7, 1000, 3]
LAYOUT = dict(num_layers=2, block_size=4, num_kv_heads=2, head_dim=16, dtype=torch.float32)


def test_block_keys_are_stable_across_processes():
    here = [block_key(h) for h in hash_blocks(TOKENS, 4)]
    code = ("from toolkit.blocks.hashing import hash_blocks; from toolkit.kv_transfer.keys import block_key; "
            f"print(' '.join(block_key(h) for h in hash_blocks({TOKENS}, 4)))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    there = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           check=True, cwd=os.getcwd()).stdout.split()
    assert there == here and len(here) == 2


def test_namespace_names_the_model_files_and_the_layout(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    ident = model_identity(tmp_path)
    base = namespace(ident, **LAYOUT)
    assert namespace(model_identity(tmp_path), **LAYOUT) == base           # the same folder, unchanged
    for change in (dict(num_layers=3), dict(block_size=8), dict(num_kv_heads=1), dict(head_dim=8),
                   dict(dtype=torch.bfloat16)):
        assert namespace(ident, **{**LAYOUT, **change}) != base, change
    (tmp_path / "model.safetensors").write_bytes(b"y" * 11)                # new weights in place
    assert namespace(model_identity(tmp_path), **LAYOUT) != base
    assert model_identity(None) != model_identity(None)                    # no folder: never shared

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


def test_fp8_scales_and_tp_rank_name_the_directory():
    """An fp8 cache's scales (as float32) and the TP size and rank are part of the format."""
    from toolkit.blocks.kv_cache import KVCache
    from toolkit.kv_transfer.keys import cache_namespace, kv_format

    def cache(dtype=torch.float32, k=(0.5, 0.25), heads=2):
        c = KVCache(2, 4, 4, heads, 16, dtype)
        if c.is_fp8:
            c.set_scales(list(k), [1.0, 2.0])
        return c

    fp8 = torch.float8_e4m3fn
    assert cache_namespace("m", cache()) == namespace("m", **LAYOUT)          # unchanged without fp8 or TP
    a, b = cache(fp8), cache(fp8, k=(0.5, 0.26))
    assert cache_namespace("m", a) != cache_namespace("m", b) != cache_namespace("m", cache())
    assert cache_namespace("m", a) == cache_namespace("m", cache(fp8, k=(0.5, 0.25 + 1e-12)))   # float32 equal
    assert "scales:" in kv_format(a) and kv_format(a) != kv_format(b)
    r0, r1 = (cache_namespace("m", cache(heads=1), r, 2) for r in (0, 1))
    assert r0.endswith("-tp2-rank0") and r1.endswith("-tp2-rank1") and r0[:32] == r1[:32]
    assert r0[:32] != namespace("m", **{**LAYOUT, "num_kv_heads": 1})          # TP=2's slice is not TP=1's
    assert kv_format(cache(heads=1), 1, 2).endswith("|tp2|rank1")


def test_a_store_refuses_a_second_format(tmp_path):
    """Claimed by the first engine; a DiskKVStore keeps the claim in FORMAT across processes."""
    import pytest

    from toolkit.kv_transfer.disk_store import DiskKVStore
    from toolkit.kv_transfer.kv_store import MemoryKVStore

    mem = MemoryKVStore((2, 2, 4, 2, 16), torch.float32, 4)
    mem.claim_format("A")
    mem.claim_format("A")
    with pytest.raises(ValueError, match="KV format"):
        mem.claim_format("B")
    disk = DiskKVStore(tmp_path / "ns", (2, 2, 4, 2, 16), torch.float32, 2**20)
    disk.claim_format("A")
    disk.put("k", torch.zeros(2, 2, 4, 2, 16))
    again = DiskKVStore(tmp_path / "ns", (2, 2, 4, 2, 16), torch.float32, 2**20)
    with pytest.raises(ValueError, match="KV format 'A'"):
        again.claim_format("B")
    again.claim_format("A")
    assert again.num_blocks == 1


def test_two_stores_opened_together_cannot_both_claim_a_directory(tmp_path):
    """Both opened before either wrote (PD's two processes starting at once): the second
    claim of another format is refused; a store of another block size over a claimed
    directory deletes none of its blocks, even while refused, and its own claim does."""
    import pytest

    from toolkit.kv_transfer.disk_store import DiskKVStore

    shape = (2, 2, 4, 2, 16)
    a = DiskKVStore(tmp_path / "ns", shape, torch.float32, 2**20)
    b = DiskKVStore(tmp_path / "ns", shape, torch.float32, 2**20)
    a.claim_format("A")
    with pytest.raises(ValueError, match="KV format 'A'"):
        b.claim_format("B")
    a.put("k", torch.ones(shape))
    half = DiskKVStore(tmp_path / "ns", shape, torch.float16, 2**20)        # another block size
    with pytest.raises(ValueError, match="KV format 'A'"):
        half.claim_format("A-fp16")
    assert a.get("k").eq(1).all()                      # still there
    half.claim_format("A")                             # the same format (a test's shortcut): its claim
    assert not (tmp_path / "ns" / "k.kv").exists()    # clears what it cannot read
    assert not list((tmp_path / "ns").glob(".tmp-*"))

"""The loader: sharded and single-file safetensors, .bin only on request, random weights,
dtypes, and the errors for a missing folder, missing shards, tensors and shapes."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from model_configs import build_hf, family_config
from paged import PagedRunner
from safetensors.torch import load_file, save_file

from toolkit.models import load_model, model_class
from toolkit.models.loader import load_config
from toolkit.models.weights import iterate_weights

TOKENS = list(range(3, 40, 3))


def logits(model) -> torch.Tensor:
    return PagedRunner(model).step([[]], [TOKENS], [0])


@pytest.fixture(scope="module")
def llama(hf_checkpoint):
    return hf_checkpoint("llama")


def copy_folder(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_sharded_safetensors_equal_single_file(llama, tmp_path):
    hf, folder = llama
    hf.save_pretrained(tmp_path, max_shard_size="60KB")
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "model.safetensors.index.json").exists()
    torch.testing.assert_close(logits(load_model(tmp_path)), logits(load_model(folder)), rtol=0, atol=0)


def test_missing_shard_is_named(llama, tmp_path):
    hf, _ = llama
    hf.save_pretrained(tmp_path, max_shard_size="60KB")
    victim = sorted(tmp_path.glob("*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=victim.name):
        load_model(tmp_path)


def test_missing_folder_and_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)


def test_missing_tensor_is_named(llama, tmp_path):
    _, folder = llama
    dst = copy_folder(folder, tmp_path / "m")
    state = load_file(dst / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.gate_up_proj\.weight \(part 1 of 2\)"):
        load_model(dst)


def test_shape_mismatch_names_tensor_and_shapes(llama, tmp_path):
    _, folder = llama
    dst = copy_folder(folder, tmp_path / "m")
    cfg = json.loads((dst / "config.json").read_text())
    cfg["intermediate_size"] = 161
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.mlp\.(gate|up|down)_proj\.weight'"
                       r".*checkpoint has \((96, 160|160, 96)\).*expects \((96, 161|161, 96)\)"):
        load_model(dst)


def test_unexpected_tensor_is_an_error(llama, tmp_path):
    _, folder = llama
    dst = copy_folder(folder, tmp_path / "m")
    state = load_file(dst / "model.safetensors")
    state["model.layers.0.self_attn.q_norm.weight"] = torch.ones(16)   # a Qwen3 tensor in a Llama
    save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="q_norm.weight"):
        load_model(dst)


def test_bin_only_with_load_format_pt(llama, tmp_path):
    hf, folder = llama
    dst = tmp_path / "bin"
    dst.mkdir()
    shutil.copy(folder / "config.json", dst)
    torch.save(hf.state_dict(), dst / "pytorch_model.bin")
    with pytest.raises(ValueError, match="load_format='pt'"):
        load_model(dst)
    torch.testing.assert_close(logits(load_model(dst, load_format="pt")), logits(load_model(folder)),
                               rtol=0, atol=0)


def test_bin_rejects_pickled_code(llama, tmp_path):
    # weights_only=True: a pickle that would run code is refused, not executed
    _, folder = llama
    dst = tmp_path / "evil"
    dst.mkdir()
    shutil.copy(folder / "config.json", dst)
    torch.save({"x": _Evil()}, dst / "pytorch_model.bin")
    with pytest.raises(Exception, match="(?i)weights_only|unsupported global"):
        list(iterate_weights(dst, "pt"))


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_unknown_architecture_lists_supported(llama, tmp_path):
    _, folder = llama
    dst = copy_folder(folder, tmp_path / "m")
    cfg = json.loads((dst / "config.json").read_text())
    cfg["architectures"] = ["FalconForCausalLM"]
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"FalconForCausalLM.*LlamaForCausalLM.*Qwen3ForCausalLM"):
        load_model(dst)
    with pytest.raises(ValueError, match="supported"):
        model_class(type("C", (), {"architectures": None, "model_type": "gpt2"})())


def test_bad_arguments(llama):
    _, folder = llama
    with pytest.raises(ValueError, match="load_format"):
        load_model(folder, load_format="gguf")
    with pytest.raises(ValueError, match="dtype"):
        load_model(folder, dtype=torch.int8)
    with pytest.raises(ValueError, match="source"):
        load_model(42)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_load_converts_and_stays_close(llama, dtype):
    _, folder = llama
    model = load_model(folder, dtype=dtype)
    assert all(p.dtype == dtype for p in model.parameters())
    got, want = logits(model), logits(load_model(folder))
    assert torch.isfinite(got).all()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.8
    torch.testing.assert_close(got, want, rtol=0.1, atol=0.15)


def test_random_weights_from_config_and_dummy_format(llama):
    _, folder = llama
    a = load_model(family_config("llama"))
    b = load_model(folder, load_format="dummy")
    assert torch.equal(logits(a), logits(b)), "random init is seeded, so reproducible"
    p = a.model.layers[0].self_attn.qkv_proj.weight
    assert 0.015 < p.std() < 0.025 and torch.equal(a.model.norm.weight, torch.ones(96))


def test_random_weights_stay_finite_in_bf16_through_28_layers():
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, intermediate_size=704,
                      num_hidden_layers=28, vocab_size=1000, max_position_embeddings=128)
    model = load_model(cfg, dtype=torch.bfloat16)
    out = logits(model)
    assert torch.isfinite(out).all() and out.abs().max() > 0


def test_hf_random_checkpoint_loads_exactly(tmp_path):
    hf = build_hf("qwen3", seed=3)
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path)
    q = hf.model.layers[1].self_attn
    qkv = model.model.layers[1].self_attn.qkv_proj.weight
    assert torch.equal(qkv, torch.cat([q.q_proj.weight, q.k_proj.weight, q.v_proj.weight]))
    assert torch.equal(model.model.layers[1].self_attn.k_norm.weight, q.k_norm.weight)


def test_a_hub_id_says_to_download_it_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                       # no such relative folder here
    with pytest.raises(FileNotFoundError, match="hub id.*huggingface-cli download meta-llama/Llama-3.1-8B"):
        load_config("meta-llama/Llama-3.1-8B")
    with pytest.raises(FileNotFoundError) as e:
        load_config(tmp_path / "missing")
    assert "hub id" not in str(e.value)

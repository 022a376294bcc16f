"""Adapters served by name: listed in /v1/models, addressed by `model`, loaded and unloaded
at run time behind the flag (vLLM's routes and messages), bad names / folders answered with
4xx while the server goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

httpx = pytest.importorskip("httpx")

from server_util import Server, free_port  # noqa: E402

# tiny_chat_dir's shapes (out, in): hidden 64, 4 heads of 16, 2 KV heads, intermediate 128
SHAPES = {"self_attn.q_proj": (64, 64), "self_attn.v_proj": (32, 64), "mlp.down_proj": (64, 128)}


def write_adapter(folder: Path, r: int, seed: int) -> str:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": r, "lora_alpha": r, "target_modules": ["q_proj", "v_proj", "down_proj"]}))
    g = torch.Generator().manual_seed(seed)
    t = {}
    for layer in range(2):
        for m, (o, i) in SHAPES.items():
            t[f"base_model.model.model.layers.{layer}.{m}.lora_A.weight"] = torch.randn(r, i, generator=g)
            t[f"base_model.model.model.layers.{layer}.{m}.lora_B.weight"] = torch.randn(o, r, generator=g)
    save_file(t, str(folder / "adapter_model.safetensors"))
    return str(folder)


@pytest.fixture(scope="module")
def lora_server(tiny_chat_dir, tmp_path_factory):
    from toolkit import LLM
    from toolkit.entrypoints.async_engine import AsyncEngine
    from toolkit.serving.app import build_app

    root = tmp_path_factory.mktemp("adapters")
    paths = {"a": write_adapter(root / "a", 4, 1), "b": write_adapter(root / "b", 8, 2)}
    engine = AsyncEngine(LLM(tiny_chat_dir, num_blocks=128, block_size=8, max_num_seqs=8, enable_lora=True,
                             max_loras=2, max_lora_rank=8))
    app = build_app(engine, model_name="tiny", lora_modules={"a": paths["a"]}, allow_runtime_lora_updating=True)
    srv = Server(app, free_port())
    yield srv, engine, paths, root
    srv.stop()


def _complete(srv, model: str, status: int = 200) -> list[int] | dict:
    r = httpx.post(srv.url + "/v1/completions", timeout=60, json={
        "model": model, "prompt": [5, 6, 7, 8, 9], "max_tokens": 5, "temperature": 0.0, "logprobs": 0})
    assert r.status_code == status, r.text
    return r.json()


def test_models_load_use_unload(lora_server):
    srv, engine, paths, root = lora_server
    ids = [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]]
    assert ids == ["tiny", "a"]
    base, a = _complete(srv, "tiny"), _complete(srv, "a")
    assert a["model"] == "a" and a["choices"][0]["text"] != base["choices"][0]["text"]
    _complete(srv, "b", 404)                                       # not loaded yet
    r = httpx.post(srv.url + "/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": paths["b"]})
    assert r.status_code == 200 and "added successfully" in r.text
    assert [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]] == ["tiny", "a", "b"]
    b = _complete(srv, "b")
    assert b["choices"][0]["text"] not in (base["choices"][0]["text"], a["choices"][0]["text"])
    r = httpx.post(srv.url + "/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": paths["b"]})
    assert r.status_code == 400 and "already been loaded" in r.text
    r = httpx.post(srv.url + "/v1/load_lora_adapter", json={"lora_name": "c", "lora_path": str(root / "none")})
    assert r.status_code == 400 and "does not exist" in r.text
    bad = root / "corrupt"                                         # a folder whose weights are garbage
    bad.mkdir()
    (bad / "adapter_config.json").write_text((Path(paths["b"]) / "adapter_config.json").read_text())
    (bad / "adapter_model.safetensors").write_bytes(b"garbage")
    r = httpx.post(srv.url + "/v1/load_lora_adapter", json={"lora_name": "c", "lora_path": str(bad)})
    assert r.status_code == 400 and "cannot read the LoRA adapter's weights" in r.text
    assert "c" not in [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]]
    assert httpx.post(srv.url + "/v1/unload_lora_adapter", json={"lora_name": "b"}).status_code == 200
    assert httpx.post(srv.url + "/v1/unload_lora_adapter", json={"lora_name": "b"}).status_code == 404
    _complete(srv, "b", 404)
    assert _complete(srv, "a")["choices"][0]["text"] == a["choices"][0]["text"]


def test_a_bad_adapter_is_a_400_and_the_server_goes_on(lora_server):
    srv, engine, paths, root = lora_server
    big = write_adapter(root / "big", 16, 3)                       # rank 16 > max_lora_rank=8
    assert httpx.post(srv.url + "/v1/load_lora_adapter", json={"lora_name": "big", "lora_path": big}).status_code == 200
    err = _complete(srv, "big", 400)
    assert "max_lora_rank=8" in err["error"]["message"]
    assert _complete(srv, "a")["model"] == "a"


def test_unload_while_a_request_runs(lora_server):
    """The running request finishes with its adapter; new requests for the name get a 404."""
    srv, engine, paths, root = lora_server
    body = {"model": "a", "prompt": [5, 6, 7], "max_tokens": 24, "temperature": 0.0, "stream": True,
            "ignore_eos": True}
    chunks = 0
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks += 1
                if chunks == 1:
                    assert httpx.post(srv.url + "/v1/unload_lora_adapter", json={"lora_name": "a"}).status_code == 200
                    _complete(srv, "a", 404)
    assert chunks >= 2
    assert httpx.post(srv.url + "/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": paths["a"]}).status_code == 200
    assert _complete(srv, "a")["model"] == "a"
    assert not engine.engine.scheduler._lora_held          # thread mode: the Engine is here, idle


def test_without_the_flag_there_are_no_update_routes(tiny_chat_dir, make_server):
    srv, _ = make_server(tiny_chat_dir)
    r = httpx.post(srv.url + "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/x"})
    assert r.status_code == 404


def test_cli_flags():
    from toolkit.serve import engine_options, parse_args
    from toolkit.serving.lora import parse_lora_modules

    args = parse_args(["m", "--enable-lora", "--max-loras", "4", "--lora-modules", "a=/x", "b=/y"])
    assert engine_options(args)["enable_lora"] and engine_options(args)["max_loras"] == 4
    assert parse_lora_modules(args.lora_modules) == {"a": "/x", "b": "/y"}
    with pytest.raises(SystemExit, match="--enable-lora"):
        engine_options(parse_args(["m", "--lora-modules", "a=/x"]))
    with pytest.raises(ValueError, match="name=path"):
        parse_lora_modules(["nopath"])


def test_a_bad_lora_module_at_start_is_a_message_before_any_engine(tmp_path):
    from toolkit.serve import main

    with pytest.raises(SystemExit, match="--lora-modules: .*does not exist"):
        main([str(tmp_path), "--enable-lora", "--lora-modules", f"a={tmp_path / 'none'}"])
    with pytest.raises(SystemExit, match="--lora-modules: 'm' is the base model's name"):
        main([str(tmp_path), "--served-model-name", "m", "--enable-lora", "--lora-modules", f"m={tmp_path}"])

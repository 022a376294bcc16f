"""Sleep mode through AsyncEngine (thread and process cores) and the server's development
routes: /sleep, /wake_up, /is_sleeping, /reset_prefix_cache with --enable-sleep-mode, 404
without it; a completion while asleep is a 503 that says to wake the engine."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from toolkit import LLM, SamplingParams
from toolkit.entrypoints.async_engine import AsyncEngine

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
OPTIONS = dict(num_blocks=64, block_size=8, max_num_seqs=8)
PROMPTS = [[5, 6, 7], [4] * 20]


def config() -> LlamaConfig:
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=300, max_position_embeddings=256,
                       eos_token_id=2, bos_token_id=1)


@pytest.fixture(scope="module")
def trained() -> dict[str, torch.Tensor]:
    """A trainer's new weights: another random model of the same shape."""
    torch.manual_seed(3)
    return dict(AutoModelForCausalLM.from_config(config(), dtype=torch.float32).state_dict())


@pytest.fixture(scope="module")
def want(trained) -> dict[str, list[list[int]]]:
    with LLM(config(), **OPTIONS) as llm:
        before = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
        llm.update_weights(trained)
        after = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert before != after
    return {"before": before, "after": after}


async def _tokens(ae: AsyncEngine) -> list[list[int]]:
    async def one(p):
        ids = []
        async for d in ae.generate(p, GREEDY):
            ids += [t for c in d.outputs for t in c.token_ids]
        return ids
    return list(await asyncio.gather(*(one(p) for p in PROMPTS)))


@pytest.mark.parametrize("process", [False, True], ids=["thread", "process"])
def test_async_engine_sleep_wake_update(process, want, trained) -> None:
    ae = AsyncEngine.build(config(), process=process, enable_sleep_mode=True, **OPTIONS)
    try:
        async def run() -> None:
            assert await _tokens(ae) == want["before"]
            await ae.sleep(1)
            assert await ae.is_sleeping()
            with pytest.raises(RuntimeError, match="asleep"):
                await ae.add_async([5, 6, 7], GREEDY)
            await ae.wake_up(["weights"])
            assert await ae.is_sleeping()
            await ae.wake_up("kv_cache")
            assert not await ae.is_sleeping()
            assert await _tokens(ae) == want["before"]
            await ae.sleep(2)
            await ae.wake_up()
            with pytest.raises(ValueError, match="no weight was changed"):
                await ae.update_weights([("model.norm.weight", torch.ones(3))])
            assert await ae.update_weights(iter(trained.items())) == len(trained)
            assert await _tokens(ae) == want["after"]
            assert await ae.reset_prefix_cache()
        asyncio.run(run())
    finally:
        ae.close()


def _request(url: str, method: str = "POST", body: dict | None = None) -> tuple[int, object]:
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None


def _serve(model_dir: str, flag: bool):
    from server_util import Server, free_port

    from toolkit.serving.app import build_app

    engine = AsyncEngine(LLM(model_dir, enable_sleep_mode=flag, num_blocks=64, block_size=8, max_num_seqs=8))
    return Server(build_app(engine, model_name="tiny", enable_sleep_mode=flag), free_port())


def test_server_routes_with_the_flag(tiny_chat_dir) -> None:
    pytest.importorskip("fastapi")
    srv = _serve(tiny_chat_dir, True)
    try:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        status, first = _request(srv.url + "/v1/completions", body=body)
        assert status == 200
        assert _request(srv.url + "/is_sleeping", "GET") == (200, {"is_sleeping": False})
        assert _request(srv.url + "/sleep?level=1")[0] == 200
        assert _request(srv.url + "/is_sleeping", "GET") == (200, {"is_sleeping": True})
        status, err = _request(srv.url + "/v1/completions", body=body)
        assert status == 503 and "wake_up" in err["error"]["message"]
        for route, pooled in (("/v1/embeddings", {"input": "hello"}),
                              ("/v1/score", {"text_1": "a", "text_2": ["b"]})):
            status, err = _request(srv.url + route, body={"model": "tiny", **pooled})
            assert (status, err["error"]["code"]) == (503, "engine_sleeping"), (route, err)
        status, err = _request(srv.url + "/sleep?level=3")
        assert status == 400 and "level" in err["error"]["message"]
        status, err = _request(srv.url + "/wake_up?tags=weight")
        assert status == 400 and "valid tags" in err["error"]["message"]
        assert _request(srv.url + "/wake_up?tags=weights")[0] == 200
        assert _request(srv.url + "/is_sleeping", "GET") == (200, {"is_sleeping": True})
        assert _request(srv.url + "/wake_up?tags=kv_cache")[0] == 200
        assert _request(srv.url + "/is_sleeping", "GET") == (200, {"is_sleeping": False})
        status, again = _request(srv.url + "/v1/completions", body=body)
        assert status == 200 and again["choices"][0]["text"] == first["choices"][0]["text"]
        assert _request(srv.url + "/reset_prefix_cache")[0] == 200
    finally:
        srv.stop()


def test_server_routes_are_404_without_the_flag(tiny_chat_dir) -> None:
    pytest.importorskip("fastapi")
    srv = _serve(tiny_chat_dir, False)
    try:
        for path, method in (("/sleep", "POST"), ("/wake_up", "POST"), ("/is_sleeping", "GET"),
                             ("/reset_prefix_cache", "POST")):
            assert _request(srv.url + path, method)[0] == 404, path
    finally:
        srv.stop()


def test_serve_flag_enables_sleep_mode() -> None:
    from toolkit.serve import engine_options, parse_args

    assert engine_options(parse_args(["m", "--enable-sleep-mode"]))["enable_sleep_mode"] is True
    assert "enable_sleep_mode" not in engine_options(parse_args(["m"]))

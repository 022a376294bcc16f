"""Sleep mode and weight updates (toolkit/engine/sleep.py, toolkit/worker/sleep.py):
sleep(1) + wake gives the same greedy tokens; sleep(2) + update_weights gives a fresh LLM's
tokens on the new weights; generating while asleep, unknown names, wrong shapes and a busy
engine are refused with every weight intact; the allocator holds no block afterwards."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from toolkit import LLM, SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 40)), [3] * 12]
SP = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
OPTS = dict(num_blocks=32, block_size=8, max_num_seqs=4)


def _config() -> LlamaConfig:
    return LlamaConfig(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
                       num_key_value_heads=2, vocab_size=517, max_position_embeddings=512,
                       eos_token_id=2, bos_token_id=1, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def other_model(tmp_path_factory):
    """(folder, state dict) of a second random model of tiny_llama_dir's shape: the trainer's."""
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(_config(), dtype=torch.float32)
    path = tmp_path_factory.mktemp("other_llama")
    model.save_pretrained(path)
    return str(path), {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def want(tiny_llama_dir, other_model):
    """Greedy tokens of fresh engines on the first and on the second model."""
    out = {}
    for key, path in (("a", tiny_llama_dir), ("b", other_model[0])):
        with LLM(path, **OPTS) as llm:
            out[key] = _tokens(llm)
    assert out["a"] != out["b"]
    return out


@pytest.fixture
def llm(tiny_llama_dir):
    with LLM(tiny_llama_dir, enable_sleep_mode=True, **OPTS) as engine:
        yield engine


def _tokens(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, SP, use_tqdm=False)]


def _checksum(llm: LLM) -> float:
    return sum(float(p.double().abs().sum()) for p in llm.engine.model.parameters())


def _check_no_block_held(llm: LLM) -> None:
    a = llm.engine.allocator
    assert a.num_free_blocks() == a.num_blocks
    assert all(a.ref_count(b) == 0 for b in range(a.num_blocks))


def _check_allocator_empty(llm: LLM) -> None:
    _check_no_block_held(llm)
    assert llm.engine.allocator.num_cached_blocks() == 0


def test_sleep_level1_and_wake_gives_the_same_tokens(llm, want) -> None:
    assert _tokens(llm) == want["a"]
    assert llm.engine.allocator.num_cached_blocks() > 0        # a prefix cache to reset
    model, kv = llm.engine.model, llm.engine.runner.kv_cache
    weight = model.model.layers[0].self_attn.qkv_proj.weight
    nbytes = kv.nbytes + sum(p.untyped_storage().nbytes() for p in model.parameters())
    llm.sleep(level=1)
    assert llm.is_sleeping() and "SleepMode(asleep: weights (level 1), kv_cache (level 1))" in repr(llm)
    assert weight.untyped_storage().nbytes() == 0               # freed, the Parameter kept
    assert all(t.untyped_storage().nbytes() == 0 for t in kv.layers)
    assert llm.engine.sleep_mode.freed_bytes == nbytes
    _check_allocator_empty(llm)
    with pytest.raises(RuntimeError, match=r"asleep.*wake_up\(\)"):
        llm.generate(PROMPTS, SP, use_tqdm=False)
    assert llm.engine.request_ids() == [] and not llm.engine.has_unfinished()
    llm.wake_up(tags=["kv_cache"])                              # one part, then the other
    assert llm.is_sleeping()
    with pytest.raises(RuntimeError, match=r"the weights \(level 1\).*wake_up\(tags=\['weights'\]\)"):
        llm.generate(PROMPTS, SP, use_tqdm=False)
    llm.wake_up(tags="weights")
    assert not llm.is_sleeping()
    assert model.model.layers[0].self_attn.qkv_proj.weight is weight    # never rebound
    assert _tokens(llm) == want["a"]
    llm.sleep(1)                                                # a second round, and wake both
    llm.wake_up()
    assert _tokens(llm) == want["a"]
    _check_no_block_held(llm)


def test_sleep_level2_then_update_weights_equals_a_fresh_llm(llm, want, other_model) -> None:
    _tokens(llm)
    llm.sleep(level=2)
    llm.wake_up(tags=["weights"])
    assert _checksum(llm) == 0.0                                # discarded: zeros until loaded
    with pytest.raises(RuntimeError, match=r"KV cache \(level 1\)"):
        llm.generate(PROMPTS, SP, use_tqdm=False)
    state = other_model[1]
    names = sorted(state)
    llm.update_weights([(n, state[n]) for n in names[: len(names) // 2]])   # a trainer's buckets
    llm.wake_up(tags=["kv_cache"])
    with pytest.raises(RuntimeError, match=r"not been given again.*update_weights"):
        llm.generate(PROMPTS, SP, use_tqdm=False)
    llm.update_weights((n, state[n]) for n in names[len(names) // 2:])
    assert _tokens(llm) == want["b"]
    _check_no_block_held(llm)


def test_sleep_level1_then_level2_drops_the_host_copies(llm) -> None:
    llm.sleep(1)
    sleeper = llm.engine.runner.executor.runner.sleeper
    assert all(st.host is not None for st in sleeper.asleep["weights"])
    llm.sleep(2)
    assert all(st.host is None for st in sleeper.asleep["weights"])
    llm.wake_up()
    with pytest.raises(RuntimeError, match="sleep\\(level=2\\)"):
        llm.generate(PROMPTS, SP, use_tqdm=False)


def test_update_weights_while_awake_changes_outputs_and_resets_the_prefix_cache(llm, want, other_model) -> None:
    assert _tokens(llm) == want["a"]
    assert llm.engine.allocator.num_cached_blocks() > 0
    n = llm.update_weights(other_model[1])                      # a dict, full tensors
    assert n == len(other_model[1])
    assert llm.engine.allocator.num_cached_blocks() == 0
    assert _tokens(llm) == want["b"]


def test_bad_updates_change_no_weight(llm, want, other_model) -> None:
    state = other_model[1]
    before = _checksum(llm)
    good = [(n, state[n]) for n in sorted(state)]
    up = "model.layers.1.mlp.up_proj.weight"
    bad_updates = {
        "unknown name": good + [("model.layers.7.mlp.up_proj.weight", state[up])],
        "wrong shape": good[:-1] + [(up, state[up][:, :-1])],
        "transposed": [(up, state[up].t())] + good,
        "integer tensor": good + [(up, state[up].long())],
        "wrong q shard": good + [("model.layers.0.self_attn.q_proj.weight", torch.zeros(5, 96))],
    }
    for what, update in bad_updates.items():
        with pytest.raises(ValueError, match="no weight was changed"):
            llm.update_weights(update)
        assert _checksum(llm) == before, what
    with pytest.raises(TypeError, match="torch.Tensor"):
        llm.update_weights([(up, [[1.0]])])
    with pytest.raises(TypeError, match="pairs"):
        llm.update_weights([up])
    with pytest.raises(TypeError, match="iterable"):
        llm.update_weights(3)
    assert _checksum(llm) == before
    assert _tokens(llm) == want["a"]


def test_an_unchecked_model_is_rolled_back(llm, want, monkeypatch) -> None:
    """A model without a way to check an update first: its loader's error restores a copy."""
    import toolkit.engine.sleep as sleep_mod

    monkeypatch.setattr(sleep_mod, "check_update", lambda model, weights: False)
    before = _checksum(llm)
    emb = llm.engine.model.model.embed_tokens.weight
    update = [("model.embed_tokens.weight", torch.ones(emb.shape)),
              ("model.layers.0.mlp.up_proj.weight", torch.zeros(4, 4))]
    with pytest.raises(ValueError, match="shape"):
        llm.update_weights(update)
    assert _checksum(llm) == before
    assert llm.engine.runner.executor.runner.weights_snapshot is None
    assert _tokens(llm) == want["a"]


def test_sleep_and_update_need_an_idle_engine(llm) -> None:
    engine = llm.engine
    rid = engine.add_request([1, 2, 3], SP)
    engine.step()
    with pytest.raises(RuntimeError, match=r"idle engine.*abort\(\)"):
        llm.sleep(1)
    with pytest.raises(RuntimeError, match="idle engine"):
        llm.update_weights([])
    assert not llm.is_sleeping()
    assert llm.reset_prefix_cache() is False
    engine.abort(rid)
    assert llm.reset_prefix_cache() is True
    llm.sleep(1)
    with pytest.raises(RuntimeError, match="asleep"):
        engine.add_request([1, 2, 3], SP)
    assert engine.request_ids() == []
    with pytest.raises(RuntimeError, match="wake_up"):
        llm.update_weights([])                                  # the weights are asleep
    llm.wake_up()


def test_sleep_validation(tiny_llama_dir, llm) -> None:
    with LLM(tiny_llama_dir, **OPTS) as plain:
        with pytest.raises(ValueError, match="enable_sleep_mode=True"):
            plain.sleep()
        assert not plain.is_sleeping()
    with pytest.raises(TypeError, match="enable_sleep_mode must be True or False"):
        LLM(tiny_llama_dir, enable_sleep_mode="yes", **OPTS)
    for level, err in ((0, ValueError), (3, ValueError), ("1", TypeError), (True, TypeError)):
        with pytest.raises(err, match="level"):
            llm.sleep(level)
    with pytest.raises(ValueError, match="valid tags"):
        llm.wake_up(tags=["weight"])
    llm.wake_up()                                               # awake: nothing to do
    assert not llm.is_sleeping()


def test_host_tier_and_sleep(tiny_llama_dir, want, other_model) -> None:
    """With a host tier: sleep(1) keeps its KV (same weights); an update empties it."""
    with LLM(tiny_llama_dir, enable_sleep_mode=True, host_cache_blocks=16, **OPTS) as llm:
        assert _tokens(llm) == want["a"]
        llm.sleep(1)
        llm.wake_up()
        assert _tokens(llm) == want["a"]
        llm.update_weights(other_model[1])
        host = llm.engine.scheduler.kv.host
        assert host.num_cached() == 0 and host.num_owned() == 0
        assert _tokens(llm) == want["b"]


def test_a_kv_connector_refuses_new_weights(tiny_llama_dir, want, other_model, tmp_path) -> None:
    """The disk tier names blocks by the model's files: sleep(1) keeps them valid, but
    update_weights and sleep(2) (whose wake needs one) are refused, the weights intact."""
    with LLM(tiny_llama_dir, enable_sleep_mode=True, kv_cache_dir=str(tmp_path), **OPTS) as llm:
        assert _tokens(llm) == want["a"]
        llm.sleep(1)
        llm.wake_up()
        with pytest.raises(ValueError, match=r"update_weights\(\) is refused with a KV connector"):
            llm.update_weights(other_model[1])
        with pytest.raises(ValueError, match=r"sleep\(level=2\) is refused with a KV connector"):
            llm.sleep(2)
        assert not llm.engine.sleep_mode.asleep and _tokens(llm) == want["a"]


def test_transformers_backend_update_is_checked(tiny_llama_dir, want, other_model) -> None:
    with LLM(tiny_llama_dir, model_impl="transformers", enable_sleep_mode=True, **OPTS) as llm:
        assert _tokens(llm) == want["a"]
        llm.sleep(2)
        llm.wake_up()
        with pytest.raises(ValueError, match="no weight was changed"):
            llm.update_weights([("model.norm.weight", torch.ones(7))])
        llm.update_weights(other_model[1])
        assert _tokens(llm) == want["b"]


def _rank_checksum(runner) -> float:
    return sum(float(p.double().abs().sum()) for p in runner.model.parameters())


def _rank_freed(runner) -> bool:
    return all(p.untyped_storage().nbytes() == 0 for p in runner.model.parameters()) and \
        all(t.untyped_storage().nbytes() == 0 for t in runner.kv_cache.layers)


def test_tensor_parallel_sleep_and_update(tiny_llama_dir, want, other_model) -> None:
    """TP=2 over gloo processes: every rank sleeps and wakes; each rank takes its slices of
    full tensors; a bad update leaves every rank's weights as they were."""
    with LLM(tiny_llama_dir, tensor_parallel_size=2, enable_sleep_mode=True, **OPTS) as llm:
        executor = llm.engine.runner.executor
        assert _tokens(llm) == want["a"]
        llm.sleep(1)
        assert executor.call(_rank_freed) == [True, True]
        llm.wake_up()
        assert _tokens(llm) == want["a"]
        before = executor.call(_rank_checksum)
        state = other_model[1]
        up = "model.layers.1.mlp.up_proj.weight"
        with pytest.raises(ValueError, match="no weight was changed"):
            llm.update_weights(list(state.items()) + [(up, state[up][:-1])])
        assert executor.call(_rank_checksum) == before
        llm.sleep(2)
        llm.wake_up()
        llm.update_weights(state)
        assert _tokens(llm) == want["b"]


def test_radix_prefix_cache_is_reset_too(tiny_llama_dir, want, other_model) -> None:
    with LLM(tiny_llama_dir, allocator="radix", enable_sleep_mode=True, **OPTS) as llm:
        assert _tokens(llm) == want["a"]
        assert llm.engine.allocator.num_cached_blocks() > 0
        llm.sleep(1)
        _check_allocator_empty(llm)
        llm.wake_up()
        llm.update_weights(other_model[1])
        assert _tokens(llm) == want["b"] and llm.engine.allocator.num_cached_blocks() > 0


def test_fp8_kv_speculative_and_n_survive_sleep(tiny_llama_dir) -> None:
    """An fp8 KV cache (its bytes are float8), n-gram drafts and n = 2 forks: the same tokens
    after sleep(1) + wake."""
    sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, n=2)
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [1, 2, 3]]
    with LLM(tiny_llama_dir, enable_sleep_mode=True, kv_cache_dtype="fp8", speculative="ngram",
             num_speculative_tokens=2, **OPTS) as llm:
        before = [[list(c.token_ids) for c in o.outputs] for o in llm.generate(prompts, sp, use_tqdm=False)]
        llm.sleep(1)
        llm.wake_up()
        after = [[list(c.token_ids) for c in o.outputs] for o in llm.generate(prompts, sp, use_tqdm=False)]
        assert after == before
        _check_no_block_held(llm)

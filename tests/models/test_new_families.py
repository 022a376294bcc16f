"""The families beyond Llama (Gemma 2, Gemma 3, Phi-3), each saved by transformers and read by
the toolkit's loader: logits of a ragged batch through the paged cache equal Hugging Face's
(chunks longer than the sliding window, local and global layers interleaved), and greedy
generation through LLM equals transformers' generate with a KV pool small enough to preempt.
Also: the model registry takes a user's class, and the per-layer attention routing."""

from __future__ import annotations

import types
from functools import partial

import pytest
import torch
from model_configs import NEW_FAMILIES
from paged import PagedRunner, run_schedule

from toolkit import LLM, SamplingParams
from toolkit.attention.layerwise import LayerwiseAttention, build_attention
from toolkit.attention.torch_ref import TorchAttention
from toolkit.models import load_model, register_model
from toolkit.models.base import LayerAttention
from toolkit.models.llama import LlamaForCausalLM

# sequence -> its chunks, one per step (a chunk of 1 after the prompt is a decode step)
SCHEDULE = {"a": [13, 1, 1, 1], "b": [1, 1, 1, 1, 1], "c": [10, 9, 2, 1], "d": [7], "e": [0, 0, 5, 3]}


def _schedule_logits(model, tokens: dict[str, list[int]], runner: PagedRunner) -> dict[str, torch.Tensor]:
    return run_schedule(runner, SCHEDULE, tokens)


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_ragged_paged_logits_equal_hf(family, hf_checkpoint):
    hf, folder = hf_checkpoint(family)
    model = load_model(folder)
    assert type(model).__name__ == hf.config.architectures[0]
    g = torch.Generator().manual_seed(1)
    tokens = {s: torch.randint(0, 211, (sum(c),), generator=g).tolist() for s, c in SCHEDULE.items()}
    got = _schedule_logits(model, tokens, PagedRunner(model, block_size=4))
    for s, toks in tokens.items():
        with torch.no_grad():
            want = hf(torch.tensor([toks])).logits[0].float()      # [S, V]
        assert want.std() > 0.1, "logits too flat to be a meaningful comparison"
        torch.testing.assert_close(got[s], want, rtol=1e-4, atol=1e-4, msg=lambda m, s=s: f"{family}/{s}: {m}")


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_greedy_through_llm_equals_hf_generate_under_preemption(family, hf_checkpoint):
    hf, folder = hf_checkpoint(family)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 211, (n,), generator=g).tolist() for n in (14, 9, 17)]   # > every window
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    # 3 x (<= 29 tokens) need 21+ blocks of 4 at once: 12 blocks force preemption
    with LLM(folder, dtype="float32", device="cpu", block_size=4, num_blocks=12, max_num_seqs=3,
             max_num_batched_tokens=16, enable_prefix_caching=False) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        assert llm.engine.num_preemptions > 0
    for p, o in zip(prompts, outs):
        ids = torch.tensor([p])
        want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert o.outputs[0].token_ids == want, family


def test_layers_attend_as_the_config_says(hf_checkpoint):
    _, folder = hf_checkpoint("gemma2")
    model = load_model(folder)
    scale = 24 ** -0.5
    assert model.spec.layers == (LayerAttention("sliding", 6, 5.0, scale), LayerAttention("full", None, 5.0, scale)) * 2
    runner = PagedRunner(model, block_size=4)
    attn = runner.attention
    assert isinstance(attn, LayerwiseAttention) and len(attn.backends) == 2
    assert [b.sliding_window for b in attn.by_layer] == [6, None, 6, None]
    assert all(b.soft_cap == 5.0 and b.scale == pytest.approx(scale) for b in attn.backends)
    # a model whose layers all attend alike gets its one backend, unwrapped
    _, phi = hf_checkpoint("phi3")
    m = load_model(phi)
    assert isinstance(build_attention(m.spec, partial(TorchAttention, PagedRunner(m).kv_cache)), TorchAttention)


def test_triton_attention_per_layer_equals_the_reference(hf_checkpoint):
    """Gemma 2's local and global layers through the Triton paged kernels (interpreted on the
    CPU, fp32): the windowed and soft-capped schedules against the torch reference backend."""
    from toolkit.attention.triton_paged import TritonPagedAttention

    _, folder = hf_checkpoint("gemma2")
    model = load_model(folder)
    g = torch.Generator().manual_seed(4)
    tokens = {s: torch.randint(0, 211, (sum(c),), generator=g).tolist() for s, c in SCHEDULE.items()}
    want = _schedule_logits(model, tokens, PagedRunner(model, block_size=4))
    got = _schedule_logits(model, tokens, PagedRunner(model, block_size=4, backend=partial(TritonPagedAttention, impl="triton")))
    for s in tokens:
        torch.testing.assert_close(got[s], want[s], rtol=1e-4, atol=1e-4)


class MyTinyForCausalLM(LlamaForCausalLM):
    """A user's model class: Llama's layers, registered under a name of its own."""

    def __init__(self, config, **kw):
        super().__init__(config, family="llama", **kw)


def test_a_registered_model_class_serves_its_architecture(tmp_path, monkeypatch):
    from transformers import LlamaConfig

    from toolkit import registry

    monkeypatch.setitem(registry.REGISTRY, "model", dict(registry.REGISTRY["model"]))   # undone after
    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=97, max_position_embeddings=64,
                      architectures=["MyTinyForCausalLM"])
    with pytest.raises(ValueError, match="unsupported architecture.*register_model"):
        load_model(cfg, model_impl="native")       # ("auto" would run transformers' Llama)
    register_model("MyTinyForCausalLM", MyTinyForCausalLM)
    with LLM(cfg, dtype="float32", device="cpu", num_blocks=16, block_size=4) as llm:
        assert type(llm.engine.model) is MyTinyForCausalLM
        out = llm.generate([{"prompt_token_ids": [3, 4, 5]}], SamplingParams(temperature=0, max_tokens=3))
        assert len(out[0].outputs[0].token_ids) == 3
    with pytest.raises(TypeError, match="architecture must be"):
        register_model("", MyTinyForCausalLM)


def test_an_entry_point_plugin_serves_its_architecture(monkeypatch):
    """The `toolkit.models` entry-point group: an installed package's class, loaded lazily."""
    from transformers import LlamaConfig

    import toolkit.models.registry as reg

    loaded = []

    def load():
        loaded.append(1)
        return MyTinyForCausalLM

    ep = types.SimpleNamespace(name="PluginForCausalLM", load=load)
    monkeypatch.setattr(reg, "entry_points", lambda group: [ep] if group == reg.ENTRY_POINT_GROUP else [])
    assert "PluginForCausalLM" in reg.supported_architectures() and not loaded
    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=97, max_position_embeddings=64,
                      architectures=["PluginForCausalLM"])
    assert type(load_model(cfg)) is MyTinyForCausalLM and loaded == [1]


def test_unsupported_rope_and_refusals_name_what_is_valid():
    from transformers import LlamaConfig, Phi3Config

    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                      vocab_size=97, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})
    with pytest.raises(ValueError, match="'dynamic' is not supported.*supported"):
        load_model(cfg)
    phi = Phi3Config(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                     vocab_size=97, pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=64,
                     original_max_position_embeddings=32,
                     rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8,
                                      "long_factor": [1.0] * 8})
    with pytest.raises(ValueError, match="longrope"):
        load_model(phi)


@pytest.mark.gpu
@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_cuda_graphs_replay_the_new_families_as_eager_runs_them(family):
    """bf16 on the GPU, random weights: the Triton kernels per layer kind (Gemma's local and
    global layers, Phi-3's partial rotary) replayed from CUDA graphs give the eager run's
    greedy tokens, on the same batches."""
    from model_configs import new_family_config

    cfg = new_family_config(family)
    prompts = [{"prompt_token_ids": list(range(3, 3 + n))} for n in (14, 9, 30)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    got = []
    for graphs in (False, True):
        with LLM(cfg, dtype="bfloat16", device="cuda", cuda_graphs=graphs, max_num_seqs=4,
                 max_num_batched_tokens=64, gpu_memory_utilization=0.05) as llm:
            got.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
            if graphs:
                assert llm.engine.runner.graphs is not None
    assert got[0] == got[1]


class _Recording:
    """A LinearMethod of one's own: dense arithmetic that counts its calls, as a quantized or
    LoRA method would plug in (toolkit/models/layers/linear.py's protocol)."""

    def __init__(self, name: str, calls: dict) -> None:
        from toolkit.models.layers import UnquantizedLinearMethod

        self.name, self.calls, self.dense = name, calls, UnquantizedLinearMethod()

    def create_weights(self, layer, in_features, out_features, dtype, device) -> None:
        self.dense.create_weights(layer, in_features, out_features, dtype, device)

    def apply(self, layer, x, bias=None):
        self.calls[self.name] = self.calls.get(self.name, 0) + 1
        return self.dense.apply(layer, x, bias)


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_a_linear_method_plugs_into_every_linear_layer_by_name(family, hf_checkpoint):
    """load_model(linear_method=): every linear layer asks for its method by its module name,
    loads the checkpoint into it and runs it; no model file knows of the method."""
    from toolkit.models.layers import LinearMethod
    from toolkit.models.layers.linear import ColumnParallelLinear, RowParallelLinear

    hf, folder = hf_checkpoint(family)
    asked, calls = [], {}

    def method_for(name: str):
        asked.append(name)
        return _Recording(name, calls) if name.endswith(("qkv_proj", "down_proj")) else None

    model = load_model(folder, linear_method=method_for)
    linears = {n for n, mod in model.named_modules() if isinstance(mod, (ColumnParallelLinear, RowParallelLinear))}
    assert set(asked) == linears and len(asked) == len(linears)          # every one, by its own name
    assert all(isinstance(m.method, LinearMethod) for n, m in model.named_modules() if n in linears)
    tokens = {s: list(range(3, 3 + sum(c))) for s, c in SCHEDULE.items()}
    got = _schedule_logits(model, tokens, PagedRunner(model, block_size=4))
    assert set(calls) == {n for n in linears if n.endswith(("qkv_proj", "down_proj"))}
    with torch.no_grad():
        want = hf(torch.tensor([tokens["a"]])).logits[0].float()
    torch.testing.assert_close(got["a"], want, rtol=1e-4, atol=1e-4)

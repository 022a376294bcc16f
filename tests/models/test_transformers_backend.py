"""The Transformers backend: families the toolkit has no model file for, built by
transformers with the "toolkit" attention function, greedy-equal to transformers' own
generate on tiny random checkpoints through the paged cache (ragged batches, a prompt split
over two steps, decode steps beside prefill chunks); its spec, checks and refusals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from model_configs import randomize
from staggered_greedy import cpu_runner, greedy_staggered

from toolkit.models.base import LayerAttention, check_model
from toolkit.models.transformers_backend import TransformersForCausalLM, load_transformers_model

V = 211
COMMON = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=96,
              vocab_size=V, max_position_embeddings=256, bos_token_id=1, eos_token_id=None,
              pad_token_id=0)   # no EOS: transformers' generate runs the full length, as the paged side


def tiny_config(arch: str):
    """A 2-layer, hidden-64 config; each family exercises what sets it apart."""
    import transformers as tf

    kv = dict(num_key_value_heads=2)
    return {
        "llama": lambda: tf.LlamaConfig(**COMMON, **kv),                     # the sanity check
        "olmo": lambda: tf.OlmoConfig(**COMMON, **kv, clip_qkv=3.0),          # non-parametric LayerNorm, clipped qkv
        "granite": lambda: tf.GraniteConfig(**COMMON, **kv, attention_multiplier=0.2,   # scale != D^-0.5,
                                            logits_scaling=3.0, embedding_multiplier=2.0,  # logits / 3
                                            residual_multiplier=0.5),
        "gpt_neox": lambda: tf.GPTNeoXConfig(**COMMON, rotary_pct=0.5),       # fused qkv, partial rotary, parallel residual
        "cohere": lambda: tf.CohereConfig(**COMMON, **kv, logit_scale=0.5),   # parallel block, logits x 0.5, tied
        "starcoder2": lambda: tf.Starcoder2Config(**COMMON, **kv, sliding_window=5),  # window < prompts, biases
        "helium": lambda: tf.HeliumConfig(**COMMON, **kv, head_dim=16),
        "phi": lambda: tf.PhiConfig(**COMMON, partial_rotary_factor=0.5),     # lm_head bias, partial rotary
        "gemma2": lambda: tf.Gemma2Config(**COMMON, **kv, head_dim=16, sliding_window=5,  # sliding / full layers,
                                          query_pre_attn_scalar=24, attn_logit_softcapping=20.0,  # both soft caps,
                                          final_logit_softcapping=15.0),      # scale 24^-0.5
        "olmo2": lambda: tf.Olmo2Config(**COMMON, **kv),                     # q/k norm over all heads
        "glm": lambda: tf.GlmConfig(**COMMON, **kv, head_dim=16),            # interleaved partial rotary
        "smollm3": lambda: tf.SmolLM3Config(**COMMON, **kv, no_rope_layers=[1, 0]),  # a layer without rotary
        "exaone4": lambda: tf.Exaone4Config(**COMMON, **kv, sliding_window=5,  # every module holds the
                                            layer_types=["sliding_attention", "full_attention"]),  # window
    }[arch]()


ARCHS = ["llama", "olmo", "granite", "gpt_neox", "cohere", "starcoder2", "helium", "phi", "gemma2",
         "olmo2", "glm", "smollm3", "exaone4"]
# ragged: longer than the window (5) and the chunk (6), so prompt 0 is split over two steps
PROMPTS = [[5, 17, 99, 3, 41, 8, 150, 23, 77, 9, 61], [4, 88, 12, 190, 33], [7, 7, 120, 56, 2, 91, 18, 200]]
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[torch.nn.Module, Path]]:
    """arch -> (transformers' own model with its default attention, the folder it saved)."""
    made: dict[str, tuple[torch.nn.Module, Path]] = {}

    def get(arch: str) -> tuple[torch.nn.Module, Path]:
        if arch not in made:
            from transformers import AutoModelForCausalLM

            torch.manual_seed(0)
            hf = AutoModelForCausalLM.from_config(tiny_config(arch), dtype=torch.float32).eval()
            randomize(hf)
            folder = tmp_path_factory.mktemp(arch)
            hf.save_pretrained(folder)
            made[arch] = (hf, folder)
        return made[arch]

    return get


def hf_greedy(hf: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_transformers(arch: str, checkpoint) -> None:
    hf, folder = checkpoint(arch)
    model = load_transformers_model(folder)
    check_model(model)
    want = [hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]
    assert all(len(w) == NEW_TOKENS for w in want)
    got = greedy_staggered(model, PROMPTS, NEW_TOKENS, chunk=6)
    assert got == want


@pytest.mark.parametrize("arch", ["gemma2", "granite", "cohere"])
def test_logits_match_transformers(arch: str, checkpoint) -> None:
    """One prefill step of two sequences: each one's last-token logits (with the family's
    logit scaling / soft cap) close to transformers' for the same prompt alone."""
    hf, folder = checkpoint(arch)
    model = load_transformers_model(folder)
    runner = cpu_runner(model)
    got = runner.step([[], []], PROMPTS[:2], [0, 0], last_only=True)      # [2, V]
    with torch.no_grad():
        want = torch.stack([hf(torch.tensor([p])).logits[0, -1] for p in PROMPTS[:2]])
    torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-4)
    hidden = torch.randn(3, model.spec.hidden_size)
    out = torch.full((3, V), float("nan"))
    assert model.compute_logits(hidden, out=out) is out              # the LM-head graphs' path
    torch.testing.assert_close(out, model.compute_logits(hidden))
    with pytest.raises(ValueError, match="out must be a contiguous float32"):
        model.compute_logits(hidden, out=torch.empty(3, V, dtype=torch.float16))


def test_spec_layers_from_the_modules() -> None:
    g2 = TransformersForCausalLM(tiny_config("gemma2")).spec
    assert g2.layers == (LayerAttention("sliding", 5, 20.0, 24 ** -0.5),
                         LayerAttention("full", None, 20.0, 24 ** -0.5))
    assert (g2.num_heads, g2.num_kv_heads, g2.head_dim, g2.vocab_size) == (4, 2, 16, V)
    assert TransformersForCausalLM(tiny_config("granite")).spec.layers[1].scale == pytest.approx(0.2)
    ex4 = TransformersForCausalLM(tiny_config("exaone4")).spec      # layer_types decide the kind
    assert [(la.kind, la.window) for la in ex4.layers] == [("sliding", 5), ("full", None)]
    sc2 = TransformersForCausalLM(tiny_config("starcoder2")).spec
    assert {la.window for la in sc2.layers} == {5}
    neox = TransformersForCausalLM(tiny_config("gpt_neox")).spec
    assert (neox.num_kv_heads, neox.head_dim) == (4, 16) and neox.layer(0).kind == "full"
    assert neox.eos_token_ids == ()
    import transformers as tf

    with_eos = tf.GPTNeoXConfig(**{**COMMON, "eos_token_id": [2, 5]})
    assert TransformersForCausalLM(with_eos).spec.eos_token_ids == (2, 5)


@pytest.mark.parametrize("field, value, message", [
    ("soft_cap", None, "soft_cap=20.0"), ("window", None, "sliding_window=5"),
    ("scale", 0.25, "scale=")])
def test_spec_disagreeing_with_the_modules_is_refused(field: str, value, message: str) -> None:
    """spec.layers is what the engine builds each layer's backend from; a spec that says
    otherwise than what transformers asks the attention for fails the forward."""
    model = TransformersForCausalLM(tiny_config("gemma2"))
    layer0 = model.spec.layers[0]
    kind = "full" if field == "window" else layer0.kind
    bad = LayerAttention(**{**layer0.__dict__, field: value, "kind": kind})
    model.spec = type(model.spec)(**{**model.spec.__dict__, "layers": (bad, model.spec.layers[1])})
    runner = cpu_runner(model)
    with pytest.raises(ValueError, match=message):
        runner.step([[]], [PROMPTS[1]], [0])


def test_the_backend_reaches_attention_only_through_forward() -> None:
    """No global: transformers' module called without TransformersForCausalLM.forward's
    per-call context is refused, and two models keep their own backends."""
    a, b = (TransformersForCausalLM(tiny_config("llama")) for _ in range(2))
    with pytest.raises(ValueError, match="without a toolkit_step= StepContext"):
        a.hf.base_model(input_ids=torch.tensor([PROMPTS[1]]), use_cache=False)
    ra, rb = cpu_runner(a), cpu_runner(b)
    ra.step([[]], [PROMPTS[1]], [0])
    rb.step([[]], [PROMPTS[2]], [0])
    written = lambda r: int((~r.kv_cache.layers[0][0].isnan()).any(-1).any(-1).sum())   # K slots written
    assert (written(ra), written(rb)) == (len(PROMPTS[1]), len(PROMPTS[2]))


@pytest.mark.parametrize("arch, cls", [("stablelm", "StableLmForCausalLM"), ("bloom", "BloomForCausalLM")])
def test_families_outside_the_attention_interface_are_refused(arch: str, cls: str) -> None:
    import transformers as tf

    config = {"stablelm": lambda: tf.StableLmConfig(hidden_size=64, num_attention_heads=4,
                                                    num_hidden_layers=2, vocab_size=V),
              "bloom": lambda: tf.BloomConfig(hidden_size=64, n_head=4, n_layer=2, vocab_size=V)}[arch]()
    with pytest.raises(ValueError, match=f"{cls}.*attention-function interface"):
        TransformersForCausalLM(config)


def test_random_weights_and_loading_checks(tmp_path: Path) -> None:
    config = tiny_config("phi")
    model = load_transformers_model(config)
    assert config._attn_implementation != "toolkit"        # the caller's config is left alone
    for name, p in model.hf.named_parameters():
        if "layernorm" in name:
            assert torch.all(p == (1.0 if name.endswith("weight") else 0.0)), name
        elif name.endswith("bias"):
            assert torch.all(p == 0), name
        else:
            assert 0.015 < float(p.std()) < 0.025, name
    again = load_transformers_model(config)
    assert all(torch.equal(a, b) for a, b in zip(model.hf.parameters(), again.hf.parameters()))
    gemma = load_transformers_model(tiny_config("gemma2")).hf   # "1 + weight" norms: neutral 0
    assert all(torch.all(p == 0) for n, p in gemma.named_parameters() if "norm" in n)
    logits = cpu_runner(model).step([[]], [PROMPTS[0]], [0], last_only=True)
    assert logits.shape == (1, V) and torch.isfinite(logits).all()
    state = model.hf.state_dict()
    loaded = model.load_weights(state.items())
    assert {n for n, _ in loaded} == set(model.expected_weights())
    with pytest.raises(ValueError, match="'model.nope.weight' has no place"):
        model.load_weights([("model.nope.weight", torch.zeros(3))])
    with pytest.raises(ValueError, match="shape mismatch for 'lm_head.weight'"):
        model.load_weights([("lm_head.weight", torch.zeros(3, 64))])
    folder = tmp_path / "partial"
    folder.mkdir()
    (folder / "config.json").write_text(config.to_json_string())
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items() if not k.startswith("lm_head")},
              str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="lacks 2 tensor.*lm_head"):
        load_transformers_model(folder)


@pytest.mark.parametrize("arch", ["gemma2", "gpt_neox"])
def test_llm_greedy_equals_transformers(arch: str, checkpoint) -> None:
    """Through toolkit.LLM with the model instance: chunked prefill (8 tokens a step), a KV
    pool of 9 blocks of 4 for three sequences that need 13 (preemption by recompute)."""
    from toolkit import LLM, SamplingParams

    hf, folder = checkpoint(arch)
    model = load_transformers_model(folder)
    want = [hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]
    with LLM(model, dtype="float32", device="cpu", block_size=4, num_blocks=9,
             max_num_batched_tokens=8) as llm:
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0),
                            use_tqdm=False)
        assert llm.engine.num_preemptions > 0
    assert [list(o.outputs[0].token_ids) for o in outs] == want


def test_tensors_needing_a_converter_and_tensor_parallel_groups_are_refused(tmp_path: Path) -> None:
    """Mixtral's checkpoint stores each expert apart; transformers fuses them on load (a
    WeightConverter), which load_weights does not do: refused by name, not loaded wrong."""
    import types

    import transformers as tf

    config = tf.MixtralConfig(**{**COMMON, "num_key_value_heads": 2}, num_local_experts=2,
                              num_experts_per_tok=1)
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"experts\.0\.w1\.weight' needs transformers' WeightConverter"):
        load_transformers_model(tmp_path)
    with pytest.raises(ValueError, match="runs on one rank; got a tensor-parallel group of 2"):
        load_transformers_model(tiny_config("llama"), group=types.SimpleNamespace(size=2))


def test_layers_without_attention_are_refused() -> None:
    """A flattened batch without a transformers cache carries no recurrent or convolution
    state: hybrid families are refused, by their layer types or their missing attention."""
    import transformers as tf

    small = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                 vocab_size=V, intermediate_size=96)
    hybrid = tf.GraniteMoeHybridConfig(**small, layer_types=["mamba", "attention"], mamba_d_head=16,
                                       mamba_n_heads=8)
    with pytest.raises(ValueError, match="layer type 'linear_attention' is not supported"):
        TransformersForCausalLM(hybrid)
    lfm2 = tf.Lfm2Config(**small, full_attn_idxs=[1])             # layer 0: a short convolution
    with pytest.raises(ValueError, match="layer type 'conv' is not supported"):
        TransformersForCausalLM(lfm2)
    from toolkit.models.transformers.spec import attention_modules

    class ToyAttention(torch.nn.Module):
        layer_idx = 1

    with pytest.raises(ValueError, match=r"decoder layers \[0\] have no attention module"):
        attention_modules(torch.nn.Sequential(torch.nn.Conv1d(2, 2, 3), ToyAttention()), 2)


def test_composite_configs_are_refused() -> None:
    import transformers as tf

    with pytest.raises(ValueError, match="composite .*Gemma3TextConfig"):
        TransformersForCausalLM(tf.Gemma3Config(text_config=dict(COMMON, head_dim=16)))


def test_the_class_config_architectures_names() -> None:
    import transformers as tf

    from toolkit.models.transformers_backend import transformers_class

    assert transformers_class(tf.LlamaConfig(**COMMON, architectures=["LlamaForCausalLM"])) is tf.LlamaForCausalLM
    assert transformers_class(tf.GPTNeoXConfig(**COMMON)) is tf.GPTNeoXForCausalLM   # no architectures
    with pytest.raises(ValueError, match="names FalconForCausalLM, whose config is FalconConfig"):
        transformers_class(tf.LlamaConfig(**COMMON, architectures=["FalconForCausalLM"]))
    with pytest.raises(ValueError, match="FalconForCausalLM .*attention-function interface"):
        transformers_class(tf.FalconConfig(**COMMON))


def test_attention_calls_the_backends_cannot_serve_are_refused() -> None:
    from toolkit.models.transformers.attention import StepContext, toolkit_attention_forward

    model = TransformersForCausalLM(tiny_config("llama"))
    module = model.hf.model.layers[0].self_attn
    step = StepContext(backend=cpu_runner(model).attention, layers=model.spec.layers)
    q, kv = torch.zeros(1, 4, 3, 16), torch.zeros(1, 2, 3, 16)
    with pytest.raises(ValueError, match="'s_aux' \\(attention sinks"):
        toolkit_attention_forward(module, q, kv, kv, None, scaling=0.25, s_aux=torch.zeros(4),
                                  toolkit_step=step)
    with pytest.raises(ValueError, match="dropout 0.1 is a training feature"):
        toolkit_attention_forward(module, q, kv, kv, None, dropout=0.1, toolkit_step=step)
    with pytest.raises(ValueError, match="one flattened batch"):
        toolkit_attention_forward(module, q.expand(2, -1, -1, -1), kv, kv, None, toolkit_step=step)


def test_model_impl_picks_the_backend(checkpoint) -> None:
    """load_model(model_impl=): "auto" runs OLMo (no native file) on the Transformers backend
    and Llama natively; "transformers" forces it; "native" refuses OLMo by name; LLM(folder,
    model_impl=) reaches it."""
    from toolkit import LLM, SamplingParams
    from toolkit.models import load_model

    _, olmo = checkpoint("olmo")
    hf, llama = checkpoint("llama")
    assert isinstance(load_model(olmo), TransformersForCausalLM)
    assert not isinstance(load_model(llama), TransformersForCausalLM)
    assert isinstance(load_model(llama, model_impl="transformers"), TransformersForCausalLM)
    with pytest.raises(ValueError, match="unsupported architecture.*OlmoForCausalLM"):
        load_model(olmo, model_impl="native")
    with LLM(str(llama), dtype="float32", device="cpu", block_size=4, model_impl="transformers") as llm:
        assert isinstance(llm.engine.model, TransformersForCausalLM)
        out = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0),
                           use_tqdm=False)
    assert list(out[0].outputs[0].token_ids) == hf_greedy(hf, PROMPTS[0], NEW_TOKENS)

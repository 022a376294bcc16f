"""Tensor parallelism (toolkit/parallel/): the layers' shards against the unsharded layers
(ranks as threads over a real gloo group), each rank's weights against the TP=1 model's
(random init and a Hugging Face folder read by slices), LLM(tensor_parallel_size=2) over gloo
processes against tensor_parallel_size=1, a killed worker, the validation errors."""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings, strategies as st
from transformers import LlamaConfig

from toolkit import LLM, SamplingParams
from toolkit.models import load_model
from toolkit.parallel.executor import WorkerDiedError, check_attention_spec, check_devices
from toolkit.parallel.group import Group
from toolkit.models.layers import RowParallelLinear, VocabParallelEmbedding, qkv
from toolkit.models.layers.linear import ColumnParallelLinear
from toolkit.models.layers.parallel import even_slice, head_slice
from toolkit.models.ops import model_ops
from toolkit.parallel.sharding import check_tensor_parallel

# ---------------------------------------------------------------- ranks as threads


@pytest.fixture(scope="module")
def groups() -> dict[int, list[Group]]:
    """Real gloo groups of 2 and 3 ranks in this process (one thread per rank)."""
    made = {}
    for size in (2, 3):
        store = dist.HashStore()
        out: list = [None] * size

        def join(r: int) -> None:
            pg = dist.ProcessGroupGloo(dist.PrefixStore(f"g{size}", store), r, size,
                                       datetime.timedelta(seconds=60))
            out[r] = Group(pg, r, size, "gloo")

        _threads(size, join)
        made[size] = out
    return made


def _threads(size: int, fn) -> list:
    """fn(rank) on `size` threads at once (collectives meet); results in rank order."""
    results: list = [None] * size
    errors: list = []

    def run(r: int) -> None:
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    ts = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts), "a rank hung"
    if errors:
        raise errors[0]
    return results


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@settings(max_examples=6)
@given(size=st.sampled_from([2, 3]), heads=st.sampled_from([1, 3, 6]), kv=st.sampled_from([1, 3]),
       d=st.integers(1, 5), n_in=st.integers(1, 9), t=st.integers(1, 5), bias=st.booleans())
def test_column_parallel_qkv_matches_full(groups, size, heads, kv, d, n_in, t, bias) -> None:
    """Each rank's merged q/k/v output equals its heads' columns of the full layer's output
    (KV heads split, or replicated when fewer than ranks)."""
    if heads % size or heads % kv or (kv % size and size % kv):
        return
    g = torch.Generator().manual_seed(heads * 100 + kv * 10 + size)
    rows = [heads * d, kv * d, kv * d]
    w, b = torch.randn(sum(rows), n_in, generator=g), torch.randn(sum(rows), generator=g)
    x = torch.randn(t, n_in, generator=g)
    full = x @ w.T + (b if bias else 0)                                       # [T, (H+2Hkv)*D]
    q_full, k_full, v_full = full.split(rows, dim=1)

    def rank(r: int):
        layer = qkv(n_in, d, heads, kv, bias, dtype=torch.float32, device="cpu", group=groups[size][r])
        for sid, wp, bp in zip("qkv", w.split(rows), b.split(rows)):
            layer.weight_loader(layer.weight, wp, sid)
            if bias:
                layer.weight_loader(layer.bias, bp, sid)
        parts = [(rows[0], head_slice(heads, d, r, size)), (rows[1], head_slice(kv, d, r, size)),
                 (rows[2], head_slice(kv, d, r, size))]
        assert [s for _, s in layer.parts.values()] == [s for _, s in parts]
        return layer(x), parts

    for out, parts in _threads(size, rank):
        q, k, v = out.split([s.size for _, s in parts], dim=1)
        _close(q, parts[0][1].of(q_full, 1))
        _close(k, parts[1][1].of(k_full, 1))
        _close(v, parts[2][1].of(v_full, 1))


@settings(max_examples=6)
@given(size=st.sampled_from([2, 3]), per=st.integers(1, 5), n_out=st.integers(1, 7), t=st.integers(1, 4),
       bias=st.booleans())
def test_row_parallel_matches_full(groups, size, per, n_out, t, bias) -> None:
    """The all-reduced sum of the ranks' column blocks (bias added once) is the full layer."""
    n_in = per * size
    g = torch.Generator().manual_seed(per * 31 + n_out)
    w, b, x = torch.randn(n_out, n_in, generator=g), torch.randn(n_out, generator=g), torch.randn(t, n_in, generator=g)
    full = x @ w.T + (b if bias else 0)

    def rank(r: int):
        cols = even_slice(n_in, r, size)
        layer = RowParallelLinear(n_in, n_out, bias, dtype=torch.float32, device="cpu", group=groups[size][r])
        assert layer.cols == cols
        layer.weight_loader(layer.weight, w)
        if bias:
            layer.weight_loader(layer.bias, b)
        return layer(cols.of(x, 1))

    for out in _threads(size, rank):
        _close(out, full)


@settings(max_examples=6)
@given(size=st.sampled_from([2, 3]), vocab=st.integers(2, 23), hidden=st.integers(1, 6), t=st.integers(1, 9))
def test_vocab_parallel_embedding_and_logits_match_full(groups, size, vocab, hidden, t) -> None:
    """Embedding rows of a vocabulary that does not divide (padding rows zero), all-reduced;
    the LM head's parts gathered on rank 0 are the full logits, the padding dropped."""
    g = torch.Generator().manual_seed(vocab * 7 + hidden)
    table = torch.randn(vocab, hidden, generator=g)
    ids = torch.randint(0, vocab, (t,), generator=g)
    h = torch.randn(t, hidden, generator=g)

    def rank(r: int):
        emb = VocabParallelEmbedding(vocab, hidden, dtype=torch.float32, device="cpu", group=groups[size][r])
        emb.weight.data.fill_(float("nan"))                     # poisoned: padding must be written
        emb.weight_loader(emb.weight, table)
        assert not emb.weight[emb.rows.size:].any()            # padding rows are zero
        return emb(ids), emb.logits(h, model_ops("cpu", "torch").lm_head_logits)

    outs = _threads(size, rank)
    for r, (x, logits) in enumerate(outs):
        _close(x, table[ids])
        assert (logits is None) == (r != 0)
    _close(outs[0][1], h @ table.T)


# ---------------------------------------------------------------- weights of each rank

def _replicated_kv_config() -> LlamaConfig:
    """One KV head for two ranks: replicated."""
    return LlamaConfig(hidden_size=48, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=1, vocab_size=101, max_position_embeddings=64,
                       tie_word_embeddings=False)


def _rank_part(module, pname: str, full: torch.Tensor) -> torch.Tensor:
    """The slice of the TP=1 parameter `full` a rank's layer holds, computed from the layer's
    partition (independently of its loader)."""
    if isinstance(module, ColumnParallelLinear):
        pieces, offset = [], 0
        for rows, sl in module.parts.values():
            pieces.append(full[offset + sl.start: offset + sl.start + sl.size])
            offset += rows
        return torch.cat(pieces)
    if isinstance(module, RowParallelLinear):
        return module.cols.of(full, 1) if pname == "weight" else full
    if isinstance(module, VocabParallelEmbedding):
        part = module.rows.of(full, 0)
        pad = module.weight.shape[0] - part.shape[0]
        return torch.cat([part, part.new_zeros(pad, *part.shape[1:])]) if pad else part
    return full


def _check_shards(full, shards) -> None:
    """Every parameter of every rank is that rank's slice of the TP=1 model's parameter."""
    ref = dict(full.named_parameters())
    for m in shards:
        for name, p in m.named_parameters():
            mod_name, pname = name.rsplit(".", 1)
            want = _rank_part(m.get_submodule(mod_name), pname, ref[name].data)
            torch.testing.assert_close(p.data, want, rtol=0, atol=0, msg=f"rank {m.group.rank}: {name}")


def _family(family: str):
    """Tiny configs (as tests/models/conftest.py's): biases + tied embeddings, q/k norms +
    explicit head_dim, one KV head replicated on both ranks."""
    import transformers as tf

    common = dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2, vocab_size=517,
                  num_hidden_layers=2, intermediate_size=160, max_position_embeddings=512)
    if family == "llama_bias_tied":
        return tf.LlamaConfig(**common, attention_bias=True, mlp_bias=True, tie_word_embeddings=True)
    if family == "qwen3":
        return tf.Qwen3Config(**common, head_dim=24, tie_word_embeddings=False)
    return _replicated_kv_config()


@pytest.mark.parametrize("family", ["llama_bias_tied", "qwen3", "replicated_kv"])
def test_random_shards_are_slices_of_the_tp1_random_model(family) -> None:
    cfg = _family(family)
    full = load_model(cfg)
    shards = []
    for r in range(2):
        m = load_model(cfg, group=Group(None, r, 2, "none"))   # loading needs no collective
        shards.append(m)
    _check_shards(full, shards)


def test_folder_shards_are_slices_of_the_checkpoint(tiny_llama_dir) -> None:
    """Each rank reads only its slices (safetensors get_slice) of the saved checkpoint."""
    full = load_model(tiny_llama_dir)
    shards = []
    for r in range(2):
        m = load_model(tiny_llama_dir, group=Group(None, r, 2, "none"))   # slice handles
        shards.append(m)
    _check_shards(full, shards)


# ---------------------------------------------------------------- validation

def test_validation_errors(tiny_llama_dir) -> None:
    cfg = _replicated_kv_config()
    with pytest.raises(ValueError, match="must divide num_attention_heads"):
        check_tensor_parallel(cfg, 3)
    with pytest.raises(ValueError, match=r"valid sizes for this model: \[1, 2\]"):
        LLM(tiny_llama_dir, tensor_parallel_size=4)                 # 6 heads; refused before any spawn
    with pytest.raises(ValueError, match="needs 4 GPUs"):
        check_devices(4, "cuda", 2)
    check_devices(2, "cuda", 2)
    with pytest.raises(ValueError, match="'cuda'"):
        check_devices(2, "cuda:1", 2)
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        LLM(cfg, tensor_parallel_size=0)
    with pytest.raises(TypeError, match="tensor_parallel_size must be an integer"):
        LLM(cfg, tensor_parallel_size="2")
    with pytest.raises(ValueError, match="draft"):
        LLM(cfg, tensor_parallel_size=2, speculative="draft", num_speculative_tokens=2)
    with pytest.raises(ValueError, match="instance"):
        check_attention_spec(object())
    check_attention_spec("cpu")
    with pytest.raises(ValueError, match="folder or a\\s+transformers config"):
        LLM(load_model(cfg), tensor_parallel_size=2)


# ---------------------------------------------------------------- the engine over 2 processes

PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 60)), [3] * 20, [7, 1, 7, 1]]
OPTS = dict(num_blocks=48, block_size=8, max_num_batched_tokens=32, max_num_seqs=8)   # 50 tokens: chunked


@pytest.fixture(scope="module")
def tp2(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, tensor_parallel_size=2, **OPTS)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def tp1(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, **OPTS)
    yield llm
    llm.close()


def _tokens(outs) -> list[list[list[int]]]:
    return [[list(c.token_ids) for c in o.outputs] for o in outs]


def test_tp2_greedy_equals_tp1(tp1, tp2) -> None:
    """Greedy fp32 tokens equal, incl. a prompt prefilled in two chunks, n=2 (fork +
    copy-on-write on every rank) and a second pass that hits the prefix cache; logprobs close."""
    sp = [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2),
          SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
          SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, n=2),
          SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=1)]
    for _ in range(2):                                   # the second pass: prefix-cache hits
        want, got = tp1.generate(PROMPTS, sp, use_tqdm=False), tp2.generate(PROMPTS, sp, use_tqdm=False)
        assert _tokens(got) == _tokens(want)
        for a, b in zip(want[0].outputs[0].logprobs, got[0].outputs[0].logprobs):
            assert a.keys() == b.keys()
            assert all(abs(a[k] - b[k]) < 1e-4 for k in a)
        pa, pb = want[3].prompt_logprobs, got[3].prompt_logprobs
        assert len(pa) == len(pb) and all(
            x is None and y is None or all(abs(x[k] - y[k]) < 1e-4 for k in x) for x, y in zip(pa, pb))
    assert tp2.engine.scheduler.kv.num_cached_blocks() > 0
    # the shards hold what the TP=1 model holds (the executor's call runs on every rank)
    heads = tp2.engine.runner.executor.call(_kv_heads)
    assert heads == [1, 1]                               # 2 KV heads over 2 ranks


def _kv_heads(shard) -> int:
    return shard.kv_cache.num_kv_heads


def _fails_on_rank0_before_a_collective(shard) -> None:
    if shard.model.group.rank == 0:
        raise MemoryError("rank 0 ran out before the all-reduce")
    shard.model.group.all_reduce(torch.zeros(1))


def test_call_failing_on_rank0_before_a_collective_stops_the_workers(tiny_llama_dir, monkeypatch) -> None:
    """The workers wait in an all-reduce rank 0 never joins: call() does not wait its whole
    timeout for their replies; the executor fails (the ranks are out of step) and says so."""
    llm = LLM(tiny_llama_dir, tensor_parallel_size=2, **OPTS)
    ex = llm.engine.runner.executor
    monkeypatch.setattr(ex, "stray_reply_s", 2.0)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="out of step") as info:
        ex.call(_fails_on_rank0_before_a_collective)
    assert isinstance(info.value.__cause__, MemoryError) and time.monotonic() - t0 < 20
    with pytest.raises(RuntimeError, match="out of step"):
        ex.call(_kv_heads)
    llm.close()


def _generate_in_thread(llm, prompts, sp, timeout: float):
    """generate on a thread; (exception or None, seconds); fails instead of hanging."""
    box: dict = {}

    def run() -> None:
        try:
            llm.generate(prompts, sp, use_tqdm=False)
        except BaseException as e:  # noqa: BLE001 - inspected by the test
            box["error"] = e

    t0 = time.monotonic()
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), f"generate still running {timeout} s after a worker was killed (hang)"
    return box.get("error"), time.monotonic() - t0


def test_worker_killed_during_generate_raises(tiny_llama_dir) -> None:
    llm = LLM(tiny_llama_dir, tensor_parallel_size=2, **OPTS)
    pid = llm.engine.runner.executor.procs[0].pid
    started = threading.Event()
    llm.engine.add_observer(lambda rec: started.set())
    killer = threading.Thread(target=lambda: (started.wait(60), time.sleep(0.05), os.kill(pid, signal.SIGKILL)))
    killer.start()
    err, _ = _generate_in_thread(llm, PROMPTS, SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True), 60)
    killer.join()
    assert isinstance(err, WorkerDiedError), err
    assert "rank 1" in str(err) and "SIGKILL" in str(err)
    assert not llm.engine.has_unfinished()              # generate aborted what it queued
    t0 = time.monotonic()
    llm.close()
    assert time.monotonic() - t0 < 15


def test_worker_killed_while_idle_raises(tp2) -> None:
    """Last test on the shared engine: a worker killed between calls; the next generate
    names it at once, and close() ends the rest."""
    proc = tp2.engine.runner.executor.procs[0]
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    err, took = _generate_in_thread(tp2, [[1, 2, 3]], SamplingParams(max_tokens=3), 30)
    assert isinstance(err, WorkerDiedError) and "rank 1" in str(err) and "exit code -9" in str(err), err
    assert took < 10
    with pytest.raises(WorkerDiedError):                 # stays failed, never hangs
        tp2.generate([[1, 2, 3]], SamplingParams(max_tokens=3), use_tqdm=False)


@pytest.mark.gpu
def test_tp2_cuda_graphs_nccl_equals_tp1(tiny_llama_dir) -> None:
    """On 2 GPUs: NCCL, the all-reduces inside the CUDA graphs, fp32 greedy = TP=1."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    opts = dict(dtype="float32", num_blocks=256, block_size=16, max_num_seqs=8)
    with LLM(tiny_llama_dir, **opts) as a:
        want = _tokens(a.generate(PROMPTS, sp, use_tqdm=False))
    with LLM(tiny_llama_dir, tensor_parallel_size=2, **opts) as b:
        assert b.engine.runner.graphs is not None and b.engine.runner.executor.group.backend == "nccl"
        assert _tokens(b.generate(PROMPTS, sp, use_tqdm=False)) == want
        assert b.engine.runner.graphs.graphs                 # steps replayed graphs


@pytest.mark.gpu
def test_tp2_nccl_worker_killed_during_generate_raises(tiny_llama_dir) -> None:
    """On 2 GPUs: a worker killed mid-generate; the monitor aborts the NCCL communicator, so
    rank 0 is not left in a collective: generate raises WorkerDiedError, close() returns."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    llm = LLM(tiny_llama_dir, tensor_parallel_size=2, dtype="float32", num_blocks=256, max_num_seqs=8)
    pid = llm.engine.runner.executor.procs[0].pid
    started = threading.Event()
    llm.engine.add_observer(lambda rec: started.set())
    killer = threading.Thread(target=lambda: (started.wait(60), time.sleep(0.2), os.kill(pid, signal.SIGKILL)))
    killer.start()
    err, _ = _generate_in_thread(llm, PROMPTS, SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True), 120)
    killer.join()
    assert isinstance(err, WorkerDiedError) and "rank 1" in str(err), err
    llm.close()

"""The roofline of a decode step, kernel kind by kernel kind (#21's first target).

The floor of one op is max(bytes it must move / copy bandwidth, FLOPs / matmul peak), both
measured in the same process; a step's floor is the sum over its ops (each GEMM of each layer
on its own, so a compute-bound LM head does not hide a bandwidth-bound projection). Each op
moves at least its inputs and outputs once: the weights, the activations in and out, the KV
of every visible token. The profiler's kernels are put in the same kinds by name, so the
table says which kind of kernel is how far from its floor:

    gemm        the projections and the LM head (cuBLAS; its split-K reduce counted here)
    attention   paged attention and the split merge: KV of every visible token, q, out
    norm        RMSNorm (+ residual) twice a layer and the final norm
    rotary      rotary of q and k (with Qwen3's per-head norms: `qk_norm_rotary`)
    kv_write    this step's K/V into the cache
    activation  SiLU-and-mul
    other       sampling, embedding, copies and the rest (floor: the logits read once)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Geometry:
    """The shape numbers a floor needs, from a Hugging Face config."""
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    num_layers: int
    vocab_size: int

    @classmethod
    def of(cls, config: Any) -> "Geometry":
        heads = config.num_attention_heads
        return cls(config.hidden_size, heads, getattr(config, "num_key_value_heads", None) or heads,
                   getattr(config, "head_dim", None) or config.hidden_size // heads,
                   config.intermediate_size, config.num_hidden_layers, config.vocab_size)

KINDS = ("gemm", "attention", "norm", "rotary", "kv_write", "activation", "other")
_NAMES = (("gemm", ("nvjet", "gemm", "cutlass", "splitkreduce", "xmma", "cublas")),
          ("attention", ("_paged_attention_kernel", "_merge_attention_states_kernel", "_self_attention_kernel")),
          ("norm", ("_rms_norm_kernel",)),
          ("rotary", ("_rotary_kernel",)),
          ("kv_write", ("_write_kv_kernel",)),
          ("activation", ("_silu_and_mul_kernel",)))


def kind_of(kernel_name: str) -> str:
    """The kind (KINDS) of a profiler kernel name."""
    low = kernel_name.lower()
    for kind, keys in _NAMES:
        if any(k in low for k in keys):
            return kind
    return "other"


def step_work(g: Any, chunks: list[tuple[int, int]], num_sampled: int | None = None,
              act_bytes: int = 2, kv_bytes: int = 2) -> dict[str, list[tuple[float, float]]]:
    """{kind: [(bytes, flops) of each op]} of one step that runs `chunks` [(start, n)]: n new
    tokens of a sequence whose first `start` tokens are in the cache (a decode row is (context
    - 1, 1); a prompt's chunk after a cached prefix has start > 0). Each chunk reads its whole
    context's KV once and attends causally; the LM head runs for the num_sampled rows (default:
    one a chunk). `g` is the model's Geometry (hidden, num_heads, num_kv_heads, head_dim,
    intermediate, num_layers, vocab_size)."""
    t, b = sum(n for _, n in chunks), act_bytes
    rows = len(chunks) if num_sampled is None else num_sampled
    q, kv, hid, inter = g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim, g.hidden, g.intermediate
    ctx = float(sum(s + n for s, n in chunks))                 # KV read: every visible token once
    pairs = float(sum(n * s + n * (n + 1) / 2 for s, n in chunks))   # causal query-key pairs

    def gemm(n_in: int, n_out: int, m: int = t) -> tuple[float, float]:   # weights + activations in and out
        return (n_in * n_out * b + m * (n_in + n_out) * b, 2.0 * m * n_in * n_out)

    layer = {
        "gemm": [gemm(hid, q + 2 * kv), gemm(q, hid), gemm(hid, 2 * inter), gemm(inter, hid)],
        "attention": [(ctx * kv * 2 * kv_bytes + t * q * b * 2, 4.0 * pairs * q)],
        "norm": [(4.0 * t * hid * b, 0.0)] * 2,                   # x, residual in; out, residual out
        "rotary": [(2.0 * t * (q + kv) * b, 0.0)],                # q, k in and out
        "kv_write": [(t * kv * 2 * (b + kv_bytes), 0.0)],         # k, v in; the cache's slots out
        "activation": [(3.0 * t * inter * b, 0.0)],               # gate | up in, out
    }
    work = {k: v * g.num_layers for k, v in layer.items()}
    work["gemm"] = work["gemm"] + [gemm(hid, g.vocab_size, rows)]   # the LM head
    work["norm"] = work["norm"] + [(3.0 * rows * hid * b, 0.0)]    # the final norm
    work["other"] = [(rows * g.vocab_size * 4.0 + 2.0 * t * hid * b, 0.0)]   # fp32 logits read, embedding
    return work


def decode_step_work(g: Any, context_lens: list[int], act_bytes: int = 2,
                     kv_bytes: int = 2) -> dict[str, list[tuple[float, float]]]:
    """step_work of one decode step: one new token for each sequence, whose context (this
    token included) is context_lens[i]."""
    return step_work(g, [(c - 1, 1) for c in context_lens], act_bytes=act_bytes, kv_bytes=kv_bytes)


def floor_ms(ops: list[tuple[float, float]], copy_bw: float, matmul_flops: float) -> float:
    """Sum over ops of max(bytes / copy_bw, flops / matmul_flops), in ms (bw in bytes/s, FLOP/s)."""
    return 1e3 * sum(max(nbytes / copy_bw, flops / matmul_flops) for nbytes, flops in ops)


def roofline_table(kernels: dict[str, list[float]], work: dict[str, list[tuple[float, float]]],
                   copy_bw: float, matmul_flops: float) -> list[dict]:
    """Rows per kind and a total: measured ms and launches (kernels: {name: [launches, ms]} per
    step, as benchmarks.engine_core.gpu_busy_ms fills it), floor ms, measured / floor."""
    rows = []
    for kind in KINDS:
        mine = [v for name, v in kernels.items() if kind_of(name) == kind]
        ms, n = sum(v[1] for v in mine), sum(v[0] for v in mine)
        fl = floor_ms(work.get(kind, []), copy_bw, matmul_flops)
        rows.append(dict(kind=kind, measured_ms=ms, launches=n, floor_ms=fl,
                         ratio=ms / fl if fl > 0 else float("inf")))
    ms, fl = sum(r["measured_ms"] for r in rows), sum(r["floor_ms"] for r in rows)
    rows.append(dict(kind="total", measured_ms=ms, launches=sum(r["launches"] for r in rows),
                     floor_ms=fl, ratio=ms / fl))
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"  {'kind':<11s} {'measured ms':>11s} {'floor ms':>9s} {'ratio':>6s} {'launches':>8s}"]
    for r in rows:
        lines.append(f"  {r['kind']:<11s} {r['measured_ms']:11.3f} {r['floor_ms']:9.3f} "
                     f"{r['ratio']:5.2f}x {r['launches']:8.0f}")
    return "\n".join(lines)


def measure_peaks() -> tuple[float, float]:
    """(copy bandwidth in bytes/s, read + write of a 2 GiB device copy; bf16 matmul FLOP/s of
    8192^3), medians of CUDA-event timings after a warm-up, on the current GPU."""
    import torch
    import triton

    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=5, rep=40, return_mode="median")
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    bm = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_ms = triton.testing.do_bench(lambda: a @ bm, warmup=5, rep=40, return_mode="median")
    del a, bm
    torch.cuda.empty_cache()
    return 2.0 * (2 << 30) / (copy_ms * 1e-3), 2.0 * 8192 ** 3 / (mm_ms * 1e-3)

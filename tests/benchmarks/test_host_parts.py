"""benchmarks/host_parts.py on the CPU: the step's pieces are timed, nested pieces inside
their parents, and every wrapper is gone afterwards."""

from __future__ import annotations

from benchmarks import host_parts
from benchmarks.sim_common import tiny_config


def test_pieces_are_timed_and_unwrapped():
    from toolkit import LLM

    llm = LLM(tiny_config(), device="cpu", dtype="float32", num_blocks=128, max_num_seqs=4,
              max_num_batched_tokens=512, max_model_len=512, enable_prefix_caching=False)
    eng = llm.engine
    r = host_parts.measure(llm, batch=4, steps=3, prompt=20)
    parts = {k.strip(): v for k, v in r["parts_ms"].items()}
    for name in ("schedule", "update", "runner.execute_model", "runner.sample_tokens", "prepare", "forward",
                 "_sample_plain"):
        assert parts[name] > 0, name
    assert parts["prepare"] >= parts["_batch"] and r["step_ms"] > 0
    assert r["gpu_ms"] is None                       # the CPU: no events
    assert not eng.observers and not eng.runner.time_gpu      # the timing observer is gone
    wrapped = [(o, m) for o, m, _ in host_parts.pieces(eng) if m in vars(o)]
    assert not wrapped, wrapped                      # the timers were instance attributes: removed
    assert not eng.has_unfinished() and eng.scheduler.allocator.num_free_blocks() == 128
    llm.close()


def test_timed_method_on_an_instance_a_class_and_an_inherited_method():
    import collections

    from benchmarks.step_diagnose import timed_method

    class A:
        def f(self, x):
            return x + 1

    class B(A):
        pass

    spent = collections.defaultdict(float)
    b = B()
    with timed_method(B, "f", spent, "every B"), timed_method(b, "f", spent):
        assert b.f(1) == 2 and B().f(2) == 3
    assert spent["every B"] > 0 and spent["f"] > 0
    assert "f" not in vars(B) and "f" not in vars(b)           # B inherits f again
    original = vars(A)["f"]
    with timed_method(A, "f", spent, "A"):
        assert vars(A)["f"] is not original and A().f(1) == 2
    assert vars(A)["f"] is original and spent["A"] > 0

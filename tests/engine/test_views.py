"""Seeing the engine work: the step recorder, the live view's model state after each step,
and the components' reprs (text and HTML)."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import LlamaConfig

from toolkit import LLM, SamplingParams
from toolkit.notebook.recorder import StepRecorder
from toolkit.notebook import LiveModel, LiveView
from toolkit.notebook.render import render_all
from toolkit.notebook.state import block_cells


@pytest.fixture(scope="module")
def llm():
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=300, max_position_embeddings=256, eos_token_id=2)
    torch.manual_seed(0)
    with LLM(cfg, dtype="float32", device="cpu", num_blocks=24, block_size=4, max_num_batched_tokens=16,
             max_num_seqs=4) as llm:
        yield llm


PARAMS = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0)


def test_no_record_is_built_without_an_observer(llm, monkeypatch):
    import toolkit.engine.engine as engine_mod

    def boom(*a, **k):
        raise AssertionError("a StepRecord was built with no observer attached")

    monkeypatch.setattr(engine_mod, "step_record", boom)
    llm.generate([[5, 6, 7]], PARAMS, use_tqdm=False)   # no bar: no observer


def test_recorder_table_matches_the_run(llm):
    prompts = [[9] * 20, [10, 11], [12] * 9]           # no prefix hit, no preemption (24 blocks)
    with StepRecorder(llm) as rec:
        llm.generate(prompts, PARAMS, use_tqdm=False)
    assert not llm.engine.observers, "the recorder detached on exit"
    rows = rec.rows()
    assert [r["step"] for r in rows] == list(range(len(rows)))
    s = rec.summary()
    assert s["prefill_tokens"] == sum(map(len, prompts)) and s["preemptions"] == 0
    assert s["decode_tokens"] == 3 * (PARAMS.max_tokens - 1)   # the first token comes from the prompt
    assert all(r["num_prefill_tokens"] + r["num_decode_tokens"] <= 16 for r in rows)
    assert rows[0]["num_waiting"] >= 1 and rows[-1]["num_running"] == 0
    assert max(r["kv_blocks_used"] for r in rows) <= 24 and rows[0]["kv_blocks_total"] == 24
    assert sum(r["num_finished"] for r in rows) == 3
    assert rows[-1]["time"] >= rows[0]["time"] > 0
    table = rec.table()                                # pandas when installed, rows otherwise
    assert len(table) == len(rows)
    fig = rec.plot()
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["tokens per step", "queue depths", "KV cache"]
    assert all(ax.get_xlabel() == "step" and ax.get_ylabel() for ax in fig.axes)
    assert all(ax.get_legend() is not None for ax in fig.axes)
    fig.canvas.draw()
    for ax in fig.axes:                                # steps, tokens, requests, blocks: counts
        assert all(float(t).is_integer() for t in [*ax.get_xticks(), *ax.get_yticks()]), ax.get_title()
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_live_view_state_after_each_step(llm):
    with LiveView(llm, interval=0, display=False, plot=False) as view:
        outs = llm.generate([[5] * 10, [6, 7, 8]], PARAMS, use_tqdm=False)
    states, recs = view.states, view.recorder.records
    assert len(states) >= len(recs) and [s.step for s in states[:len(recs)]] == [r.step for r in recs]
    total = 0
    for s, r in zip(states, recs):
        total += r.num_tokens
        assert (s.num_running, s.num_waiting, s.kv_blocks_used) == (r.num_running, r.num_waiting,
                                                                    r.kv_blocks_used)
        assert s.num_tokens == total and s.timeline[-1] == (r.step, r.num_prefill_tokens, r.num_decode_tokens)
        assert len(s.block_cells) == 24 and s.blocks_per_cell == 1
    last = states[-1]
    assert last.num_finished == 2 and last.num_running == 0 and last.tokens_per_s > 0
    # mid-run, blocks are held, by the running requests; at the end none is (cached prefixes
    # may stay, evictable)
    assert any({"held", "cached", "shared"} & set(s.block_cells) for s in states[:-1])
    for s in states:
        assert all(s.block_cells[b] in ("held", "cached", "shared") for b, _ in s.block_owners)
    holders = {who for s in states for _, who in s.block_owners}
    assert holders == {o.request_id for o in outs}
    assert "held by" in render_all(next(s for s in states if s.block_owners))
    assert not {"held", "cached", "shared"} & set(last.block_cells)
    page = render_all(last)
    assert f"step {last.step + 1}" in page and "tokens per step" in page
    assert page.count("<rect") == sum((p > 0) + (d > 0) for _, p, d in last.timeline)
    assert len(re.findall(r"width:8px;height:8px", page)) == 24
    assert not llm.engine.observers


def test_live_model_window_and_big_caches_group_blocks(llm):
    from toolkit.blocks.prefix_caching import PrefixCachingAllocator

    alloc = PrefixCachingAllocator(5000, 4)
    alloc.allocate(2500)
    per, cells = block_cells(alloc, max_cells=1000)
    assert per == 5 and len(cells) == 1000 and cells[0] == "held" and cells[-1] == "free"
    with pytest.raises(ValueError, match="window"):
        LiveModel(alloc, window=0)


def test_generate_live_without_a_notebook_still_runs(llm, capsys):
    outs = llm.generate([[5, 6]], PARAMS, use_tqdm=False, live=True)
    assert len(outs[0].token_ids) == PARAMS.max_tokens and not llm.engine.observers


def test_reprs_are_readable_and_html_has_the_parts(llm):
    from toolkit.attention.torch_ref import TorchAttention
    from toolkit.blocks.kv_cache import KVCache

    e = llm.engine
    ref = TorchAttention(KVCache(1, 4, 4, 2, 16), 4, 16, sliding_window=8)
    for obj in (llm, e, e.scheduler, e.runner.sampler, e.runner.attention, ref):
        text = repr(obj)
        assert " object at 0x" not in text and text.startswith(type(obj).__name__), text
    for obj in (llm, e, e.scheduler, e.runner.sampler, e.runner.attention, ref):
        assert "<table" in obj._repr_html_()
    assert "sliding_window=8" in repr(ref) and "4 blocks x 4 tokens" in ref._repr_html_()
    page = llm._repr_html_()
    for part in ('data-toolkit="llm"', 'data-toolkit="scheduler"', 'data-toolkit="sampler"',
                 "temperature", "kv blocks"):
        assert part in page, part
    assert "fused tail: temperature -> min_p -> top_k -> top_p" in repr(e.runner.sampler)

    class Late:
        name = "late"

        def __call__(self, logits, meta):
            return logits

    from toolkit.samplers import Sampler

    assert "fused tail: off" in repr(Sampler().insert_after("top_p", Late()))
    e.add_request([5] * 9, PARAMS, request_id="watched")
    e.step()
    assert "watched: " in e.scheduler._repr_html_()
    e.abort("watched")


def test_sampling_params_repr_shows_only_what_differs():
    assert repr(SamplingParams()) == "SamplingParams()"
    assert repr(SamplingParams(temperature=0, max_tokens=8)) == "SamplingParams(temperature=0.0, max_tokens=8)"
    assert "stop=['x']" in repr(SamplingParams(stop="x"))
    html = SamplingParams(top_p=0.5)._repr_html_()
    assert "top_p" in html and "temperature" not in html
    from toolkit import BeamSearchParams

    assert repr(BeamSearchParams(beam_width=2, max_tokens=4)) == "BeamSearchParams(beam_width=2, max_tokens=4)"


def test_closed_llm_repr():
    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    llm = LLM(cfg, dtype="float32", device="cpu", num_blocks=4, block_size=4)
    llm.close()
    assert repr(llm) == "LLM(closed)" and "closed" in llm._repr_html_()


def test_progress_bar_counts_tokens_and_shows_queues(llm, monkeypatch):
    import toolkit.progress as progress

    seen = {"ticks": [], "queues": []}

    class Bar:
        def update(self, n=1):
            seen["ticks"].append(n)

        def set_queues(self, running, waiting):
            seen["queues"].append((running, waiting))

    class Cm:
        def __enter__(self):
            return Bar()

        def __exit__(self, *a):
            return None

    kw = {}
    monkeypatch.setattr(progress, "progress_bar", lambda **k: (kw.update(k), Cm())[1])
    llm.generate([[20] * 30, [21] * 3, [22] * 3], PARAMS)        # max_num_seqs=4, 16 tokens a step
    assert kw["unit"] == "tok" and sum(seen["ticks"]) == kw["total"] == 36 + 3 * PARAMS.max_tokens
    assert seen["queues"][0][1] >= 1 and seen["queues"][-1] == (0, 0)


def test_terminal_bar_shows_rate_and_queues():
    from toolkit.progress import progress_bar

    with progress_bar(total=100, desc="generate", unit="tok") as bar:
        bar.update(10)
        bar.set_queues(3, 2)
        task = bar.progress.tasks[0]
        assert task.completed == 10 and task.fields["queues"] == "running 3, waiting 2"
        columns = [getattr(c, "text_format", "") for c in bar.progress.columns]
        assert "tok" in columns and "{task.fields[rate]}" in columns


def test_live_view_without_ipywidgets_says_how_to_get_them(llm, monkeypatch, capsys):
    import sys

    from toolkit.notebook import widgets_available

    monkeypatch.setitem(sys.modules, "ipywidgets", None)          # import ipywidgets -> ImportError
    ok, why = widgets_available()
    assert not ok and "pip install ipywidgets" in why
    with LiveView(llm, interval=0, display=True, plot=False) as view:
        llm.generate([[30, 31]], PARAMS, use_tqdm=False)
    assert view.widget is None and "pip install ipywidgets" in capsys.readouterr().out
    assert view.states and view.states[-1].num_finished == 1       # still recorded


def test_notebook_dir_finds_the_notebooks_folder_from_anywhere(tmp_path, monkeypatch):
    import pathlib

    from toolkit.notebook.paths import notebook_dir

    nb = tmp_path / "mine.ipynb"
    nb.write_text("{}")
    monkeypatch.setenv("JPY_SESSION_NAME", str(nb))
    assert notebook_dir() == tmp_path.resolve()
    monkeypatch.delenv("JPY_SESSION_NAME")
    monkeypatch.chdir(tmp_path)                         # a kernel started elsewhere
    here = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
    assert notebook_dir() == here and (notebook_dir() / "03_attention.ipynb").exists()


@pytest.mark.parametrize("total", [40, 65536])
def test_the_kv_panel_keeps_a_readable_scale(total):
    """A cache far larger than the run's peak is named in the title, not drawn as a line that
    would flatten the used and cached blocks to the axis; one of similar size is a line."""
    import matplotlib
    matplotlib.use("Agg")
    from toolkit.engine.observe import StepRecord
    from toolkit.notebook.plots import plot_steps

    recs = [StepRecord(step=i, start_time=0.0, duration=0.0, grants={}, num_prefill_tokens=0,
                       num_decode_tokens=4, num_draft_tokens=0, num_accepted_tokens=0, num_running=4,
                       num_waiting=0, num_preempted=0, num_finished=0, kv_blocks_used=10 + i,
                       kv_blocks_cached=5, kv_blocks_total=total) for i in range(8)]
    fig = plot_steps(recs)
    kv = fig.axes[2]
    lines = [ln for ln in kv.get_lines() if ln.get_label() == "total"]
    if total == 40:
        assert lines and kv.get_ylim()[1] >= 40 and kv.get_title() == "KV cache"
    else:
        assert not lines and kv.get_ylim()[1] < 30 and "65,536" in kv.get_title()


def test_live_view_leaves_its_last_frame_and_plot_as_static_outputs(llm, monkeypatch):
    """In a kernel the widget is shown with a display id; when the run ends that output is
    replaced by the last frame as HTML, and the plot follows as an output of its own, so a
    page without a kernel (nbconvert, GitHub) shows the end state instead of nothing."""
    import IPython.display
    import matplotlib

    matplotlib.use("Agg")
    shown, updates = [], []

    class Handle:
        def update(self, obj):
            updates.append(obj)

    def display(obj, display_id=None):
        shown.append(obj)
        return Handle() if display_id else None

    monkeypatch.setattr(IPython.display, "display", display)
    with LiveView(llm, interval=10.0, display=True, plot=True) as view:
        llm.generate([[30, 31], [32, 33, 34]], PARAMS, use_tqdm=False)
    assert shown[0] is view.widget and len(updates) == 1
    frame = updates[0]
    page = frame._repr_html_()
    for part in ('data-live="status"', 'data-live="timeline"', 'data-live="blocks"'):
        assert part in page
    assert "not looked at yet" not in page                       # the block map of the end
    assert frame.state.num_finished == 2 and f"step {frame.state.step + 1}:" in repr(frame)
    assert type(shown[-1]).__name__ == "Figure"                  # the recording, as an image


def test_live_view_shows_no_frame_for_a_run_without_steps(llm, monkeypatch):
    import IPython.display

    updates = []
    handle = type("Handle", (), {"update": lambda self, obj: updates.append(obj)})()
    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=None: handle)
    with LiveView(llm, interval=0, display=True, plot=True):
        pass
    assert updates == []

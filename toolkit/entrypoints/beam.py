"""Beam search on the engine's parts (vLLM's approach): every step submits each live beam as
a one-token request asking for the top 2W logprobs; beams that share a prefix share its KV
blocks through the prefix-caching allocator, so a step recomputes only each beam's last
partial block. Candidates are ranked by `samplers.beam.beam_search_step`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from toolkit.progress import progress_bar
from toolkit.samplers.beam import beam_search_step, length_normalized
from toolkit.types import SamplingParams


@dataclass
class Beam:
    tokens: list[int]               # prompt + generated
    cum_logprob: float = 0.0
    num_generated: int = 0
    finished: bool = False
    text: str = ""                  # the generated tokens decoded (vLLM's BeamSearchSequence.text)

    def score(self, length_penalty: float) -> float:
        return length_normalized(self.cum_logprob, max(self.num_generated, 1), length_penalty)


@dataclass
class BeamSearchOutput:
    prompt_token_ids: list[int]
    sequences: list[Beam] = field(default_factory=list)   # best first
    texts: list[str] = field(default_factory=list)


def beam_search(engine, prompts: list[list[int]], beam_width: int, max_tokens: int, *,
                length_penalty: float = 1.0, ignore_eos: bool = False,
                use_tqdm: bool = False) -> list[BeamSearchOutput]:
    """HF-style beam search: 2W candidates per prompt and step; a candidate ending in EOS among
    the best W finishes (scored cum_logprob / generated_len ** length_penalty), the best W
    others continue. Returns the W best sequences per prompt."""
    if beam_width < 1 or max_tokens < 1:
        raise ValueError(f"beam_width and max_tokens must be >= 1, got {beam_width}, {max_tokens}")
    eos = None if ignore_eos else engine.eos_token_id
    live = [[Beam(list(p))] for p in prompts]
    done: list[list[Beam]] = [[] for _ in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=2 * beam_width, ignore_eos=True)
    with progress_bar(max_tokens, enabled=use_tqdm, desc="beam search", unit="step") as bar:
        _search(engine, prompts, beam_width, max_tokens, eos, live, done, params, bar)
    outs = []
    for i, p in enumerate(prompts):
        ranked = sorted(done[i] + live[i], key=lambda b: -b.score(length_penalty))[:beam_width]
        texts = [engine.tokenizer.decode(b.tokens[len(p):], skip_special_tokens=True)
                 if engine.tokenizer is not None else "" for b in ranked]
        for b, t in zip(ranked, texts):
            b.text = t
        outs.append(BeamSearchOutput(list(p), ranked, texts))
    return outs


def _search(engine, prompts, beam_width, max_tokens, eos, live, done, params, bar) -> None:
    """The beam steps: each adds every live beam as a one-token request and keeps the best."""
    for _ in range(max_tokens):
        flat = [(i, b) for i, beams in enumerate(live) for b in beams]
        if not flat:
            break
        rids: list[str] = []
        try:
            for _, b in flat:
                rids.append(engine.add_request(b.tokens, params))
            results = _drain(engine, set(rids))
        except BaseException:                # interrupted (KeyboardInterrupt, a failed step):
            engine.abort(rids)               # its requests leave the queue and free their blocks
            raise
        lps = [results[r] for r in rids]
        for i in range(len(prompts)):
            rows = [j for j, (k, _) in enumerate(flat) if k == i]
            if not rows:
                continue
            beams = [flat[j][1] for j in rows]
            logprobs = torch.full((len(rows), engine.model.spec.vocab_size), float("-inf"), dtype=torch.float64)
            for r, j in enumerate(rows):
                for tok, lp in lps[j].items():
                    logprobs[r, tok] = lp
            cum = torch.tensor([b.cum_logprob for b in beams], dtype=torch.float64)
            step = beam_search_step(cum, logprobs, 2 * beam_width)
            nxt: list[Beam] = []
            for rank, (p, t, s) in enumerate(zip(step.parents.tolist(), step.tokens.tolist(),
                                                 step.scores.tolist())):
                if s == float("-inf"):
                    break
                parent = beams[p]
                child = Beam(parent.tokens + [t], s, parent.num_generated + 1)
                if eos is not None and t == eos:
                    if rank < beam_width:
                        child.finished = True
                        done[i].append(child)
                    continue
                nxt.append(child)
                if len(nxt) == beam_width:
                    break
            live[i] = nxt
        bar.update(1)


def _drain(engine, ids: set[str]) -> dict[str, dict[int, float]]:
    got: dict[str, dict[int, float]] = {}
    while len(got) < len(ids):
        for o in engine.step():
            if o.finished and o.request_id in ids:
                lp = o.outputs[0].logprobs
                got[o.request_id] = lp[0] if lp else {}
    return got

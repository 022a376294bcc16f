"""Runner: SchedulerOutput -> tensors -> model forward -> sampled tokens.

One step flattens every scheduled request's new tokens into one ragged batch
(`input_ids [T]`, `positions [T]`), builds the step's PagedKVLayout once (every layer's
attention reuses it), runs the model, gathers the rows that produce a token
(`logits_indices [N]`) and samples them. A request verifying k draft tokens owns 1 + k
consecutive rows (row j predicts the token after drafts[:j]).

A step is two calls (vLLM V1's split): `execute_model(out, prev)` prepares the batch and
launches the forward through the executor (this process's ModelRunner, or N tensor-parallel
ranks'); `sample_tokens(forwarded, grammars, ended)` builds the sampling metadata and the
grammar bitmasks and samples, so that host work overlaps the GPU's forward. It returns a
`Launched` (worker/inflight.py) whose tokens may still be on the device; with async
scheduling the next step's placeholder input ids are gathered from them on the device
(`prepare(out, prev)`). `launch(out).result()` runs both, synchronously.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout
from toolkit.transfer import to_device, upload
from toolkit.worker.inflight import Launched, apply_ended
from toolkit.worker.penalty_history import PenaltyHistory
from toolkit.worker.sampling_rows import SamplingRows
from toolkit.pooling.accumulate import PoolChunk
from toolkit.samplers.base import SamplerOutput
from toolkit.types import PLACEHOLDER, Request, SchedulerOutput, StepResult


@dataclass
class Forwarded:
    """A step whose forward is launched and not yet sampled (batch None: nothing ran)."""
    batch: "Batch | None"
    x: torch.Tensor | None           # logits [N, V], or hidden [T, H] when graphed
    graphed: bool                    # sampled from SampleGraphs, which start at the hidden states
    gpu_start: object = None         # a CUDA event recorded before the step's work
    pooled: dict | None = None       # pooling requests whose prompt ended: {id: float32 result}
    kv_connector_output: object = None   # [kv_transfer] transfers finished by this step's call


@dataclass
class Batch:
    input_ids: torch.Tensor          # int64 [T]
    positions: torch.Tensor          # int64 [T]
    layout: PagedKVLayout
    logits_indices: torch.Tensor     # int64 [N]: rows of hidden that are sampled
    sampling: list[Request]          # [B] requests that sample this step, in row order
    drafts: list[list[int]]          # [B] the draft tokens each of them verifies (k_b)
    graph_batch: int | None = None   # the step padded to this CUDA-graph bucket (tokens)
    # prompt logprobs: rows of hidden whose next token is a prompt token, that token, and who asked
    prompt_rows: list[int] | None = None
    prompt_next: list[int] | None = None
    prompt_owner: list[tuple[str, int, int, int]] | None = None   # (request id, first position, count, top-N)
    prompt_logprobs: dict[str, list[dict[int, float]]] | None = None   # filled by forward()
    blocks_to_copy: list[tuple[int, int]] | None = None   # copy-on-write (src, dst) before the forward
    pooling: list | None = None      # [PoolChunk] of the step's pooling requests (prefill-only)
    lora: Any = None                 # LoRAStep (toolkit/lora/state.py): slot loads, per-token slots

    @property
    def num_rows(self) -> int:
        return sum(1 + len(d) for d in self.drafts)


class Runner:
    def __init__(self, model, attention, sampler, kv_cache: KVCache, device: torch.device,
                 generator: torch.Generator | None = None, executor=None) -> None:
        from toolkit.worker.executor import LocalExecutor

        self.model, self.attention, self.sampler = model, attention, sampler
        self.kv_cache, self.device = kv_cache, device
        self.generator = generator
        # where the forward runs: this process (LocalExecutor) or N tensor-parallel ranks
        # (toolkit/parallel/executor.py), one ModelRunner each
        self.executor = executor if executor is not None else LocalExecutor(model, attention, kv_cache, device)
        self._rejection = None
        self.graphs = None               # StepGraphs (CUDA graphs of small steps), see enable_cuda_graphs()
        self.sample_graphs = None        # SampleGraphs (LM head + the sampler's fused tail), likewise
        self._masks = None            # MaskTable: grammar mask rows on the device, made on first use
        self._rows = SamplingRows()   # the last step's sampling metadata, reused while valid
        # penalised requests' token lists on the device between steps (None: built per step)
        self.penalty_history: PenaltyHistory | None = PenaltyHistory(model.spec.vocab_size, device)
        # a sampler that declares can_consume_logits may process the step's own logits in place
        self._consume = {"consume_logits": True} if getattr(sampler, "can_consume_logits", False) else {}
        self.host_kv = None           # HostKVCache of the host tier (blocks/host_kv.py), set by build_engine
        self.kv_connector = None      # [kv_transfer] a KV connector's worker side, set by build_engine
        # CUDA: a timing event before each step's work, so a step's GPU time can be read when
        # its tokens land (Launched.gpu_seconds); the engine sets it while an observer that asked
        # for GPU time (add_observer(gpu_time=True)) is attached
        self.time_gpu = False
        # multi-LoRA (toolkit/lora/state.py): loads the step's adapters into their slots and
        # fills each token's slot index before the forward; None without enable_lora
        self.lora = None
        # pooling requests' kept hidden rows and the Pooler (toolkit/pooling/accumulate.py);
        # None: this engine serves generation only (build_engine sets it)
        self.pooling = None

    @property
    def graph_tokens(self) -> int | None:
        """The most tokens a step replays from CUDA graphs (None: no graphs); a larger step
        runs the model eagerly, a Python launch per kernel (the simulator's cost model counts
        those steps apart)."""
        return self.graphs.sizes[-1] if self.graphs is not None else None

    def enable_cuda_graphs(self, max_tokens: int, max_sample_rows: int | None = None,
                           full_tokens: int | None = None) -> bool:
        """Replay steps of up to max_tokens tokens from CUDA graphs (CUDA + a backend with
        run(out=)): piecewise graphs, and whole-forward graphs for decode steps of up to
        full_tokens (None: every bucket); and the LM head and sampling of plain steps of up
        to max_sample_rows sampling rows (max_num_seqs)."""
        self.graph_args = (max_tokens, max_sample_rows, full_tokens)   # sleep mode rebuilds them on wake
        self.graphs = self.executor.enable_cuda_graphs(max_tokens, full_tokens)   # every rank's
        if self.graphs is None:
            return False
        if not getattr(self.executor, "local_lm_head", False):   # tensor parallel: the logits come gathered
            return True
        # a sampler that declares graph_tail (samplers/base.py) gets its plain steps captured
        if callable(getattr(self.sampler, "graph_tail", None)):
            from toolkit.worker.sample_graphs import SampleGraphs

            self.sample_graphs = SampleGraphs(self.model, self.sampler,
                                              min(max_tokens, max_sample_rows or max_tokens), self.device)
        return True

    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput, prev: Launched | None = None) -> Forwarded:
        """Prepare the step and launch its forward (vLLM V1's execute_model); sampling follows
        in sample_tokens, so the engine can advance the grammars while the GPU runs. `prev` is
        the launched step whose tokens this one's placeholder inputs come from."""
        gpu_start = None
        if self.time_gpu and self.device.type == "cuda" and out.scheduled:
            gpu_start = torch.cuda.Event(enable_timing=True)
            gpu_start.record()
        if out.blocks_to_swap_out or out.blocks_to_swap_in:
            self.swap(out)                # first: before this step reads or writes any block
        kvo = None
        if self.kv_connector is not None:     # [kv_transfer] loads and saves, before the forward
            from toolkit.kv_transfer.worker import connector_step

            kvo = connector_step(self.kv_connector, out, self.kv_cache.num_layers)
        if not out.scheduled:
            return Forwarded(None, None, False, gpu_start, kv_connector_output=kvo)
        if self.pooling is not None and out.finished_ids:
            self.pooling.drop(out.finished_ids)     # aborted pooling requests' kept rows
        batch = self.prepare(out, prev)
        if self.lora is not None:
            batch.lora = self.lora.begin_step(out, len(batch.input_ids))   # TP ranks apply it too
        # plain rows may sample from a graph that starts at the hidden states (its LM head inside)
        graphed = self.sample_graphs is not None and not any(batch.drafts)
        if batch.pooling:                 # the pooled rows need the hidden states
            f = self._forward_pooling(batch, graphed, gpu_start)
            f.kv_connector_output = kvo
            return f
        x = self.hidden(batch) if graphed else self.forward(batch)   # hidden [T, H] | logits [N, V]
        return Forwarded(batch, x, graphed, gpu_start, kv_connector_output=kvo)

    def _forward_pooling(self, batch: "Batch", graphed: bool, gpu_start: object) -> Forwarded:
        """A step with pooling requests: hidden states (rank 0's under tensor parallelism:
        whole on every rank) -> their kept rows and finished results; the logits of the
        sampling rows from the same forward (gathered over the ranks in the executor), or
        the hidden states themselves for a sampler graph."""
        if self.pooling is None or not self.executor.supports_hidden:
            raise ValueError("this engine cannot pool: it has no pooler, or its executor does not "
                             "return hidden states")
        out = self.executor.execute(batch, hidden=True, logits=not graphed and bool(batch.sampling))
        if batch.prompt_rows:
            batch.prompt_logprobs = self._prompt_logprobs(batch, out.prompt_logits)
        pooled = self.pooling.take(out.hidden, batch.pooling)           # hidden [T, H]
        return Forwarded(batch, out.hidden if graphed else out.logits, graphed, gpu_start, pooled=pooled)

    @torch.inference_mode()
    def sample_tokens(self, f: Forwarded, grammars: Mapping[str, object] | None = None,
                      ended: Mapping[str, str] | None = None) -> Launched:
        """Sample a launched step (grammars: the structured-output manager's, their bitmasks
        applied here; ended: requests whose grammar ended, from its advance()). Plain steps
        leave their tokens on the device (copied to the host in the background)."""
        batch, x, graphed, gpu_start = f.batch, f.x, f.graphed, f.gpu_start
        if f.kv_connector_output is not None:    # [kv_transfer] the result carries the report
            launched = self.sample_tokens(Forwarded(batch, x, graphed, gpu_start), grammars, ended)
            launched.kv_connector_output = f.kv_connector_output
            return launched
        if batch is None:
            return Launched.done(StepResult())
        ended = dict(ended or {})
        prompt_lps = {rid: (start, batch.prompt_logprobs[rid]) for rid, start, _, _ in batch.prompt_owner or ()}
        if batch.pooling and not batch.sampling:     # pooling rows and prefill chunks only
            result = StepResult(prompt_logprobs=prompt_lps, pooled=f.pooled or {})
            apply_ended(result, ended)
            return Launched.done(result)
        if any(batch.drafts):
            result = self.sample(batch, x, grammars)
            result.prompt_logprobs.update(prompt_lps)
            result.pooled.update(f.pooled or {})
            apply_ended(result, ended)
            return Launched.done(result)
        s = self._sample_plain(batch, x, grammars, hidden=graphed)
        if self.penalty_history is not None:   # penalised rows take their token on the device
            self.penalty_history.note_sampled(batch.sampling, s.token_ids)
        launched = Launched.sampled(batch.sampling, s.token_ids, s.logprobs, s.logprob_token_ids, ended,
                                    prompt_lps, gpu_start)
        launched.pooled = f.pooled or {}
        return launched

    def launch(self, out: SchedulerOutput, structured=None, prev: Launched | None = None) -> Launched:
        """execute_model then sample_tokens, with the grammars advanced between them (what the
        engine's step does; for loops of one's own and the warm-up)."""
        f = self.execute_model(out, prev)
        ended = structured.advance(f.batch.sampling) if structured is not None and f.batch else {}
        return self.sample_tokens(f, structured.grammars if structured is not None else None, ended)

    @torch.inference_mode()
    def swap(self, out: SchedulerOutput) -> None:
        """The step's host-tier copies, enqueued on the current stream: swap-outs (device ->
        host), then swap-ins (host -> device); copy-on-write and the forward follow.

        Why stream order is enough, async scheduling included: step N + 1 is scheduled while
        step N runs, but its copies are enqueued here, after step N's forward and sampling
        on the same stream. So a swap-out reads a block after every write to it from steps
        <= N (the block's content is final: it was freed or evicted when schedule(N + 1)
        ran), and a block that step N + 1 reuses is written (by its swap-in or its forward)
        only after the swap-out that saved it. Swap-outs go before swap-ins because a block
        evicted to the host may be the target of a swap-in of the same step; a host slot is
        never both written and read in one step (HostTier pins it), and host memory is
        only touched by these copies, which nothing on the host waits for."""
        if self.host_kv is None:
            raise RuntimeError("the scheduler planned host swaps but the runner has no host pool; "
                               "build the engine with cpu_cache_gb= or host_cache_blocks=")
        self.host_kv.swap_out(self.kv_cache.layers, out.blocks_to_swap_out)
        self.host_kv.swap_in(self.kv_cache.layers, out.blocks_to_swap_in)

    def prepare(self, out: SchedulerOutput, prev: Launched | None = None) -> Batch:
        """The step's tensors. A request whose last token is still a PLACEHOLDER (async
        scheduling: sampled by `prev`, not yet on the host) gets it on the device from prev.

        Host work here is per request, not per token where it can be (a decode row is one
        list append), and every index tensor of the step travels in one packed host->device
        copy (`transfer.upload`): a pinned staging buffer per tensor cost tens of us each."""
        ids: list[int] = []               # [T] input token ids (placeholders as PLACEHOLDER)
        fill_at: list[int] = []           # flat positions of placeholder inputs
        fill_from: list[int] = []         # their rows in prev.tokens
        starts, tables, kv_lens, q_lens = [], [], [], []
        logits_idx: list[int] = []
        sampling: list[Request] = []
        drafts: list[list[int]] = []
        p_rows: list[int] = []
        p_next: list[int] = []
        p_owner: list[tuple[str, int, int, int]] = []
        pool: list[PoolChunk] = []
        offset = 0
        for s in out.scheduled:
            req = s.request
            start, n = s.start, s.num_new_tokens
            end = start + n
            if req.sampling_params.prompt_logprobs is not None:
                # positions [start, min(end, P - 1)) predict prompt tokens start+1 ...
                last = min(end, req.num_prompt_tokens - 1)
                if last > start:
                    p_owner.append((req.request_id, start, last - start,
                                    req.sampling_params.prompt_logprobs))
                    p_rows.extend(range(offset, offset + last - start))
                    p_next.extend(req.prompt_token_ids[start + 1:last + 1])
            outs = req.output_token_ids
            num_tokens = len(req.prompt_token_ids) + len(outs)
            if n == 1 and start == num_tokens - 1 and outs:    # a decode: the last token
                ids.append(outs[-1])
            else:
                ids.extend(req.token_ids_slice(start, end))
            if end == num_tokens and outs and outs[-1] == PLACEHOLDER:
                fill_at.append(offset + num_tokens - 1 - start)
                fill_from.append(prev.rows[req.request_id])
            starts.append(start)
            tables.append(s.block_ids)
            kv_lens.append(end)
            q_lens.append(n)
            offset += n
            if req.pooling_params is not None:     # prefill-only: its rows go to the pooler
                pool.append(PoolChunk(req, offset - n, n, start, end >= num_tokens))
            elif end >= num_tokens:              # samples (s.samples)
                k = s.num_spec_tokens
                if k:
                    logits_idx.extend(range(offset - 1 - k, offset))
                else:
                    logits_idx.append(offset - 1)
                sampling.append(req)
                drafts.append(req.spec_token_ids[:k])
        q = np.asarray(q_lens, dtype=np.int64)
        # positions [T]: start_b + j for token j of sequence b
        pos = np.arange(offset) - np.repeat(np.cumsum(q) - q - np.asarray(starts, dtype=np.int64), q)
        batch = self._batch(out, prev, ids, pos, tables, kv_lens, q_lens, logits_idx, sampling, drafts,
                            fill_at, fill_from, p_rows, p_next, p_owner)
        batch.pooling = pool or None
        return batch

    def _batch(self, out: SchedulerOutput, prev: Launched | None, ids: list[int], pos: np.ndarray,
               tables: list, kv_lens: list[int], q_lens: list[int], logits_idx: list[int],
               sampling: list[Request], drafts: list[list[int]], fill_at: list[int],
               fill_from: list[int], p_rows: list[int], p_next: list[int], p_owner: list) -> Batch:
        """The step's tensors from prepare()'s lists: padded to a CUDA-graph bucket, the
        layout built, everything uploaded in one copy, placeholders filled from prev."""
        dev = self.device
        offset = len(ids)
        bp = pad = None
        if self.graphs is not None:   # any step of at most the largest bucket's tokens
            bp = self.graphs.bucket(offset)
            if bp is not None:
                pad = bp - offset
                ids = ids + [0] * pad
                pos = np.concatenate([pos, np.zeros(pad, dtype=np.int64)])   # padding rows at 0
        layout = PagedKVLayout.build(tables, kv_lens, q_lens, self.kv_cache.block_size, "cpu",
                                     num_pad_seqs=pad or 0)
        host = dict(input_ids=torch.tensor(ids, dtype=torch.int64), positions=torch.from_numpy(pos),
                    logits_indices=torch.tensor(logits_idx, dtype=torch.int64), **layout.tensors())
        if fill_at:
            host["fill_at"] = torch.tensor(fill_at, dtype=torch.int64)
            host["fill_from"] = torch.tensor(fill_from, dtype=torch.int64)
        t = upload(host, dev)
        input_ids = t["input_ids"]
        if fill_at:                       # stream order: after prev's sampling, before this forward
            # (index_copy_ / index_select: the same kernels as `ids[at] = tokens[from]`, without
            # the indexing machinery's host cost, which runs every async step)
            input_ids.index_copy_(0, t["fill_at"], prev.tokens.index_select(0, t["fill_from"]))
        return Batch(
            input_ids=input_ids,
            positions=t["positions"],
            layout=layout.with_tensors(t) if dev.type != "cpu" else layout,
            logits_indices=t["logits_indices"],
            sampling=sampling, drafts=drafts, graph_batch=bp,
            prompt_rows=p_rows or None, prompt_next=p_next or None, prompt_owner=p_owner or None,
            blocks_to_copy=list(out.blocks_to_copy) or None,
        )

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [N, V] (float32) of the rows that sample, from the executor (this process's
        model, or N tensor-parallel ranks); prompt logprobs are taken here."""
        out = self.executor.execute(batch)
        if batch.prompt_rows:
            batch.prompt_logprobs = self._prompt_logprobs(batch, out.prompt_logits)
        return out.logits

    @torch.inference_mode()
    def hidden(self, batch: Batch) -> torch.Tensor:
        """The hidden states [T, hidden] of the step's tokens (an executor that declares
        supports_hidden), for a sampler graph that runs the LM head itself."""
        out = self.executor.execute(batch, hidden=True, logits=False)
        if batch.prompt_rows:
            batch.prompt_logprobs = self._prompt_logprobs(batch, out.prompt_logits)
        return out.hidden

    def _prompt_logprobs(self, batch: Batch, logits: torch.Tensor) -> dict[str, list[dict[int, float]]]:
        """{request id: [{next prompt token and top-N: logprob}] for this step's positions},
        from the logits [P, V] of the rows batch.prompt_rows."""
        from toolkit.samplers.logprobs import gather_logprobs

        nxt = torch.tensor(batch.prompt_next, device=logits.device)
        k = max(want for _, _, _, want in batch.prompt_owner)
        values, ids, _ = gather_logprobs(logits, nxt, k)
        values, ids = values.tolist(), ids.tolist()
        out, i = {}, 0
        for rid, _, n, want in batch.prompt_owner:
            out[rid] = [dict(zip(ids[j][: want + 1], values[j][: want + 1])) for j in range(i, i + n)]
            i += n
        return out

    @torch.inference_mode()
    def sample(self, batch: Batch, logits: torch.Tensor,
               grammars: Mapping[str, object] | None = None) -> StepResult:
        """Tokens each sampling request emits: [one] for a plain row; with drafts, the accepted
        drafts plus one recovered or bonus token; and, per request that asked, {token id:
        logprob} of each emitted token and its top-N alternatives (from the raw logits)."""
        meta = self._metadata(batch, grammars)
        if not any(batch.drafts):
            out = self.sampler(logits, meta, **self._consume)
            return Launched.sampled(batch.sampling, out.token_ids, out.logprobs, out.logprob_token_ids,
                                    {}, {}).result()
        return self._verify(batch, logits, meta, [r.request_id for r in batch.sampling])

    def _metadata(self, batch: Batch, grammars):
        """SamplingMetadata of the step's logits rows (1 + k rows for a request with k drafts)."""
        slots = self._mask_slots(batch, grammars) if grammars else None
        # a steady decode's rows (no drafts, no grammar) reuse the last step's metadata
        plain = slots is None and not any(batch.drafts)
        return self._rows.get(batch.sampling, plain, lambda: self._build_metadata(batch, slots))

    def _build_metadata(self, batch: Batch, slots: list[int] | None):
        from toolkit.samplers.base import SamplingMetadata

        params, prompts, outputs, eos = [], [], [], []
        for req, d in zip(batch.sampling, batch.drafts):
            for j in range(1 + len(d)):
                params.append(req.sampling_params)
                prompts.append(req.prompt_array)            # numpy, made once
                # drafts before a row count as output (no copy for a plain row)
                outputs.append(req.output_token_ids + d[:j] if j else req.output_token_ids)
                eos.append(req.eos_token_id)
        lists = None
        if self.penalty_history is not None and not any(batch.drafts):   # a row per request
            history, reqs = self.penalty_history, batch.sampling

            def lists(rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
                return history.lists([reqs[i] for i in rows],
                                     [reqs[i].sampling_params.repetition_penalty != 1.0 for i in rows])
        return SamplingMetadata.build(params, prompts, outputs, self.model.spec.vocab_size, self.device,
                                      eos_token_ids=eos, check_ids=False,  # checked at add_request
                                      bitmask=self._masks.table if slots else None,
                                      bitmask_rows=slots, penalty_lists=lists)

    def _sample_plain(self, batch: Batch, x: torch.Tensor, grammars, hidden: bool = False):
        """The Sampler on rows without drafts; its output stays on the device. x: the logits
        [N, V], or (hidden=True) the step's hidden states [T, hidden], sampled from the
        SampleGraphs when the sampler's tail covers the step."""
        meta = self._metadata(batch, grammars)
        if hidden:
            tokens = self.sample_graphs.sample(x, batch.logits_indices, meta)
            if tokens is not None:
                return SamplerOutput(tokens)
            x = self.model.compute_logits(x[batch.logits_indices])
        try:
            # the step's own logits: a sampler that declares it may process them in place
            return self.sampler(x, meta, **self._consume)
        except Exception as e:
            from toolkit.worker.sample_fault import attribute_fault

            # a row's fault (a user's stage raising for one request) ends only its request
            fault = attribute_fault(self.sampler, x, meta, [r.request_id for r in batch.sampling], e)
            if fault is e:
                raise
            raise fault from e

    def _verify(self, batch: Batch, logits: torch.Tensor, meta, ids: list[str]) -> StepResult:
        """Rows with drafts: the rejection sampler; logprobs of every emitted token of the
        requests that asked, from their rows' raw logits (kept before sampling)."""
        from toolkit.samplers.logprobs import gather_logprobs
        from toolkit.samplers.speculative.rejection import RejectionSampler, SpecDecodeMetadata

        if self._rejection is None:
            self._rejection = RejectionSampler(self.sampler)
        starts = np.cumsum([0] + [1 + len(d) for d in batch.drafts])
        asking = [b for b, r in enumerate(batch.sampling) if r.sampling_params.logprobs is not None]
        rows = [r for b in asking for r in range(starts[b], starts[b + 1])]
        raw = logits[_to(np.asarray(rows, dtype=np.int64), self.device)].clone() if rows else None
        # a sampled draft's distribution q makes acceptance min(1, p/q); without it, one-hot q
        probs = [r.spec_token_probs[: len(d)] if r.spec_token_probs is not None and d else None
                 for r, d in zip(batch.sampling, batch.drafts)]
        spec = SpecDecodeMetadata.build(batch.drafts, self.model.spec.vocab_size, self.device,
                                        draft_probs=probs if any(p is not None for p in probs) else None)
        emitted = self._rejection(logits, meta, spec, self.generator).tolist()
        result = StepResult(dict(zip(ids, emitted)),
                            num_draft_tokens={rid: len(d) for rid, d in zip(ids, batch.drafts) if d})
        if raw is None:
            return result
        keep, toks, offset = [], [], 0       # rows of `raw` whose token was emitted, and that token
        for b in asking:
            width = starts[b + 1] - starts[b]
            keep.extend(range(offset, offset + len(emitted[b])))
            toks.extend(emitted[b])
            offset += width
        k = max(batch.sampling[b].sampling_params.logprobs for b in asking)
        values, top, _ = gather_logprobs(raw[_to(np.asarray(keep, dtype=np.int64), self.device)],
                                         _to(np.asarray(toks, dtype=np.int64), self.device), k)
        values, top, i = values.tolist(), top.tolist(), 0
        for b in asking:
            n = batch.sampling[b].sampling_params.logprobs
            result.logprobs[ids[b]] = [dict(zip(top[j][: n + 1], values[j][: n + 1]))
                                       for j in range(i, i + len(emitted[b]))]
            i += len(emitted[b])
        return result

    def close(self) -> None:
        """Free the KV cache (and the host tier's pinned pool); stop the tensor-parallel workers."""
        if self.kv_connector is not None:     # [kv_transfer] pending saves, its I/O thread, temporary files
            self.kv_connector.close()
            self.kv_connector = None
        self.kv_cache.close()
        self.host_kv = None
        self.executor.close()

    def _mask_slots(self, batch: Batch, grammars: Mapping[str, object]) -> list[int] | None:
        """Each logits row's slot in the device table of grammar mask rows (None: no row of
        this step is constrained). Rows in one grammar state share a slot; only states not
        seen before are filled on the host and uploaded."""
        from toolkit.samplers.grammar.mask_cache import MaskTable

        per_req = [grammars.get(r.request_id) for r in batch.sampling]
        if not any(g is not None for g in per_req):
            return None
        if self._masks is None:
            self._masks = MaskTable(self.model.spec.vocab_size, self.device)
        return self._masks.rows(per_req, batch.drafts)


def _to(x: np.ndarray, device: torch.device) -> torch.Tensor:
    return to_device(torch.from_numpy(x), device)

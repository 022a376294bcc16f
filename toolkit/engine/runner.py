"""Runner: SchedulerOutput -> tensors -> model forward -> sampled tokens.

One step flattens every scheduled request's new tokens into one ragged batch
(`input_ids [T]`, `positions [T]`), builds the step's PagedKVLayout once (every layer's
attention reuses it), runs the model, gathers the rows that produce a token
(`logits_indices [N]`) and samples them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout
from toolkit.types import SchedulerOutput


@dataclass
class Batch:
    input_ids: torch.Tensor          # int64 [T]
    positions: torch.Tensor          # int64 [T]
    layout: PagedKVLayout
    logits_indices: torch.Tensor     # int64 [N]: rows of hidden that are sampled
    row_owner: list[str]             # [N] request id of each sampled row
    row_count: dict[str, int]        # request id -> number of rows it samples (1 + drafts)
    meta: object                     # SamplingMetadata of the N rows


class Runner:
    def __init__(self, model, attention, sampler, kv_cache: KVCache, device: torch.device,
                 generator: torch.Generator | None = None) -> None:
        self.model, self.attention, self.sampler = model, attention, sampler
        self.kv_cache, self.device = kv_cache, device
        self.generator = generator

    def prepare(self, out: SchedulerOutput) -> Batch:
        from toolkit.samplers.base import SamplingMetadata

        ids: list[np.ndarray] = []
        pos: list[np.ndarray] = []
        tables, kv_lens, q_lens = [], [], []
        logits_idx: list[int] = []
        owners: list[str] = []
        counts: dict[str, int] = {}
        params, prompts, outputs, eos = [], [], [], []
        offset = 0
        for s in out.scheduled:
            req = s.request
            ids.append(np.asarray(req.token_ids_slice(s.start, s.end), dtype=np.int64))
            pos.append(np.arange(s.start, s.end, dtype=np.int64))
            tables.append(s.block_ids)
            kv_lens.append(s.end)
            q_lens.append(s.num_new_tokens)
            offset += s.num_new_tokens
            if s.samples:
                # rows: the last token, plus one per draft token being verified
                n_rows = 1 + s.num_spec_tokens
                counts[req.request_id] = n_rows
                for j in range(n_rows):
                    logits_idx.append(offset - n_rows + j)
                    owners.append(req.request_id)
                    params.append(req.sampling_params)
                    prompts.append(req.prompt_token_ids)
                    # tokens before this row's position (drafts before it count as output)
                    outputs.append(req.output_token_ids + req.spec_token_ids[:j])
                    eos.append(req.eos_token_id)
        dev = self.device
        layout = PagedKVLayout.build(tables, kv_lens, q_lens, self.kv_cache.block_size, dev)
        meta = SamplingMetadata.build(params, prompts, outputs, self.model.vocab_size, dev,
                                      eos_token_ids=eos)
        return Batch(
            input_ids=_to(np.concatenate(ids), dev),
            positions=_to(np.concatenate(pos), dev),
            layout=layout,
            logits_indices=_to(np.asarray(logits_idx, dtype=np.int64), dev),
            row_owner=owners, row_count=counts, meta=meta,
        )

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [N, V] (float32) of the rows that sample."""
        self.attention.plan(batch.layout)
        hidden = self.model.forward(batch.input_ids, batch.positions, self.attention)  # [T, hidden]
        return self.model.compute_logits(hidden[batch.logits_indices])                 # [N, V]

    @torch.inference_mode()
    def sample(self, batch: Batch, logits: torch.Tensor):
        return self.sampler(logits, batch.meta)


def _to(x: np.ndarray, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(x)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t

"""PenaltyHistory: penalised requests' token lists kept on the device between steps.

Repetition, frequency and presence penalties read every token a request has seen (the
prompt for repetition, the output for all three). Built from the host's lists each step,
that is a pass over every token of every penalised row and an upload of all of them: 5.6 ms
of host time a step at batch 256 with 1000-token prompts and 500 output tokens, and a 3 MB
transfer (benchmarks/penalty_host.py; a Qwen3-0.6B-shaped decode step at batch 256 is 6.5 ms
of GPU time), and the step had to wait for the last token to reach the host. Here each
request owns a row of two device buffers (prompt, output; padded with the vocabulary size,
the penalty kernels' "no token"): its prompt is uploaded once, and each step uploads only
the output tokens its row has not seen yet (one a step in a steady decode), then gathers
the step's rows. This is the part of vLLM's persistent batch that the penalties need.

After sampling, `note_sampled` appends each row's new token on the device itself, so with
async scheduling a penalised request's next step does not wait for its last token to reach
the host. The rows are checked against the host, not trusted: a request whose output
shrank (or a new request object under a known id) has its row written again from its lists,
which then must hold every token (never the case for a row the device keeps current).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from toolkit.transfer import upload
from toolkit.types import PLACEHOLDER, Request


@dataclass
class _Row:
    request: Request
    slot: int
    prompt_len: int
    out_len: int        # output tokens in the device row


class PenaltyHistory:
    """Device rows of penalised requests' prompt and output ids ([S, Wp], [S, Wo] int64,
    padded with vocab_size); row 0 stays blank (all padding)."""

    def __init__(self, vocab_size: int, device: torch.device, *, rows: int = 8, width: int = 16) -> None:
        """rows, width: the buffers' first size (they grow, at least doubling)."""
        if rows < 2 or width < 1:
            raise ValueError(f"PenaltyHistory needs rows >= 2 (row 0 is blank) and width >= 1, "
                             f"got rows={rows}, width={width}")
        self.vocab_size, self.device = vocab_size, device
        self._prompt = torch.full((rows, width), vocab_size, dtype=torch.int64, device=device)
        self._out = torch.full((rows, width), vocab_size, dtype=torch.int64, device=device)
        self._rows: dict[str, _Row] = {}
        self._free = list(range(rows - 1, 0, -1))     # slots 1.. (0 is the blank row)
        self.num_uploaded_tokens = 0             # tokens sent to the device so far (tests)

    def __len__(self) -> int:
        return len(self._rows)

    def clear(self) -> None:
        """Forget every row (the buffers stay allocated)."""
        self._free.extend(r.slot for r in self._rows.values())
        self._rows.clear()

    def lists(self, requests: list[Request], repetition: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
        """prompt ids int64 [R, max(Lp, 1)] and output ids [R, max(Lo, 1)] of these requests
        (R = len(requests), in order; padded with vocab_size), as SamplingMetadata.build
        would make them from the lists: a row's prompt only where repetition[i] (else blank)."""
        self._release_finished({r.request_id for r in requests})
        new_prompts: list[tuple[int, np.ndarray]] = []
        tails: list[tuple[int, int, list[int]]] = []        # (slot, first position, tokens)
        for req in requests:
            row = self._rows.get(req.request_id)
            n_out = len(req.output_token_ids)
            if row is None or row.request is not req or row.out_len > n_out:
                if row is not None:                     # stale: written again below
                    self._free.append(row.slot)
                row = self._add(req)
                new_prompts.append((row.slot, req.prompt_array))
            if row.out_len < n_out:
                tail = req.output_token_ids[row.out_len:]
                if PLACEHOLDER in tail:
                    raise RuntimeError(f"request {req.request_id}: its penalty row lacks an output token "
                                       "that is not on the host yet (sampled without note_sampled?)")
                tails.append((row.slot, row.out_len, tail))
                row.out_len = n_out
        rows = [self._rows[r.request_id] for r in requests]
        width_p = max([r.prompt_len for r, rep in zip(rows, repetition) if rep], default=0)
        width_o = max([r.out_len for r in rows], default=0)
        dev = self._write(new_prompts, tails, {
            "prompt_slots": torch.tensor([r.slot if rep else 0 for r, rep in zip(rows, repetition)],
                                         dtype=torch.int64),
            "out_slots": torch.tensor([r.slot for r in rows], dtype=torch.int64)})
        # [R, W]: gathered rows, cut to the widest live row (at least one column, as _pad)
        return (self._prompt[dev["prompt_slots"], : max(width_p, 1)],
                self._out[dev["out_slots"], : max(width_o, 1)])

    def note_sampled(self, requests: list[Request], tokens: torch.Tensor) -> None:
        """After a step's sampling: tokens int64 [N] on the device, row i = requests[i]'s.
        Each penalised row whose device row is current gets its token appended there, in
        stream order, so the next step neither uploads it nor needs its value on the host
        (penalised requests can then take asynchronous steps). A token the host later drops
        (a finished request's last step) is caught by lists(): the row is longer than the
        host's output and is written again, or released."""
        if not self._rows:                      # no penalised request: the usual step
            return
        at = []
        for i, req in enumerate(requests):
            row = self._rows.get(req.request_id)
            if row is not None and row.request is req and row.out_len == len(req.output_token_ids):
                at.append((i, row.slot, row.out_len))
                row.out_len += 1
        if not at:
            return
        self._grow(out_width=max(pos for _, _, pos in at) + 1)
        i, slot, pos = upload({"at": torch.tensor(at, dtype=torch.int64).T.contiguous()}, self.device)["at"]
        self._out[slot, pos] = tokens[i]

    def _add(self, req: Request) -> _Row:
        if not self._free:
            self._grow(rows=2 * self._prompt.shape[0])
        row = _Row(req, self._free.pop(), len(req.prompt_token_ids), 0)
        self._rows[req.request_id] = row
        return row

    def _release_finished(self, present: set[str]) -> None:
        """Free the rows of finished requests (only those absent from this step can be)."""
        done = [rid for rid, r in self._rows.items() if rid not in present and r.request.is_finished]
        for rid in done:
            self._free.append(self._rows.pop(rid).slot)

    def _grow(self, rows: int | None = None, prompt_width: int = 0, out_width: int = 0) -> None:
        """Larger buffers (rows and widths at least doubled when they grow), contents kept."""
        s, wp = self._prompt.shape
        wo = self._out.shape[1]
        new_s = max(s, rows or 0)
        new_wp = wp if prompt_width <= wp else max(prompt_width, 2 * wp)
        new_wo = wo if out_width <= wo else max(out_width, 2 * wo)
        if (new_s, new_wp, new_wo) == (s, wp, wo):
            return
        p = torch.full((new_s, new_wp), self.vocab_size, dtype=torch.int64, device=self.device)
        o = torch.full((new_s, new_wo), self.vocab_size, dtype=torch.int64, device=self.device)
        p[:s, :wp] = self._prompt
        o[:s, :wo] = self._out
        self._prompt, self._out = p, o
        self._free.extend(range(new_s - 1, s - 1, -1))

    def _write(self, new_prompts: list[tuple[int, np.ndarray]], tails: list[tuple[int, int, list[int]]],
               host: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One packed upload of `host` (the step's gather indices) with the new rows' prompts
        (rows cleared first: a reused slot holds an earlier request's ids) and the output
        tokens the device rows lack, which are written; returns the uploaded tensors."""
        need_p = max((len(p) for _, p in new_prompts), default=0)
        need_o = max((pos + len(t) for _, pos, t in tails), default=0)
        self._grow(prompt_width=need_p, out_width=need_o)
        if new_prompts:
            width = max(need_p, 1)
            block = np.full((len(new_prompts), width), self.vocab_size, dtype=np.int64)
            for i, (_, ids) in enumerate(new_prompts):
                block[i, : len(ids)] = ids
            host["slots"] = torch.tensor([s for s, _ in new_prompts], dtype=torch.int64)
            host["prompts"] = torch.from_numpy(block)
        if tails:
            flat = [(s, pos + j, t) for s, pos, toks in tails for j, t in enumerate(toks)]
            host["tails"] = torch.tensor(flat, dtype=torch.int64).T.contiguous()   # [3, K]
            self.num_uploaded_tokens += len(flat)
        dev = upload(host, self.device)
        if new_prompts:
            slots = dev["slots"]
            self._prompt[slots] = self.vocab_size
            self._out[slots] = self.vocab_size
            self._prompt[slots, : dev["prompts"].shape[1]] = dev["prompts"]
            self.num_uploaded_tokens += sum(len(p) for _, p in new_prompts)
        if tails:
            s, pos, tok = dev["tails"]
            self._out[s, pos] = tok
        return dev

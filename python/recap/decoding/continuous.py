"""Continuous batching: requests join a running batch between steps and leave when they end.

join(request, session) -> its prompt prefilled alone into a new last row of the slab
(`TreePass.join`, exactly as at batch 1) -> its first token (`loop.start_row`)
-> every `step`: one verification pass over every row's tree (`loop.step_rows`, the
loop a batched request runs) -> a row that ends (EOS, its length, a stopping criterion such
as a cancellation) leaves the slab at once (`TreePass.drop`), its streamer ends and its
session finishes.

A row's tokens are its own batch-1 `generate` output whenever it joined and whoever shared
its steps: each row has its own session, tree, positions, mask and stop rules, as in a
batch. A row whose processors raise fails alone (`RowFailed` in `Row.error`): the pass is
shared, its picks are not.

One thread drives a `ContinuousBatch` (the passes run its linear layout, which is entered
per thread); requests reach it between steps.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np
import torch

from recap.decoding.loop import _Row as Row
from recap.decoding.loop import start_row, step_rows
from recap.decoding.request import Request
from recap.decoding.stats import GenerationStats
from recap.state.model_state import state_of
from recap.verify.tree_pass import TreePass

__all__ = ["ContinuousBatch", "Row"]


class ContinuousBatch:
    """The rows decoding together on one decoder (see the module doc)."""

    def __init__(self, decoder: Any) -> None:
        self.decoder = decoder
        self.rows: list[Row] = []
        self.stats = GenerationStats(rows=0)  # the passes, over every row that took part
        self._tp: TreePass | None = None
        self._layout = contextlib.ExitStack()

    @torch.no_grad()
    def join(self, req: Request, memory_scope: str | None = None, pool: Any = None) -> Row:
        """Admits a one-row request (no padding): its session (on `memory_scope` of `pool`,
        the decoder's own pool by default, as `Decoder.run`), its prefill, its first token.
        Returns its row, which has already ended (`ended`) if that token ended it. An
        exception (a processor of its own, a bad scope) leaves the batch as it was."""
        if req.batch != 1 or req.padded or req.model_inputs:
            raise ValueError(f"join: expected one prompt without padding or model inputs, got a batch of "
                             f"{req.batch}{' with padding' if req.padded else ''}")
        dec = self.decoder
        dec._prepare()
        held = contextlib.ExitStack()  # the row's admission and session, until it ends
        try:
            held.enter_context(dec._admitted())
            session = held.enter_context(dec._session(held, memory_scope, pool if pool is not None else dec.pool))
            row = self._join(req, session)
        except BaseException:
            held.close()
            raise
        row.held = held
        if row.ended:
            held.close()
        return row

    def _join(self, req: Request, session: Any) -> Row:
        dec = self.decoder
        if self._tp is None:
            self._layout.enter_context(dec._layout_context())
            capacity = req.input_ids.shape[1] + min(req.max_new, 1 << 16) + session.max_nodes + 1
            self._tp = TreePass(dec.adapter, session.max_nodes, capacity, dec.config.k, rows=0)
        tp = self._tp
        t0 = time.perf_counter()
        prompt = req.input_ids[0].tolist()
        row = Row(-1, prompt, prompt, session, req.chooser, req)
        row.stats = GenerationStats()
        row.streamer = req.streamer
        shared = state_of(dec.model).prefill_lock if dec.adapter.keeps_request_state else contextlib.nullcontext()
        with shared:
            dec.adapter.before_prefill()
            last, seed = tp.join(req.input_ids[0], head_share=dec.seed_share())
        if row.streamer is not None and not req.streamer_has_prompt:
            row.streamer.put(req.input_ids.cpu())
        capacity = len(prompt) + min(req.max_new, 1 << 16) + session.max_nodes + 1
        try:
            going = start_row(dec, row, last, seed, capacity, tp.device)
        except BaseException:
            self._leave_slab(tp.rows - 1)
            if row.streamer is not None:
                row.streamer.end()
            raise
        row.stats.prefill_s = time.perf_counter() - t0
        row.started = t0
        if going:
            self.rows.append(row)
        else:
            self._leave_slab(tp.rows - 1)
            self._end(row)
        return row

    @torch.no_grad()
    def step(self) -> list[Row]:
        """One pass for every row; returns the rows that ended in it (failed ones included)."""
        if not self.rows:
            return []
        assert self._tp is not None
        dec = self.decoder
        budget = dec._batch_budget()
        still = step_rows(dec, self._tp, self.rows, self.stats, budget, dec.config.k)
        kept = {id(r) for r in still}
        ended = [r for r in self.rows if id(r) not in kept]
        self.rows = still
        for row in ended:
            self._end(row)
        if not self.rows:
            self._close()
        return ended

    def close(self) -> None:
        """Ends every row where it stands (each gets its streamer's end) and frees the slab."""
        ended, self.rows = self.rows, []
        for row in ended:
            self._end(row)
        self._close()

    def _leave_slab(self, index: int) -> None:
        assert self._tp is not None
        keep = [j for j in range(self._tp.rows) if j != index]
        if keep:
            self._tp.drop(np.asarray(keep, dtype=np.int64))
        else:
            self._close()

    def _end(self, row: Row) -> None:
        row.session.finish()
        if row.held is not None:
            row.held.close()
            row.held = None
        if row.streamer is not None:
            row.streamer.end()
        stats = row.stats
        if stats is not None:
            stats.new_tokens = len(row.out)
            stats.total_s = time.perf_counter() - row.started
        row.ended = True

    def _close(self) -> None:
        self._tp = None
        self._layout.close()
        self._layout = contextlib.ExitStack()

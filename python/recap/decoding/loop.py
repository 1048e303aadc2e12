"""The decoding loop, one for every request: a request is a batch of B rows (B = 1 included),
verified together in one pass per step.

prompts -> one prefill -> each row's first token -> loop {
    each row's session drafts its tree -> one forward over all trees (`recap.verify.tree_pass`)
    -> each row's picks and acceptance (its own session) -> one compaction for all rows ->
    rows that stopped leave the batch }.

Tree sizes: a row alone sizes its own tree (its session's automatic budget, fed every step's
pass and host times, and its cost curve settled when the request ends:
`recap.first_use.budget.settle`); rows together get one width per step from every row's
ranked drafts (`recap._core.BatchWidth`).

Row i's tokens are the tokens its own `generate` at batch 1 gives (and batched `generate`'s
row i): each row has its own session, tree, positions and mask, so nothing of another row
enters its computation except through the shape of the pass. A request of one row (padded
or not) gets the streamer (its prompt, every committed token, then `end()`) and, with
`return_dict_in_generate`, its scores and logits.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, cast

import numpy as np
import torch

from recap._core import BatchWidth
from recap.decoding.acceptance import NodePicks
from recap.decoding.outputs import RecapGenerateOutput, TokenRows
from recap.decoding.stats import GenerationStats
from recap.first_use.budget import settle
from recap.state.model_state import peek, state_of
from recap.verify.tree_pass import TreePass


class _Row:
    """One prompt of the batch: its session, its tokens so far and how it picks them."""

    def __init__(self, index: int, prompt: list[int], padded: list[int], session, chooser, req) -> None:
        self.index, self.prompt, self.padded = index, prompt, padded
        self.session, self.chooser = session, chooser
        self.req = req  # its stop rules (EOS, length, criteria): the batch's, or its own request's
        self.out: list[int] = []
        self.stats: GenerationStats | None = None  # a row's own figures, where it keeps them
        self.error: Exception | None = None  # what its own processors raised (the row then ends)
        self.started, self.ended = 0.0, False
        self.held: Any = None  # a joining row's admission and session (`recap.decoding.continuous`)
        self.picks: NodePicks | None = None
        # A row alone: its streamer and the raw logits row of every committed token.
        self.streamer: Any = None
        self.logit_rows: TokenRows | None = None
        self.host_s: float | None = None  # its last step's host time, while it is timed alone

    def commit(self, tokens: list[int], logit_rows: torch.Tensor | None = None) -> None:
        """Hands committed tokens (already in `out`) to the streamer, their rows to the kept ones."""
        if self.streamer is not None:
            self.streamer.put(torch.tensor(tokens))
        if self.logit_rows is not None and logit_rows is not None:
            self.logit_rows.add(logit_rows)


def decode(decoder, req, sessions: list) -> Any:
    """Decodes the rows of `req` (a `recap.decoding.request.Request`) on their `sessions`."""
    stats = GenerationStats(rows=req.batch)
    decoder._local.stats = decoder._last_stats = stats
    t_start = time.perf_counter()
    adapter, k = decoder.adapter, decoder.config.k
    ids, mask = req.input_ids, req.attention_mask
    max_nodes = sessions[0].max_nodes
    capacity = ids.shape[1] + min(req.max_new, 1 << 16) + max_nodes + 1
    layout = decoder._layout_name()  # what this request's passes run in, whatever is chosen meanwhile
    tp = TreePass(adapter, max_nodes, capacity, k, rows=req.batch)
    shared = state_of(decoder.model).prefill_lock if adapter.keeps_request_state else contextlib.nullcontext()
    with shared:
        adapter.before_prefill()
        last, seeds = tp.prefill(ids, mask, req.model_inputs, head_share=decoder.seed_share())
    router = getattr(peek(decoder.model), "router", None)  # routing stats are kept per thread
    if router is not None and router.last_stats is not None:
        stats.routing = router.last_stats.as_dict()
    pads = tp.pad.tolist()
    rows = []
    for b in range(req.batch):
        padded = ids[b].tolist()
        rows.append(_Row(b, padded[pads[b]:], padded, sessions[b], req.choosers[b], req))
    if req.batch == 1:
        _alone(req, rows[0], ids)
    keep = [b for b, row in enumerate(rows) if start_row(decoder, row, last[b], seeds[b], capacity, tp.device)]
    stats.prefill_s = time.perf_counter() - t_start
    active = [rows[b] for b in keep]
    if len(keep) < req.batch:
        tp.drop(np.asarray(keep, dtype=np.int64))
    budget = decoder._batch_budget() if len(active) > 1 else None
    while active:
        before = active
        active = step_rows(decoder, tp, active, stats, budget, k)
        failed = next((row.error for row in before if row.error is not None), None)
        if failed is not None:
            raise failed
    for row in rows:
        row.session.finish()
        if row.streamer is not None:
            row.streamer.end()
    if req.batch == 1 and decoder._cost is not None:
        stats.cost = rows[0].session.cost_state()
        settled = settle(decoder.model, (layout,), stats.cost)  # confirmed, or replaced if shown wrong
        if settled is not None:
            decoder._cost = settled
    stats.kv_bytes = tp.cache.nbytes()
    stats.new_tokens = sum(len(r.out) for r in rows)
    stats.total_s = time.perf_counter() - t_start
    sequences = _sequences(req, rows)
    if not req.return_dict:
        return sequences
    kept = rows[0].logit_rows if req.batch == 1 else None
    n, prompt_len = len(rows[0].out), ids.shape[1]
    logits: Any = kept.logits(n) if kept is not None and req.output_logits else None
    scores: Any = (kept.scores(req.chooser.processors, sequences, prompt_len, n)
                   if kept is not None and req.output_scores else None)
    return RecapGenerateOutput(sequences=cast(torch.LongTensor, sequences), logits=logits, scores=scores,
                               recap_stats=stats.as_dict())


def _alone(req, row: _Row, ids: torch.Tensor) -> None:
    """A row alone takes the request's streamer (given its padded prompt now, as `generate`
    does) and keeps its rows for scores or logits."""
    row.streamer = req.streamer
    if row.streamer is not None and not req.streamer_has_prompt:
        row.streamer.put(ids.cpu())
    if req.keeps_rows:
        row.logit_rows = TokenRows()


def start_row(decoder, row: _Row, last: torch.Tensor, seed: tuple, capacity: int, device) -> bool:
    """A prefilled row's first token (from its prompt's last logits [V]); its session begins
    unless the row has already ended. Returns whether it decodes on."""
    first = row.chooser.choose(row.padded, last, 0)
    row.out.append(first)
    row.commit([first], last.unsqueeze(0))
    if _finished(decoder, row, first):
        return False
    row.session.begin(np.asarray(row.prompt + [first], dtype=np.int64))
    row.session.limit_new_tokens(row.req.max_new - len(row.out))
    row.session.seed(*seed)
    if not row.chooser.plain_greedy:
        row.picks = NodePicks(row.chooser, row.padded + row.out, capacity, row.session.max_nodes, device)
    return True


def step_rows(decoder, tp: TreePass, active: list[_Row], stats: GenerationStats,
              budget: BatchWidth | None, k: int) -> list[_Row]:
    """One pass for every active row; returns the rows still decoding. A row alone sizes its
    own tree and is timed (with an automatic budget)."""
    phase = stats.phase_s
    alone = len(active) == 1
    timed = alone and decoder._cost is not None
    t0 = time.perf_counter()
    if budget is not None and not alone:  # one width for the batch, from every row's ranked drafts
        width = budget.width([row.session.propose_ranked() for row in active])
        for j, row in enumerate(active):
            tp.cut(j, row.session, width - 1)
    else:
        for j, row in enumerate(active):
            tp.draft(j, row.session)
    t1 = time.perf_counter()
    tokens, positions, mask, t = tp.upload()
    t2 = time.perf_counter()
    logits = tp.forward(tokens, positions, mask)
    ta = time.perf_counter()
    pred = _picks(tp, active, logits)
    tb = time.perf_counter()
    packed = tp.packed(logits, pred)
    t3 = time.perf_counter()
    if budget is not None and not alone:
        budget.observe(len(active), t, t3 - t2)
    paths, done = [], []
    for j, row in enumerate(active):
        if row.error is not None:  # its picks failed: it keeps its root only and leaves
            paths.append(np.zeros(1, dtype=np.int64))
            done.append(True)
            continue
        n = int(tp.sizes[j])
        if timed:  # the budget controller learns from the step's pass and the last one's host time
            path, committed = row.session.observe_packed(packed[j, :n], k, t3 - t2, row.host_s)
        else:
            path, committed = row.session.observe_packed(packed[j, :n], k)
        paths.append(path)
        stats.record_step(n, len(path), row.session.last_selection if timed else None)
        if row.stats is not None:
            row.stats.record_step(n, len(path), None)
        new = committed.tolist()
        stop = False
        for i, tok in enumerate(new):
            row.out.append(tok)
            if _finished(decoder, row, tok):
                new, stop = new[:i + 1], True
                break
        if row.picks is not None:
            row.picks.commit(new)
        kept = None
        if row.logit_rows is not None:
            kept = logits[j].index_select(0, torch.from_numpy(path).to(logits.device))
        row.commit(new, kept)
        done.append(stop)
    t4 = time.perf_counter()
    tp.compact(paths, t)
    still = [j for j, d in enumerate(done) if not d]
    if len(still) < len(active):
        tp.drop(np.asarray(still, dtype=np.int64))
    t5 = time.perf_counter()
    stats.passes += 1
    for name, dt in (("draft", t1 - t0), ("pack", t2 - t1), ("forward", (ta - t2) + (t3 - tb)),
                     ("pick", tb - ta), ("update", t4 - t3), ("compact", t5 - t4)):
        phase[name] += dt  # "pick": on a CPU the processors and picks run on the host
    if timed:
        active[0].host_s = (t2 - t0) + (tb - ta) + (t5 - t3)
    return [active[j] for j in still]


def _picks(tp: TreePass, active: list[_Row], logits: torch.Tensor) -> torch.Tensor | None:
    """Each row's node picks [B, T] under sampling or processors (None: every row is plain greedy)."""
    if all(row.picks is None for row in active):
        return None
    pred = logits.argmax(dim=-1)
    for j, row in enumerate(active):
        if row.picks is not None:
            n = int(tp.sizes[j])
            depths = tp.depths[j, :n]
            try:
                pred[j, :n] = row.picks.pick(logits[j, :n], tp.tokens[j, :n], tp.parents[j, :n], depths,
                                             int(depths.max()), len(row.out))
            except Exception as e:  # noqa: BLE001 - one row's processors fail that row, not the pass
                row.error = e
    return pred


def _finished(decoder, row: _Row, tok: int) -> bool:
    req = row.req
    return tok in req.eos or len(row.out) >= req.max_new or decoder._stop(req, row.padded, row.out)


def _sequences(req, rows: list[_Row]) -> torch.Tensor:
    """[B, L + longest output]: each row's padded prompt and output, then the pad token, as
    batched `generate` returns them."""
    longest = max(len(r.out) for r in rows)
    out = torch.full((len(rows), req.input_ids.shape[1] + longest), req.pad_token_id, dtype=req.input_ids.dtype)
    out[:, : req.input_ids.shape[1]] = req.input_ids.cpu()
    for b, row in enumerate(rows):
        out[b, req.input_ids.shape[1]: req.input_ids.shape[1] + len(row.out)] = torch.tensor(row.out)
    return out.to(req.input_ids.device)

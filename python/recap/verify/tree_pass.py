"""The tree pass, in one home: what a request of B rows (B = 1 included) needs to verify
draft trees with the target model, each row its own tree, in one forward per step.

Layout. The KV slab (`recap.verify.kv_cache`) holds [layers, B, heads, capacity, head_dim]. Row b's
committed entries are the columns [0, past[b]): its left padding [0, pad[b]) (masked for
ever; only a padded prefill leaves any, see `prefill`), then its real tokens. Rows commit
different numbers of tokens per step, so their lengths are ragged; the cache's common length
W is the longest row's, and the columns [past[b], W) of a shorter row are holes, masked.
Every step writes each row's tree at the columns [W, W + T), T the largest tree of the step
(a smaller tree is padded with nodes that see only themselves; their logits are never read).
Compaction moves each row's accepted nodes to [past[b], past[b] + accepted) in one gather and
one write for all rows and layers; a row alone keeps its path with `SlabCache.keep`, which
also serves layers of different lengths (visual-token routing).

Positions are per row: a node's position id is the row's real length (its committed tokens
without padding) + depth + the family's per-row offset (M-RoPE), which is the id batched
`generate` gives the same token. Sliding-window layers mask keys by the same real index.

Rows that finish leave the batch (`drop`): the kept rows move down in place, once, after
which the finished ones cost nothing; kept in, a finished row would cost T tokens of every
later pass (measured in `drop`).

The drafters write each tree into host arrays, one row each (`Session.propose_into`); each
step stages them into buffers allocated once per batch size and tree size (pinned on CUDA,
so the uploads are asynchronous). Calibration and the conformance probe load a chain or a
small tree into row 0 (`load_tree`, `chain`) and run the same pass, so they time and test
exactly the pass decoding runs. The adapter (`recap.adapters`) supplies only facts about the
model: its layer types and window, the cache keyword, position offsets, the final norm and
head.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from recap.verify import prefill as prompt_pass
from recap.verify.cudnn_attention import without_cudnn_attention
from recap.verify.grouped_attention import grouped
from recap.verify.kv_cache import DEFAULT_CAPACITY, SlabCache
from recap.verify.prefill import Seed


def masked_value(dtype: torch.dtype) -> float:
    """The additive mask's "cannot attend" value: the dtype's most negative finite number
    (float32's for wider types, so the host block in float32 holds it exactly)."""
    return float(max(torch.finfo(dtype).min, torch.finfo(torch.float32).min))


@contextlib.contextmanager
def pass_attention(tokens: torch.Tensor) -> Iterator[None]:
    """The attention a verification pass over `tokens` runs (a tree's, a batch's): the cache's
    key/value heads are not copied per query head (`recap.verify.grouped_attention`), and on CUDA no
    cuDNN attention graph is built for each new shape (`recap.verify.cudnn_attention`)."""
    with grouped(tokens.shape[-1]), without_cudnn_attention(tokens.device):
        yield


class TreePass:
    """The verification machinery of one request of `rows` rows (see the module doc)."""

    def __init__(self, adapter, max_nodes: int, capacity: int = DEFAULT_CAPACITY, k: int = 8, rows: int = 1) -> None:
        self.adapter, self.model, self.k = adapter, adapter.model, k
        self.device = adapter.lm_head.weight.device
        self.max_nodes = max_nodes
        t = max_nodes + 1
        self.cache = SlabCache(len(adapter.layer_types), capacity, index_slots=rows * t, device=self.device)
        self.dtype = adapter.dtype
        self.masked = masked_value(self.dtype)
        self.window = adapter.sliding_window
        # Host buffers the sessions draft into, one row each (rows of C-contiguous arrays; on
        # CUDA views of pinned memory, so a row alone uploads them asynchronously as they are).
        pin = self.device.type == "cuda"

        def host(width: int, dtype: torch.dtype) -> np.ndarray:
            return torch.zeros((rows, width), dtype=dtype, pin_memory=pin).numpy()

        self.tokens, self.parents = host(t, torch.int64), host(t, torch.int64)
        self.depths, self.positions = host(t, torch.int64), host(t, torch.int64)
        self.blocks = host(t * t, torch.float32)
        self._row0: tuple | None = None  # torch views of row 0's buffers, per tree size (`_upload_alone`)
        self.sizes = np.ones(rows, dtype=np.int64)  # each row's tree size this step
        self.past = np.zeros(rows, dtype=np.int64)  # committed columns per row, padding included
        self.pad = np.zeros(rows, dtype=np.int64)
        self.offsets = np.zeros(rows, dtype=np.int64)  # the family's per-row position offset
        self.width = 0  # the cache's common length W
        self._cols = torch.arange(max(capacity, t) + t, device=self.device)
        self._staged: dict[tuple[int, int], tuple] = {}  # (rows, T) -> host staging buffers
        self._mask: torch.Tensor | None = None  # the full-attention mask, kept across steps (`masks`)
        self._dirty = 0  # columns from here up may differ from what the rows' state says
        # The sliding-window mask, kept across steps like the full one once some key falls out
        # of a window (`_windowed`): columns below `_slide_lo` are out for every node of every row.
        self._slide: torch.Tensor | None = None
        self._slide_lo = 0

    @property
    def rows(self) -> int:
        return len(self.past)

    # ---- the prompt ---------------------------------------------------------------------------
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, model_inputs: dict,
                head_share: float | None = None) -> tuple[torch.Tensor, list[Seed]]:
        """Runs the prompts (`recap.verify.prefill`: alone, one by one or padded); returns the
        last position's logits [B, V] and each row's seed rows (ids, probs, start) over its
        real tokens. Afterwards every row's committed columns are its prompt (and its padding)."""
        adapter, k = self.adapter, self.k
        if self.rows == 1 and (attention_mask is None or bool(attention_mask.all())):
            last, seeds, offset = prompt_pass.alone(adapter, self.cache, input_ids, attention_mask, model_inputs, k,
                                                    head_share)
            self.pad[:], self.past[:], self.offsets[:] = 0, input_ids.shape[1], offset
        elif attention_mask is None:
            raise ValueError(f"prefill: expected an attention mask for {self.rows} rows, got None")
        elif model_inputs or prompt_pass.one_padded_prefill(self.device):
            last, seeds, pads, offsets = prompt_pass.padded(adapter, self.cache, input_ids, attention_mask,
                                                            model_inputs, k, head_share)
            self.pad[:], self.past[:], self.offsets[:] = pads, input_ids.shape[1], offsets
        else:
            last, seeds, lengths, offsets = prompt_pass.one_by_one(adapter, self.cache, input_ids, attention_mask, k,
                                                               head_share)
            self.pad[:], self.past[:], self.offsets[:] = 0, lengths, offsets
        self.width = int(self.past.max())
        self._grow_columns(self.width)
        return last, seeds

    def join(self, prompt: torch.Tensor, head_share: float | None = None) -> tuple[torch.Tensor, Seed]:
        """One more row, between steps: its prompt [L] prefilled alone (exactly as at batch 1)
        and written at the start of a new last row of the slab (`SlabCache.append_row`: the
        rows' used width is copied once into a slab one row larger; a request joins once).
        Returns its last position's logits [V] and its seed rows, as `prefill` does per row."""
        logits, seed, row_cache, offset = prompt_pass.one_row(self.adapter, prompt, self.k, head_share)
        self.cache.append_row(row_cache, self.width, self.max_nodes + 1)

        def grown(a: np.ndarray, value: int) -> np.ndarray:
            return np.ascontiguousarray(np.concatenate([a, np.full((1, *a.shape[1:]), value, dtype=a.dtype)]))

        for name in ("tokens", "parents", "depths", "positions", "blocks"):
            setattr(self, name, grown(getattr(self, name), 0))
        self.sizes, self.past = grown(self.sizes, 1), grown(self.past, int(prompt.shape[-1]))
        self.pad, self.offsets = grown(self.pad, 0), grown(self.offsets, offset)
        self.width = int(self.past.max())
        self._set_length(self.width)
        self._staged.clear()
        self._mask = self._row0 = None  # the rows changed: the next mask is written whole
        return logits, seed

    # ---- drafting ------------------------------------------------------------------------------
    def position_base(self, b: int) -> int:
        """Row b's root position id: its real length in the cache, plus the family's offset."""
        return self.adapter.position_base(int(self.past[b] - self.pad[b]), int(self.offsets[b]))

    def draft(self, b: int, session) -> int:
        """Row b's next tree into its buffers; returns its size."""
        n, _ = session.propose_into(self.tokens[b], self.parents[b], self.depths[b], self.positions[b],
                                    self.blocks[b], self.masked, self.position_base(b))
        self.sizes[b] = n
        return n

    def cut(self, b: int, session, nodes: int) -> int:
        """Row b's ranked tree (`Session.propose_ranked`) cut to its best `nodes` nodes, into
        its buffers; returns its size."""
        n, _ = session.cut_into(nodes, self.tokens[b], self.parents[b], self.depths[b], self.positions[b],
                                self.blocks[b], self.masked, self.position_base(b))
        self.sizes[b] = n
        return n

    # ---- one verification pass ----------------------------------------------------------------
    def _staging(self, t: int) -> tuple:
        """(block [B, T, T], tokens, positions, depths [B, T]) host buffers for this batch and
        tree size, as tensors and as numpy views of them; allocated once (pinned on CUDA)."""
        key = (self.rows, t)
        got = self._staged.get(key)
        if got is None:
            pin = self.device.type == "cuda"
            tensors = (torch.empty((self.rows, t, t), dtype=torch.float32, pin_memory=pin),
                       *(torch.empty((self.rows, t), dtype=torch.int64, pin_memory=pin) for _ in range(3)))
            got = self._staged[key] = (tensors, tuple(x.numpy() for x in tensors))
        return got

    def upload(self) -> tuple[torch.Tensor, torch.Tensor, object, int]:
        """(tokens [B, T], position ids [B, T], mask, T) of the loaded trees on the device."""
        if self.rows == 1:
            return self._upload_alone()
        rows, t = self.rows, int(self.sizes.max())
        tensors, (block, tokens, positions, depths) = self._staging(t)
        block.fill(self.masked)
        depths.fill(0)
        diag = np.arange(t)
        for b in range(rows):
            n = int(self.sizes[b])
            block[b, :n, :n] = self.blocks[b, : n * n].reshape(n, n)
            block[b, diag[n:], diag[n:]] = 0.0  # padding nodes see only themselves
            tokens[b, :n], tokens[b, n:] = self.tokens[b, :n], self.tokens[b, 0]
            positions[b, :n], positions[b, n:] = self.positions[b, :n], self.positions[b, 0]
            depths[b, :n] = self.depths[b, :n]
        dev = self.device
        block_t, tokens_t, positions_t, depths_t = (x.to(dev, non_blocking=True) for x in tensors)
        # The mask takes the model's dtype (a new tensor whenever that is not float32 or the
        # device not the host; on a CPU in float32 the staged block itself, copied into the mask).
        block_t = block_t.to(self.adapter.dtype)
        return tokens_t, positions_t, self.masks(block_t, depths_t, t), t

    def _upload_alone(self) -> tuple[torch.Tensor, torch.Tensor, object, int]:
        """`upload` for a row alone: its buffers as they are (views; copies only to an
        accelerator), and its mask from a handful of calls: right after a forward on a CPU
        each torch call costs 10-25 us."""
        if self._row0 is None:
            self._row0 = ({}, tuple(torch.from_numpy(a[0]) for a in (self.tokens, self.positions, self.depths,
                                                                      self.blocks)))
        n = int(self.sizes[0])
        views, whole = self._row0
        got = views.get(n)
        if got is None:  # views made once per tree size
            tokens, positions, depths, block = whole
            got = views[n] = (tokens[:n].unsqueeze(0), positions[:n].unsqueeze(0), depths[:n].unsqueeze(0),
                              block[: n * n].view(n, n))
        tokens, positions, depths, block = got
        if self.device.type != "cpu":
            tokens, positions, depths, block = (x.to(self.device, non_blocking=True)
                                                for x in (tokens, positions, depths, block))
        w = self.width
        buf = self._mask_buffer(n, self.dtype)
        lo = max(self._dirty, int(self.pad[0]))  # the row's padding stays masked
        if lo < w:
            buf[0, 0, :, lo:w].zero_()  # columns committed since the last step
        buf[0, 0, :n, w:w + n].copy_(block)
        self._dirty = w
        full = buf[:, :, :n, :w + n]
        return tokens, positions, self._windowed(full, depths, n, lo), n

    def _mask_buffer(self, t: int, dtype: torch.dtype) -> torch.Tensor:
        """The full-attention mask buffer [B, 1, max nodes + 1, capacity], kept across steps,
        reallocated (every column masked, to be rewritten) when it is too small."""
        w, buf = self.width, self._mask
        if buf is None or buf.shape[0] != self.rows or buf.shape[-1] < w + t:
            cap = max(w + t, 2 * (buf.shape[-1] if buf is not None else 0), 64)
            buf = self._mask = torch.full((self.rows, 1, self.max_nodes + 1, cap), self.masked, dtype=dtype,
                                          device=self.device)
            self._dirty = 0
            self._slide = None  # rewritten whole from the new buffer when first needed
        return buf

    def masks(self, block: torch.Tensor, depths: torch.Tensor, t: int):
        """[B, 1, T, W + T] additive: each row's own committed columns, then its tree block;
        for sliding-window layers also the keys outside each node's window. One per layer
        type for models with both.

        The full-attention mask is a view of one buffer kept across steps, of which a step
        rewrites only the columns that changed: those the last step's trees held and the
        ones rows committed since (a few columns, whatever the context), then its own tree
        block. Each torch call costs 10-25 us right after a forward on a CPU, so the step's
        mask is a handful of them, not one per context column."""
        w, masked = self.width, self.masked
        buf = self._mask_buffer(t, block.dtype)
        lo = self._dirty  # the lowest column a row's commits or the last trees may have changed
        if lo < w:
            cols = self._cols[lo:w]
            past = torch.from_numpy(self.past).to(self.device).unsqueeze(1)
            pad = torch.from_numpy(self.pad).to(self.device).unsqueeze(1)
            seen = (cols.unsqueeze(0) >= pad) & (cols.unsqueeze(0) < past)  # [B, w - lo]
            buf[:, 0, :, lo:w] = torch.where(seen, 0.0, masked).to(buf.dtype).unsqueeze(1)
        buf[:, 0, :t, w:w + t] = block
        # Next step rewrites from the first column any row may commit into (the trees' own
        # columns are above it).
        self._dirty = min(w, int(self.past.min()))
        return self._windowed(buf[:, :, :t, :w + t], depths, t, lo)

    def _windowed(self, full: torch.Tensor, depths: torch.Tensor, t: int, lo: int):
        """The mask per layer type: `full` (of which this step rewrote the columns from `lo`
        up), and for sliding-window layers the same that also hides the keys outside each
        node's window. While every key lies inside every window that is `full` itself."""
        types = self.adapter.mask_types
        if self.window is None:
            return full
        # The last column a node of this step may not see: node i's depth is at most i (parents
        # come first), so below t.
        hi = int(self.past.max()) + t - 1 - self.window
        sliding = full if hi < 0 and self._slide is None else self._slid(depths, t, lo, hi)
        if len(types) == 1:
            return sliding if types[0] == "sliding_attention" else full
        return {"full_attention": full, "sliding_attention": sliding}

    def _slid(self, depths: torch.Tensor, t: int, lo: int, hi: int) -> torch.Tensor:
        """The sliding-window mask, a second buffer kept across steps: of its columns a step
        rewrites only those the full mask rewrote and the window's edge (the keys whose side
        of the window depends on a node's depth), and masks the ones that fell out since.

        Key column c of row b has real index c - pad; node i's is past - pad + depth[i]; the key
        is out of the node's window when c <= past + depth[i] - window. Every column an earlier
        step masked for node row i (c <= its past + i - window) is then at most this step's
        `hi` or below `band`, so nothing a deeper node once hid stays hidden from a shallower one."""
        full, w, win, masked = self._mask, self.width, self.window, self.masked
        assert full is not None and win is not None
        if self._slide is None:
            self._slide, self._slide_lo, lo = full.clone(), 0, 0
        out = self._slide
        band = max(0, int(self.past.min()) - win + 1)  # below: out for every node of every row
        start = min(self._slide_lo, lo)
        if start < band:
            out[:, 0, :, start:band] = masked
        edge = min(w, hi + 1)
        if band < edge:  # the window's edge: copied, then masked node by node
            out[:, 0, :, band:edge] = full[:, 0, :, band:edge]
            past = torch.from_numpy(self.past).to(self.device).view(-1, 1, 1)
            last_out = past + depths.unsqueeze(-1) - win  # [B, T, 1]
            out[:, 0, :t, band:edge].masked_fill_(self._cols[band:edge].view(1, 1, -1) <= last_out, masked)
        first = max(lo, edge, band)
        out[:, 0, :, first:w + t] = full[:, 0, :, first:w + t]  # what the step wrote, inside every window
        if t - 1 >= win:  # a tree deeper than the window: its deep nodes lose its shallow ones
            out_tree = depths.unsqueeze(1) <= depths.unsqueeze(2) - win  # [B, T(query), T(key)]
            out[:, 0, :t, w:w + t].masked_fill_(out_tree, masked)
        self._slide_lo = band
        return out[:, :, :t, :w + t]

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask) -> torch.Tensor:
        """Logits [B, T, V] of the loaded trees after each row's committed prefix."""
        kw = {self.adapter.cache_keyword: self.cache, "use_cache": True}
        with pass_attention(tokens):
            return self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, **kw).logits

    def packed(self, logits: torch.Tensor, pred: torch.Tensor | None = None) -> np.ndarray:
        """[B, T, 1 + 2k]: each node's pick (the argmax unless `pred` [B, T] gives them),
        top-k ids and probabilities, in one transfer."""
        pred = logits.argmax(dim=-1) if pred is None else pred
        probs, ids = torch.softmax(logits.float(), dim=-1).topk(self.k, dim=-1)
        dt = torch.float32 if logits.shape[-1] < (1 << 24) else torch.float64
        return torch.cat([pred.unsqueeze(-1).to(dt), ids.to(dt), probs.to(dt)], dim=-1).cpu().numpy()

    # ---- a given tree in row 0: calibration and the conformance probe ------------------------
    def load_tree(self, tokens, parents) -> tuple[int, int]:
        """A given tree (preorder, parents before children, root first) into row 0, exactly as
        a drafter would write it; returns (T, the deepest depth)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        parents = np.asarray(parents, dtype=np.int64)
        n = len(tokens)
        if not 1 <= n <= self.max_nodes + 1:
            raise ValueError(f"tree: expected 1..{self.max_nodes + 1} nodes, got {n}")
        depths = np.zeros(n, dtype=np.int64)
        seen = np.eye(n, dtype=bool)
        for i in range(1, n):
            depths[i] = depths[parents[i]] + 1
            seen[i] |= seen[parents[i]]
        self.tokens[0, :n], self.parents[0, :n], self.depths[0, :n] = tokens, parents, depths
        self.positions[0, :n] = depths + self.position_base(0)
        self.blocks[0, : n * n] = np.where(seen, 0.0, self.masked).astype(np.float32).reshape(-1)
        self.sizes[0] = n
        return n, int(depths.max())

    def load_chain(self, tokens) -> tuple[int, int]:
        n = len(tokens)
        return self.load_tree(tokens, np.arange(-1, n - 1))

    def verify(self, n: int, deepest: int = 0) -> torch.Tensor:
        """Logits [T, V] of the tree loaded into row 0 (of a one-row pass)."""
        tokens, positions, mask, _ = self.upload()
        return self.forward(tokens, positions, mask)[0, :n]

    def chain(self, tokens) -> np.ndarray:
        """One decoding-shaped pass over a chain of `tokens` (calibration), packed like a
        step's; the cache is left as it was."""
        n, deepest = self.load_chain(tokens)
        out = self.packed(self.verify(n, deepest))
        self.discard(n)
        return out

    def discard(self, n: int) -> None:
        """Drops the tree just verified (its last `n` entries) from the cache."""
        self.cache.crop(-n)

    # ---- after the pass -------------------------------------------------------------------------
    def compact(self, paths: list[np.ndarray], t: int) -> None:
        """Row b keeps its root and accepted nodes `paths[b]` (tree indices, 0 first) of the
        trees just written at [W, W + T): they move to [past[b], past[b] + len) in one gather
        and one write; the cache's common length becomes the longest row's. A row alone keeps its
        path with `SlabCache.keep` (layers of different lengths included)."""
        if self.rows == 1:
            self.cache.keep(paths[0], t)
            self.past += len(paths[0])
            self.width = int(self.past[0])
            self._grow_columns(self.width)
            return
        w = self.width
        rows = np.concatenate([np.full(len(p), b, dtype=np.int64) for b, p in enumerate(paths)])
        src = np.concatenate([w + p for p in paths])
        dst = np.concatenate([self.past[b] + np.arange(len(p)) for b, p in enumerate(paths)])
        moved = src != dst
        if moved.any():
            self._move(rows[moved], src[moved], dst[moved])
        self.past += np.array([len(p) for p in paths], dtype=np.int64)
        self.width = int(self.past.max())
        self._set_length(self.width)

    def _move(self, rows: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
        r, s, d = (torch.from_numpy(x).to(self.device) for x in (rows, src, dst))
        self.cache.move_entries(r, s, d)

    def _set_length(self, length: int) -> None:
        # The slab grows (by doubling) only when a pass writes past its capacity, so a row
        # that accepted past its last token and is about to leave grows nothing.
        self.cache.set_length(length)
        self._grow_columns(length)

    def _grow_columns(self, length: int) -> None:
        if self._cols.shape[0] < length + self.max_nodes + 1:
            self._cols = torch.arange(2 * (length + self.max_nodes + 1), device=self.device)

    def drop(self, keep: np.ndarray) -> None:
        """Keeps only the rows `keep` (indices, increasing). Kept rows move down in place, over
        the used width only, and the buffers become views of their first rows: no allocation,
        and a copy of at most the rows after the first dropped one. (On a 2-core CPU with 900
        committed tokens: 24 ms to drop the first of 8 rows, once; a copy of the whole slab of
        2,048 slots took 2.4 s; keeping a finished row in the batch instead costs 20-35 ms of
        every later pass at B = 4.)"""
        if len(keep) == 0:
            return  # the batch has ended: nothing to keep
        self.cache.keep_rows(keep.tolist(), self.width)
        self._staged.clear()
        self._mask = self._row0 = None
        for name in ("tokens", "parents", "depths", "positions", "blocks", "sizes", "past", "pad", "offsets"):
            setattr(self, name, np.ascontiguousarray(getattr(self, name)[keep]))
        self.width = int(self.past.max())
        self._set_length(self.width)

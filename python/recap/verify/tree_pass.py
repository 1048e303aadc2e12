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
import threading
import time
from collections.abc import Iterator

import numpy as np
import torch

from recap.verify import seeding
from recap.verify.cudnn_attention import without_cudnn_attention
from recap.verify.grouped_attention import grouped
from recap.verify.kv_cache import DEFAULT_CAPACITY, SlabCache, SlabLayer


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


def prompt_forward(adapter, cache, input_ids, attention_mask, inputs: dict, capture_hidden: bool,
                   layer_hook=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One prefill forward into `cache`: (the last position's logits [B, V], the final hidden
    states [B, L, hidden] when `capture_hidden`, taken at the last norm, so the head never
    runs over the whole prompt here). `layer_hook` is a forward hook for every decoder layer.
    Hooks act only on this thread's forward: the model is shared with other threads."""
    captured: list[torch.Tensor] = []
    me = threading.get_ident()

    def capture(_m, _i, o):
        if threading.get_ident() == me:
            captured.append(o)

    norm = adapter.final_norm if capture_hidden else None
    handles = [norm.register_forward_hook(capture)] if norm is not None else []
    if layer_hook is not None:
        handles += [layer.register_forward_hook(layer_hook) for layer in adapter.decoder_layers]
    try:
        out = adapter.model(input_ids=input_ids, attention_mask=attention_mask, **{adapter.cache_keyword: cache},
                            use_cache=True, logits_to_keep=1, **inputs)
    finally:
        for handle in handles:
            handle.remove()
    return out.logits[:, -1], (captured[-1] if captured else None)


def _zero_padding(pads: torch.Tensor, thread: int):
    """A decoder-layer hook that zeroes the hidden states at padding positions. Padding
    queries see no key, and some attention implementations (eager, with a sliding window)
    turn such rows into NaN, which the next layer's keys and values would carry into every
    row (a masked weight is 0, but 0 x NaN is NaN). Real tokens never attend to padding, so
    their states are unchanged."""

    def hook(_m, _i, out):
        if threading.get_ident() != thread:
            return None
        hidden = out[0] if isinstance(out, tuple) else out
        if hidden.shape[:2] != pads.shape:
            return None
        hidden = hidden.masked_fill(pads.unsqueeze(-1).to(hidden.device), 0.0)
        return (hidden, *out[1:]) if isinstance(out, tuple) else hidden

    return hook


def one_padded_prefill(device: torch.device) -> bool:
    """Whether a batch of text prompts is prefilled as one left-padded pass rather than one
    pass per row: on an accelerator, not on a CPU.

    A CPU's pass costs what its tokens cost, so padding every row to the longest one is paid
    in full: 4 shipped prompts of 78-757 tokens took 4.1 s padded against 1.4 s one by one on
    a 2-core CPU. An accelerator's pass at these sizes is bound by launching its kernels, so
    a pass per row costs a whole pass per row: on an H200 (a 7B-shaped model in bfloat16) 32
    rows of 72-310 tokens took 625 ms one by one and 248 ms as one padded pass, 8 rows 182 ms
    and 64 ms (docs/results/gpu.md)."""
    return device.type != "cpu"


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

    @property
    def rows(self) -> int:
        return len(self.past)

    # ---- the prompt ---------------------------------------------------------------------------
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, model_inputs: dict,
                head_share: float | None = None) -> tuple[torch.Tensor, list[tuple[np.ndarray, np.ndarray, int]]]:
        """Runs the prompts; returns the last position's logits [B, V] and each row's seed
        rows (ids, probs, start) over its real tokens, as `TreePass.prefill`.

        On a CPU, text prompts are prefilled one row at a time, each exactly as at batch 1, and
        land at the start of their cache rows (no padding in the cache: rows are ragged from
        the start). Prompts with model inputs (images), and every batch on an accelerator, run
        as one left-padded batch, as batched `generate` runs them (`one_padded_prefill`). A
        row alone without padding (its images too) is prefilled straight into the slab."""
        if self.rows == 1 and (attention_mask is None or bool(attention_mask.all())):
            return self._alone_prefill(input_ids, attention_mask, model_inputs, head_share)
        if attention_mask is None:
            raise ValueError(f"prefill: expected an attention mask for {self.rows} rows, got None")
        if model_inputs or one_padded_prefill(self.device):
            return self._padded_prefill(input_ids, attention_mask, model_inputs, head_share)
        lengths = attention_mask.sum(dim=1).tolist()
        width = int(max(lengths))
        rows = [input_ids[b, input_ids.shape[1] - n:] for b, n in enumerate(lengths)]
        keys: list[list[torch.Tensor]] = []
        values: list[list[torch.Tensor]] = []
        last, seeds = [], []
        for b, row in enumerate(rows):
            cache = SlabCache(len(self.adapter.layer_types), int(lengths[b]))
            logits, hidden = self._run(row.unsqueeze(0), None, {}, cache, head_share is not None)
            last.append(logits[0])
            seeds.append(self._seed_rows(None if hidden is None else hidden[0], head_share))
            if b == 0:
                keys = [[] for _ in cache.layers]
                values = [[] for _ in cache.layers]
            for i, layer in enumerate(cache.layers):
                assert isinstance(layer, SlabLayer) and layer.keys is not None and layer.values is not None
                keys[i].append(layer.keys)
                values[i].append(layer.values)
            self.offsets[b] = self.adapter.position_offset()
        for i in range(len(keys)):  # each layer's rows, start-aligned, written once into the slab
            k0, v0 = keys[i][0], values[i][0]
            k = k0.new_zeros((len(rows), *k0.shape[1:-2], width, k0.shape[-1]))
            v = v0.new_zeros((len(rows), *v0.shape[1:-2], width, v0.shape[-1]))
            for b in range(len(rows)):
                n = keys[i][b].shape[-2]
                k[b, ..., :n, :] = keys[i][b][0]
                v[b, ..., :n, :] = values[i][b][0]
            self.cache.update(k, v, i)
        self.pad[:] = 0
        self.past[:] = lengths
        self.width = width
        return torch.stack(last), seeds

    def _alone_prefill(self, input_ids, attention_mask, model_inputs: dict, head_share: float | None):
        """One unpadded prompt into row 0 of the slab. How many of its last positions seed
        the memories follows the head's measured cost, and that seeding's real cost corrects
        the share the next prompts are seeded by (`recap.verify.seeding`)."""
        t0 = time.perf_counter()
        logits, hidden = prompt_forward(self.adapter, self.cache, input_ids, attention_mask, model_inputs,
                                        capture_hidden=head_share is not None)
        length = input_ids.shape[1]
        self.past[:], self.pad[:], self.width = length, 0, length
        self.offsets[0] = self.adapter.position_offset()
        self._grow_columns(length)
        n = 0 if hidden is None or head_share is None else seeding.positions(length, head_share)
        seeded = hidden[0, length - n:] if hidden is not None and n else None
        if n:
            _synchronize(logits.device)
        t1 = time.perf_counter()
        rows = seeding.top_rows(self.adapter, seeded, self.k)  # ends with a copy to the host
        if n:
            seeding.observe(self.adapter, length, t1 - t0, n, time.perf_counter() - t1)
        return logits, [(*rows, length - n)]

    def join(self, prompt: torch.Tensor, head_share: float | None = None) -> tuple[torch.Tensor, tuple]:
        """One more row, between steps: its prompt [L] prefilled alone (exactly as at batch 1)
        and written at the start of a new last row of the slab (`SlabCache.append_row`: the
        rows' used width is copied once into a slab one row larger; a request joins once).
        Returns its last position's logits [V] and its seed rows, as `prefill` does per row."""
        n = int(prompt.shape[-1])
        row_cache = SlabCache(len(self.adapter.layer_types), n)
        logits, hidden = self._run(prompt.reshape(1, n), None, {}, row_cache, head_share is not None)
        offset = self.adapter.position_offset()
        seed = self._seed_rows(None if hidden is None else hidden[0], head_share)
        t = self.max_nodes + 1
        self.cache.append_row(row_cache, self.width, t)

        def grown(a: np.ndarray, value: int) -> np.ndarray:
            return np.ascontiguousarray(np.concatenate([a, np.full((1, *a.shape[1:]), value, dtype=a.dtype)]))

        for name in ("tokens", "parents", "depths", "positions", "blocks"):
            setattr(self, name, grown(getattr(self, name), 0))
        self.sizes, self.past = grown(self.sizes, 1), grown(self.past, n)
        self.pad, self.offsets = grown(self.pad, 0), grown(self.offsets, offset)
        self.width = int(self.past.max())
        self._set_length(self.width)
        self._staged.clear()
        self._mask = self._row0 = None  # the rows changed: the next mask is written whole
        return logits[0], seed

    def _run(self, input_ids, attention_mask, inputs: dict, cache, seed_rows: bool):
        """One prefill forward into `cache` (`tree_pass.prompt_forward`), padding rows zeroed."""
        pads = None if attention_mask is None else attention_mask == 0
        hook = _zero_padding(pads, threading.get_ident()) if pads is not None and bool(pads.any()) else None
        return prompt_forward(self.adapter, cache, input_ids, attention_mask, inputs, seed_rows, hook)

    def _padded_prefill(self, input_ids, attention_mask, model_inputs: dict, head_share: float | None):
        """The prompts as one left-padded batch, with the position ids batched `generate`
        gives them."""
        inputs = dict(model_inputs)
        if "position_ids" not in inputs:
            inputs["position_ids"] = self.model._prepare_position_ids_for_generation(
                input_ids, {"attention_mask": attention_mask, **inputs})
        last, hidden = self._run(input_ids, attention_mask, inputs, self.cache, head_share is not None)
        self.pad[:] = (attention_mask == 0).sum(dim=1).cpu().numpy()
        self.past[:] = input_ids.shape[1]
        self.width = input_ids.shape[1]
        self.offsets[:] = self.adapter.position_offsets(self.rows)
        seeds = [self._seed_rows(None if hidden is None else hidden[b, int(self.pad[b]):], head_share)
                 for b in range(self.rows)]
        return last, seeds

    def _seed_rows(self, hidden: torch.Tensor | None, head_share: float | None):
        """(ids, probs, start) for a row's real positions `hidden` [n, hidden] (see `recap.verify.seeding`)."""
        if hidden is None or head_share is None:
            return (*seeding.top_rows(self.adapter, None, self.k), 0)
        n = seeding.positions(hidden.shape[0], head_share)
        return (*seeding.top_rows(self.adapter, hidden[hidden.shape[0] - n:], self.k), hidden.shape[0] - n)

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
        return tokens, positions, self._windowed(full, depths, n), n

    def _mask_buffer(self, t: int, dtype: torch.dtype) -> torch.Tensor:
        """The full-attention mask buffer [B, 1, max nodes + 1, capacity], kept across steps,
        reallocated (every column masked, to be rewritten) when it is too small."""
        w, buf = self.width, self._mask
        if buf is None or buf.shape[0] != self.rows or buf.shape[-1] < w + t:
            cap = max(w + t, 2 * (buf.shape[-1] if buf is not None else 0), 64)
            buf = self._mask = torch.full((self.rows, 1, self.max_nodes + 1, cap), self.masked, dtype=dtype,
                                          device=self.device)
            self._dirty = 0
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
        return self._windowed(buf[:, :, :t, :w + t], depths, t)

    def _windowed(self, full: torch.Tensor, depths: torch.Tensor, t: int):
        """The mask per layer type: `full`, and for sliding-window layers a copy that also
        hides the keys outside each node's window."""
        w, masked = self.width, self.masked
        types = self.adapter.mask_types
        if self.window is None:
            return full
        # Key column c of row b has real index c - pad; node i's is past - pad + depth[i]; a key
        # is inside the window when its index > the node's - window.
        win = self.window
        past = torch.from_numpy(self.past).to(self.device).unsqueeze(1)
        lo = (past + depths - win).unsqueeze(-1)  # [B, T, 1]: committed keys at or before lo fall out
        out_prefix = self._cols[:w].view(1, 1, -1) <= lo
        out_tree = depths.unsqueeze(1) <= depths.unsqueeze(2) - win  # [B, T(query), T(key)]
        sliding = full.clone()
        sliding[:, 0, :, :w].masked_fill_(out_prefix, masked)
        sliding[:, 0, :, w:].masked_fill_(out_tree, masked)
        if len(types) == 1:
            return sliding if types[0] == "sliding_attention" else full
        return {"full_attention": full, "sliding_attention": sliding}

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


def _synchronize(device: torch.device) -> None:
    """Waits for the device's queued work (a CUDA forward returns before it has run)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)

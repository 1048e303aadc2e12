"""The tree pass, in one home: everything one request needs to verify draft trees with the
target model, built once per request.

`TreePass` owns the request's KV slab (`recap.verify.kv_cache`), the step buffers the drafter
writes each tree into (`recap.verify.step_buffers`), every attention mask (the committed-prefix
placement and the tree block, and for sliding-window layers a second preallocated buffer),
the prefill (with the top-K rows that seed the memories), the forward call, the on-device
top-k packing and the compaction of the cache to the accepted path. Calibration and the
conformance probe load a chain or a small tree into the same buffers and run the same
`verify`, so they time and test exactly the pass decoding runs.

The adapter (`recap.adapters`) supplies only facts about the model: its layer types and
window, the cache keyword, position offsets, the final norm and head.
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
from recap.verify.kv_cache import DEFAULT_CAPACITY, SlabCache
from recap.verify.step_buffers import StepBuffers


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


class _SlidingMask:
    """The sliding-window layers' mask, in its own preallocated buffer: each step copies the
    full-attention mask's used block and masks what lies outside each node's window (keys
    at or before its own index - window, the index it would have had when generated one
    token at a time). Only tiny index tensors are made per step, never a [T, context] one."""

    def __init__(self, window: int, like: torch.Tensor, max_nodes: int, masked: float) -> None:
        self.window, self.masked = window, masked
        self.buffer = torch.zeros_like(like)
        self.cols = torch.arange(max_nodes + 1, device=like.device)

    def apply(self, full: torch.Tensor, depths: torch.Tensor, past: int, deepest: int) -> torch.Tensor:
        w = self.window
        lo = past - w + 1  # committed keys before lo are outside every node's window
        if lo + deepest <= 0:
            return full  # no node's window starts inside the sequence
        n, width = full.shape[-2], full.shape[-1]
        if self.buffer.shape[-1] < width:
            self.buffer = full.new_zeros((*full.shape[:-1], max(width, 2 * self.buffer.shape[-1])))
        out = self.buffer[:, :, :n, :width]
        out.copy_(full)
        grid = out[0, 0]
        if lo > 0:
            grid[:, :lo].fill_(self.masked)
        start, stop = max(lo, 0), min(lo + deepest, past)
        if stop > start:  # the band where windows differ by depth: key j is out iff j - lo < depth
            offsets = self.cols[start - lo:stop - lo]
            grid[:, start:stop].masked_fill_(depths.unsqueeze(1) > offsets.unsqueeze(0), self.masked)
        if deepest >= w:  # a tree deeper than the window: tree keys can fall out too
            grid[:, past:past + n].masked_fill_(depths.unsqueeze(0) <= depths.unsqueeze(1) - w, self.masked)
        return out


class TreePass:
    """One request's verification machinery (see the module doc)."""

    def __init__(self, adapter, max_nodes: int, capacity: int = DEFAULT_CAPACITY, k: int = 8) -> None:
        self.adapter, self.model, self.k = adapter, adapter.model, k
        self.device = adapter.lm_head.weight.device
        self.max_nodes = max_nodes
        self.cache = SlabCache(len(adapter.layer_types), capacity, index_slots=max_nodes + 1, device=self.device)
        self.bufs = StepBuffers(max_nodes, capacity, adapter.dtype, self.device)
        window = adapter.sliding_window
        self.sliding = None if window is None else _SlidingMask(window, self.bufs.mask, max_nodes, self.bufs.masked)
        self.past = 0  # committed entries in the cache
        self.offset = 0  # the family's position offset, read after the prefill (M-RoPE)

    # ---- the prompt ---------------------------------------------------------------------
    def prefill(self, input_ids: torch.Tensor, attention_mask, model_inputs: dict, head_share: float | None = None):
        """Runs the prompt; returns (the last position's logits, the seed rows (ids, probs,
        start): the top-K after the prompt's positions start.. as numpy arrays, none when
        `head_share` is None). How many of the last positions are seeded follows the head's
        measured cost (`recap.verify.seeding`). Final hidden states are captured at the last norm and
        the head runs over them in chunks, so full-vocabulary logits are never held for the
        whole prompt."""
        t0 = time.perf_counter()
        logits, hidden = prompt_forward(self.adapter, self.cache, input_ids, attention_mask, model_inputs,
                                        capture_hidden=head_share is not None)
        length = input_ids.shape[1]
        self.past = length
        self.offset = self.adapter.position_offset()
        n = 0 if hidden is None or head_share is None else seeding.positions(length, head_share)
        seeded = hidden[0, length - n:] if hidden is not None and n else None
        if n:
            _synchronize(logits.device)
        t1 = time.perf_counter()
        rows = seeding.top_rows(self.adapter, seeded, self.k)  # ends with a copy to the host
        if n:  # the seeding's real cost, to correct the share the next prompts are seeded by
            seeding.observe(self.adapter, length, t1 - t0, n, time.perf_counter() - t1)
        return logits[0], (*rows, length - n)

    # ---- loading a tree into the buffers ----------------------------------------------------
    def draft(self, session) -> tuple[int, int]:
        """The session's next tree into the buffers; returns (T, the deepest depth)."""
        return self.bufs.draft(session, self.adapter.position_base(self.past, self.offset))

    def load_tree(self, tokens, parents) -> tuple[int, int]:
        """A given tree (preorder, parents before children, root first) into the buffers,
        exactly as a drafter would write it: for calibration and the conformance probe."""
        tokens = np.asarray(tokens, dtype=np.int64)
        parents = np.asarray(parents, dtype=np.int64)
        n = len(tokens)
        if not 1 <= n <= self.max_nodes + 1:
            raise ValueError(f"tree: expected 1..{self.max_nodes + 1} nodes, got {n}")
        b = self.bufs
        depths = np.zeros(n, dtype=np.int64)
        seen = np.eye(n, dtype=bool)
        for i in range(1, n):
            depths[i] = depths[parents[i]] + 1
            seen[i] |= seen[parents[i]]
        b.tokens[:n], b.parents[:n], b.depths[:n] = tokens, parents, depths
        b.positions[:n] = depths + self.adapter.position_base(self.past, self.offset)
        b.block[: n * n] = np.where(seen, 0.0, b.masked).astype(np.float32).reshape(-1)
        return n, int(depths.max())

    def load_chain(self, tokens) -> tuple[int, int]:
        n = len(tokens)
        return self.load_tree(tokens, np.arange(-1, n - 1))

    # ---- one verification pass ---------------------------------------------------------------
    def masks(self, n: int, deepest: int, depths: torch.Tensor):
        """The mask the model takes for this tree: [1, 1, T, past + T] additive, or one per
        layer type for models with both full and sliding-window layers."""
        full = self.bufs.full_mask(n, self.past)
        types = self.adapter.mask_types
        if self.sliding is None:
            return full
        sliding = self.sliding.apply(full, depths, self.past, deepest)
        if len(types) == 1:
            return sliding if types[0] == "sliding_attention" else full
        return {"full_attention": full, "sliding_attention": sliding}

    def upload(self, n: int, deepest: int):
        """(tokens [1, T], position ids [1, T], mask) on the device for the loaded tree."""
        tokens, depths, positions = self.bufs.upload(n)
        return tokens, positions, self.masks(n, deepest, depths)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask) -> torch.Tensor:
        """Logits [T, V] of the loaded tree after the committed prefix."""
        kw = {self.adapter.cache_keyword: self.cache, "use_cache": True}
        with pass_attention(tokens):
            return self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, **kw).logits[0]

    def verify(self, n: int, deepest: int) -> torch.Tensor:
        return self.forward(*self.upload(n, deepest))

    def packed(self, logits: torch.Tensor, pred: torch.Tensor | None = None) -> np.ndarray:
        """Each node's pick (the argmax unless `pred` gives the processed or sampled picks),
        top-k ids and top-k probabilities per node, moved to the host in one transfer."""
        pred = logits.argmax(dim=-1) if pred is None else pred
        probs, ids = torch.softmax(logits.float(), dim=-1).topk(self.k, dim=-1)
        # Token ids < 2**24 are exact in float32; larger vocabularies go through float64.
        dt = torch.float32 if logits.shape[-1] < (1 << 24) else torch.float64
        return torch.cat([pred.unsqueeze(-1).to(dt), ids.to(dt), probs.to(dt)], dim=-1).cpu().numpy()

    def chain(self, tokens) -> np.ndarray:
        """One decoding-shaped pass over a chain of `tokens` (calibration), packed like a
        step's; the cache is left as it was."""
        n, deepest = self.load_chain(tokens)
        out = self.packed(self.verify(n, deepest))
        self.discard(n)
        return out

    # ---- after the pass ------------------------------------------------------------------------
    def compact(self, path: np.ndarray, n: int) -> None:
        """Keep the committed prefix, the root and the accepted nodes `path` of the tree just
        verified (its last `n` cache entries)."""
        self.cache.keep(path, n)
        self.past += len(path)

    def discard(self, n: int) -> None:
        """Drop the tree just verified from the cache."""
        self.cache.crop(-n)


def _synchronize(device: torch.device) -> None:
    """Waits for the device's queued work (a CUDA forward returns before it has run)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)

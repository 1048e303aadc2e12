"""The prompt pass: how a request's prompts get into the KV slab before the first step
(`recap.verify.tree_pass.TreePass.prefill` and `join` call these and keep the rows' state).

Three shapes, by what the rows are and where they run:
- a row alone without padding (its images too): straight into row 0 of the slab (`alone`);
- text rows on a CPU: one row at a time, each exactly as at batch 1, start-aligned in the
  slab, so the cache holds no padding (`one_by_one`; `join` uses the same for a row that
  joins a running batch);
- prompts with model inputs (images), and every batch on an accelerator: one left-padded
  batch, with the position ids batched `generate` gives them (`padded`).
Each returns the last position's logits, each row's seed rows (ids, probs, start) over its
real tokens (`recap.verify.seeding`) and each row's position offset, which the adapter can tell
only right after the prompt's forward (`ModelAdapter.position_offset`).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from recap.verify import seeding
from recap.verify.kv_cache import SlabCache, SlabLayer

Seed = tuple[np.ndarray, np.ndarray, int]


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


def alone(adapter, cache, input_ids, attention_mask, model_inputs: dict, k: int,
          head_share: float | None) -> tuple[torch.Tensor, list[Seed], int]:
    """One unpadded prompt into row 0 of `cache`. How many of its last positions seed the
    memories follows the head's measured cost, and that seeding's real cost corrects the
    share the next prompts are seeded by (`recap.verify.seeding`)."""
    t0 = time.perf_counter()
    logits, hidden = prompt_forward(adapter, cache, input_ids, attention_mask, model_inputs,
                                    capture_hidden=head_share is not None)
    offset = adapter.position_offset()
    length = input_ids.shape[1]
    n = 0 if hidden is None or head_share is None else seeding.positions(length, head_share)
    seeded = hidden[0, length - n:] if hidden is not None and n else None
    if n and logits.device.type == "cuda":
        torch.cuda.synchronize(logits.device)  # a CUDA forward returns before it has run
    t1 = time.perf_counter()
    rows = seeding.top_rows(adapter, seeded, k)  # ends with a copy to the host
    if n:
        seeding.observe(adapter, length, t1 - t0, n, time.perf_counter() - t1)
    return logits, [(*rows, length - n)], offset


def one_row(adapter, prompt: torch.Tensor, k: int,
            head_share: float | None) -> tuple[torch.Tensor, Seed, SlabCache, int]:
    """A prompt [L] prefilled alone, exactly as at batch 1, into a cache of its own: its last
    logits [V], its seed rows, that cache and its position offset."""
    n = int(prompt.shape[-1])
    cache = SlabCache(len(adapter.layer_types), n)
    logits, hidden = _run(adapter, prompt.reshape(1, n), None, {}, cache, head_share is not None)
    offset = adapter.position_offset()
    return logits[0], seed_rows(adapter, None if hidden is None else hidden[0], k, head_share), cache, offset


def one_by_one(adapter, slab, input_ids, attention_mask, k: int, head_share: float | None):
    """Left-padded text rows, each prefilled alone (`one_row`) and written start-aligned into
    `slab`, once per layer. Returns (last logits [B, V], seeds, real lengths, position offsets)."""
    lengths = [int(n) for n in attention_mask.sum(dim=1).tolist()]
    width = max(lengths)
    last, seeds, caches, offsets = [], [], [], []
    for b, n in enumerate(lengths):
        logits, seed, cache, offset = one_row(adapter, input_ids[b, input_ids.shape[1] - n:], k, head_share)
        last.append(logits)
        seeds.append(seed)
        caches.append(cache)
        offsets.append(offset)
    for i in range(len(caches[0].layers)):  # each layer's rows, start-aligned, written once
        rows = []
        for cache in caches:
            layer = cache.layers[i]
            assert isinstance(layer, SlabLayer) and layer.keys is not None and layer.values is not None
            rows.append((layer.keys[0], layer.values[0]))
        k0, v0 = rows[0]
        keys = k0.new_zeros((len(rows), *k0.shape[:-2], width, k0.shape[-1]))
        values = v0.new_zeros((len(rows), *v0.shape[:-2], width, v0.shape[-1]))
        for b, (kb, vb) in enumerate(rows):
            keys[b, ..., : kb.shape[-2], :] = kb
            values[b, ..., : vb.shape[-2], :] = vb
        slab.update(keys, values, i)
    return torch.stack(last), seeds, lengths, offsets


def padded(adapter, slab, input_ids, attention_mask, model_inputs: dict, k: int, head_share: float | None):
    """The prompts as one left-padded batch into `slab`, with the position ids batched
    `generate` gives them. Returns (last logits [B, V], seeds, each row's padding, position offsets)."""
    inputs = dict(model_inputs)
    if "position_ids" not in inputs:
        inputs["position_ids"] = adapter.model._prepare_position_ids_for_generation(
            input_ids, {"attention_mask": attention_mask, **inputs})
    last, hidden = _run(adapter, input_ids, attention_mask, inputs, slab, head_share is not None)
    offsets = adapter.position_offsets(input_ids.shape[0])
    pads = (attention_mask == 0).sum(dim=1).cpu().numpy()
    seeds = [seed_rows(adapter, None if hidden is None else hidden[b, int(pads[b]):], k, head_share)
             for b in range(len(pads))]
    return last, seeds, pads, offsets


def _run(adapter, input_ids, attention_mask, inputs: dict, cache, capture_hidden: bool):
    """One prefill forward into `cache` (`prompt_forward`), padding rows zeroed."""
    pads = None if attention_mask is None else attention_mask == 0
    hook = _zero_padding(pads, threading.get_ident()) if pads is not None and bool(pads.any()) else None
    return prompt_forward(adapter, cache, input_ids, attention_mask, inputs, capture_hidden, hook)


def seed_rows(adapter, hidden: torch.Tensor | None, k: int, head_share: float | None) -> Seed:
    """(ids, probs, start) for a row's real positions `hidden` [n, hidden] (see `recap.verify.seeding`)."""
    if hidden is None or head_share is None:
        return (*seeding.top_rows(adapter, None, k), 0)
    n = seeding.positions(hidden.shape[0], head_share)
    return (*seeding.top_rows(adapter, hidden[hidden.shape[0] - n:], k), hidden.shape[0] - n)

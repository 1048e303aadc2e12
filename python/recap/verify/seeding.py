"""Seeding the memories from the prompt, budgeted like the tree.

The prefill's forward computes the language-model head at the last position only, as
`generate` does; seeding RECAP's memories needs the target's top-K after every seeded
position, which is one more head pass per position: O(positions x vocabulary x hidden). On an
accelerator that is cheap; on a CPU with a large vocabulary it is not (SmolLM2-135M: the head
costs about half of a whole token's forward, so seeding a whole prompt adds ~45% to the
time to first token).

So each prefill seeds the prompt's last positions up to SEED_SHARE of its own forward's cost
(at least SEED_FLOOR tokens' worth): all of them where the head is cheap, the end of the
prompt where it is not. The share (`head_share`: the head's cost per position over a whole
token's forward) costs no pass at first use: it starts from the parameter counts, and every
seeding prefill times its forward and its seeding and moves the share to what they cost
(`observe`; kept with the model and across processes). Seeding changes drafts, never outputs.
"""

from __future__ import annotations

import numpy as np
import torch

from recap.state import measurements
from recap.state.model_state import state_of

SEED_SHARE = 0.04  # seeding may add this share of the prefill's forward time
# The last positions whose head costs this many prompt tokens' forward are always seeded (10 on
# SmolLM2-135M). Short prompts gain nothing from more: on the 12 shortest shipped prompts
# (MT-bench, HumanEval) a floor of 4 and one of 0 gave the same or higher tau and speed
# than one of 26 (65 positions), in two runs.
SEED_FLOOR = 4.0
CHUNK = 256  # positions per head call (bounds memory)
# The head's softmax and top-k, and its one large product (less efficient per multiply-add
# than the layers' on a CPU), make it dearer than its share of the parameters: on a 2-core
# x86 CPU the prefills measured 1.7-1.9x that share on SmolLM2-135M (0.37-0.40 against
# 0.21) and 2.1-2.4x on a Qwen2.5-0.5B-shaped model (0.59-0.66 against 0.28). Only the
# first seeding prefill of a model uses the estimate.
HEAD_OVERHEAD = 2.0


def positions(prompt_len: int, head_share: float) -> int:
    """How many of the prompt's last positions to seed: SEED_SHARE of the prefill's forward,
    and never fewer than SEED_FLOOR tokens' worth (a short prompt's end is cheap to seed)."""
    if head_share <= 0:
        return prompt_len
    return min(prompt_len, int(max(SEED_FLOOR, SEED_SHARE * prompt_len) / head_share))


def top_rows(adapter, hidden: torch.Tensor | None, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The target's top-K (ids, probs) after each of `hidden`'s positions ([n, hidden])."""
    if hidden is None or hidden.shape[0] == 0:
        return np.zeros((0, k), dtype=np.int64), np.zeros((0, k), dtype=np.float32)
    head = adapter.lm_head
    ids, probs = [], []
    for s in range(0, hidden.shape[0], CHUNK):
        p, i = torch.softmax(head(hidden[s:s + CHUNK]).float(), dim=-1).topk(k, dim=-1)
        ids.append(i)
        probs.append(p)
    return torch.cat(ids).cpu().numpy().astype(np.int64), torch.cat(probs).cpu().numpy().astype(np.float32)


def head_share(adapter) -> float:
    """The share the next prefill seeds by: what earlier prefills of this model measured
    (this process, or one before it through `recap.state.measurements`), else an estimate from the
    parameter counts, which the first seeding prefill replaces by what it cost (`observe`).
    No forward pass runs here."""
    state = state_of(adapter.model)
    if state.head_share is not None:
        return state.head_share
    kept = measurements.load(measurements.key(adapter.model, "head-share"))
    if isinstance(kept, (int, float)) and kept > 0:
        state.head_share = float(kept)
        return state.head_share
    return estimated_share(adapter.model)


def estimated_share(model) -> float:
    """The head's multiply-adds per position over a whole token's forward (every parameter
    but the input embedding's, the head's even when tied to it), times HEAD_OVERHEAD."""
    head = model.get_output_embeddings().weight
    embedding = model.get_input_embeddings().weight
    total = sum(p.numel() for p in model.parameters())  # a tied head counted once, as the head
    forward = total if embedding is head else total - embedding.numel()
    return HEAD_OVERHEAD * head.numel() / max(forward, 1)


OBSERVE_MIN = 16  # seeded positions (and 8x as many prompt tokens) before a prefill corrects the share
OBSERVE_WEIGHT = 0.5  # each prefill's share moves the estimate this far towards it


def observe(adapter, length: int, forward_s: float, positions: int, seed_s: float) -> None:
    """A prefill of `length` tokens took `forward_s`, and seeding its last `positions` took
    `seed_s`: the share the next prefills use moves towards what this one cost."""
    if positions < OBSERVE_MIN or length < 8 * OBSERVE_MIN or forward_s <= 0 or seed_s <= 0:
        return
    state = state_of(adapter.model)
    seen = (seed_s / positions) / (forward_s / length)
    old = state.head_share
    new = seen if old is None else old + OBSERVE_WEIGHT * (seen - old)
    state.head_share = new
    if old is None or abs(new - old) > 0.1 * old:  # the next process starts from it
        measurements.store(measurements.key(adapter.model, "head-share"), new)


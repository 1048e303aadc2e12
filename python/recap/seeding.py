"""Seeding the memories from the prompt, budgeted like the tree.

The prefill's forward computes the language-model head at the last position only, as
`generate` does; seeding RECAP's memories needs the target's top-K after every seeded
position, which is one more head pass per position: O(positions x vocabulary x hidden). On an
accelerator that is cheap; on a CPU with a large vocabulary it is not (SmolLM2-135M: the head
costs about half of a whole token's forward, so seeding a whole prompt adds ~45% to the
time to first token).

So the share is measured once per model and hardware at first use (`head_share`: the head
over 32 positions against a 32-token forward, cached with the model and across processes)
and each prefill seeds the prompt's last positions up to SEED_SHARE of its own forward's
cost (at least SEED_MIN): all of them where the head is cheap, the end of the prompt where it
is not. Seeding changes drafts, never outputs.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from recap import measurements
from recap.model_state import state_of

SEED_SHARE = 0.04  # seeding may add this share of the prefill's forward time
SEED_MIN = 64  # the prompt's last positions are always seeded
CHUNK = 256  # positions per head call (bounds memory)
PROBE_TOKENS = 32  # enough rows for the head's per-position cost; a short forward keeps first use cheap


def positions(prompt_len: int, head_share: float) -> int:
    """How many of the prompt's last positions to seed."""
    if head_share <= 0:
        return prompt_len
    return min(prompt_len, max(SEED_MIN, int(SEED_SHARE * prompt_len / head_share)))


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


@torch.no_grad()
def head_share(adapter) -> float:
    """The head's time per position over a whole forward's time per token, on this model and
    hardware (measured once; see the module doc)."""
    model = adapter.model
    state = state_of(model)
    found = getattr(state, "head_share", None)
    if found is not None:
        return found
    name = measurements.key(model, "head-share")
    kept = measurements.load(name)
    if isinstance(kept, (int, float)):
        state.head_share = float(kept)
        return state.head_share
    device = adapter.lm_head.weight.device
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(3, max(adapter.vocab_size - 1, 4), (1, PROBE_TOKENS), generator=gen)
    # Never an image placeholder: it would read as an image prompt without its pixels.
    ids = ids.masked_fill(torch.isin(ids, torch.tensor(sorted(adapter.excluded), dtype=torch.long)), 3).to(device)
    hidden = torch.randn(PROBE_TOKENS, adapter.lm_head.weight.shape[1], generator=gen).to(device, adapter.dtype)

    def forward() -> None:
        model(input_ids=ids, use_cache=False, logits_to_keep=1).logits.cpu()

    def heads() -> None:
        top_rows(adapter, hidden, 8)

    forward()  # the first call warms up (the head's first call runs inside it)
    times = [min(_time(f) for _ in range(2)) for f in (forward, heads)]
    share = times[1] / max(times[0], 1e-9)
    state.head_share = share
    measurements.store(name, share)
    return share


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


def _time(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t

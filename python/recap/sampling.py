"""Choosing each committed token: greedy or sampled, with the logits processors transformers
builds from a `GenerationConfig` (temperature, top-k/p, min-p, typical, epsilon/eta,
repetition and n-gram penalties, bad words, suppression, minimum lengths, a user's own list).

Acceptance for drafts without draft probabilities (every drafter here): at the root, process
the node's logits with its own history (prompt + committed tokens + the node's path), pick a
token; if a child of the node carries that token, descend and repeat; the first node with no
such child commits its own pick. Each committed token is thereby picked from exactly the
distribution one-token-at-a-time generation would have used at that position, given the same
preceding tokens: the tree only decides how many of those picks one pass can serve (see
README, "Sampling").

Reproducible by seed: the token at output position t is drawn by inverse CDF (token-id
order) from a uniform that depends only on (seed, t), a counter-based generator (splitmix64
of seed and t). Any drafter at any budget therefore commits the same tokens as one-token
sampling (`drafter="ar"`) with the same seed.
"""

from __future__ import annotations

import numpy as np
import torch

_M = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M
    return x ^ (x >> 31)


def uniform(seed: int, t: int) -> float:
    """A uniform in [0, 1) that depends only on (seed, t)."""
    return (_splitmix64(_splitmix64(seed & _M) ^ (t & _M)) >> 11) * 2.0**-53


def inverse_cdf(scores: torch.Tensor, u: float) -> int:
    """The token whose cumulative probability (token-id order) first exceeds u; tokens with
    probability 0 are never picked."""
    probs = torch.softmax(scores.double(), dim=-1)
    cdf = torch.cumsum(probs, dim=-1)
    idx = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=cdf.dtype, device=cdf.device),
                                 right=True))
    idx = min(idx, probs.shape[-1] - 1)
    while probs[idx] == 0 and idx > 0:  # rounding at the very top of the CDF
        idx -= 1
    return idx


class TokenChooser:
    """Picks the token after a history from that position's logits."""

    def __init__(self, processors=None, do_sample: bool = False, seed: int | None = None) -> None:
        self.processors = processors if processors is not None and len(processors) > 0 else None
        self.do_sample = do_sample
        if do_sample and seed is None:  # drawn from torch's generator, so torch.manual_seed repeats a run
            seed = int(torch.randint(0, 2**62, (1,)))
        self.seed = seed

    @property
    def plain_greedy(self) -> bool:
        """The argmax of the raw logits: the Rust acceptance walks the tree on its own."""
        return not self.do_sample and self.processors is None

    def choose(self, history: list[int], logits: torch.Tensor, t: int) -> int:
        scores = logits.unsqueeze(0)
        if self.processors is not None:
            ids = torch.tensor([history], dtype=torch.long, device=logits.device)
            scores = self.processors(ids, scores)
        if not self.do_sample:
            return int(scores[0].argmax())
        return inverse_cdf(scores[0], uniform(self.seed, t))


def walk(chooser: TokenChooser, tokens: np.ndarray, parents: np.ndarray, logits: torch.Tensor,
         history: list[int], t: int, pred: np.ndarray) -> None:
    """Writes the chosen token into `pred` at every node of the accepted walk (root first),
    so the drafter's acceptance follows exactly that walk and commits its last pick."""
    node, path = 0, list(history)
    while True:
        tok = chooser.choose(path, logits[node], t)
        pred[node] = tok
        match = np.flatnonzero((parents == node) & (tokens == tok))
        if match.size == 0:
            return
        node = int(match[0])
        path.append(tok)
        t += 1

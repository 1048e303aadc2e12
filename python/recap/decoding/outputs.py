"""What `generate(..., return_dict_in_generate=True)` returns, as transformers returns it.

`sequences`, and with ``output_logits`` the raw logits of every generated token (the
verification pass's row at the node the token was picked from, the bonus token included),
with ``output_scores`` the scores after the logits processors, both float32 tuples of
[1, vocab] like `generate`'s. `recap_stats` carries the request's own figures (tau, steps,
accepted length per step, tree sizes, host and forward time: `GenerationStats.as_dict()`), so
a `custom_generate` user reads them without touching the decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput


@dataclass
class RecapGenerateOutput(GenerateDecoderOnlyOutput):
    recap_stats: dict[str, Any] | None = None


class TokenRows:
    """The raw logits row of each committed token, kept on the device as the steps commit."""

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []

    def add(self, rows: torch.Tensor) -> None:
        self.rows.append(rows.float())

    def logits(self, n: int) -> tuple[torch.Tensor, ...]:
        """The first `n` committed tokens' rows, as `generate` returns them: [1, vocab] each."""
        flat = torch.cat(self.rows)[:n]
        return tuple(flat[i:i + 1] for i in range(flat.shape[0]))

    def scores(self, processors, sequence: torch.Tensor, prompt_len: int, n: int) -> tuple[torch.Tensor, ...]:
        """The processed scores of the first `n` tokens: token t's raw row processed with the
        sequence before it, exactly the call `generate` makes at that position."""
        logits = self.logits(n)
        if processors is None:
            return logits
        return tuple(processors(sequence[:, :prompt_len + t], row.clone()) for t, row in enumerate(logits))

"""Per-call statistics of `Decoder.generate`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

PHASES = ("draft", "pack", "forward", "pick", "update", "compact", "other")


@dataclass
class GenerationStats:
    """Counts and timings of one generate call. Times are seconds (use the *_us helpers)."""

    prefill_s: float = 0.0
    steps: int = 0
    new_tokens: int = 0
    accepted_lengths: Counter = field(default_factory=Counter)
    tree_sizes: list[int] = field(default_factory=list)
    phase_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    total_s: float = 0.0
    #: With budget="auto": nodes the drafter offered, the expected accepted nodes of what was
    #: kept (to compare with the observed accepted nodes), and the cost curve in use.
    offered_nodes: int = 0
    predicted_accepted: float = 0.0
    cost: dict | None = None
    #: On a model with `recap.catchup` routing: what the prefill's routing did
    #: (`RoutingStats.as_dict()`); None otherwise.
    routing: dict | None = None
    #: A batch: its rows, and the verification passes (`steps` counts row steps).
    rows: int = 1
    passes: int = 0
    #: Bytes of the request's KV cache buffers (allocated once; grown only past their capacity).
    kv_bytes: int = 0

    def record_step(self, tree_size: int, path_len: int, selection: tuple | None) -> None:
        """One verification step: its tree size, its accepted path (root included) and, with
        the automatic budget, the controller's (offered, kept, expected accepted) nodes."""
        self.steps += 1
        self.accepted_lengths[path_len - 1] += 1
        self.tree_sizes.append(tree_size)
        if selection is not None:
            self.offered_nodes += selection[0]
            self.predicted_accepted += selection[2]

    @property
    def observed_accepted(self) -> int:
        """Accepted draft nodes over all steps (bonus tokens not counted)."""
        return sum(length * count for length, count in self.accepted_lengths.items())

    @property
    def tau(self) -> float:
        """Committed tokens per target forward after the prefill, bonus included (plain decoding: 1.0)."""
        return (self.new_tokens - self.rows) / self.steps if self.steps else 1.0

    @property
    def mean_tree_size(self) -> float:
        return sum(self.tree_sizes) / len(self.tree_sizes) if self.tree_sizes else 0.0

    @property
    def host_s(self) -> float:
        """Time outside the target forward during decoding (draft + pack + update + compact + glue)."""
        return sum(v for k, v in self.phase_s.items() if k != "forward")

    def per_step_us(self) -> dict[str, float]:
        n = max(self.passes or self.steps, 1)
        out = {k: v / n * 1e6 for k, v in self.phase_s.items()}
        out["host"] = self.host_s / n * 1e6
        return out

    def as_dict(self) -> dict:
        return {
            "steps": self.steps,
            "new_tokens": self.new_tokens,
            "tau": self.tau,
            "mean_tree_size": self.mean_tree_size,
            "accepted_lengths": dict(sorted(self.accepted_lengths.items())),
            "prefill_s": self.prefill_s,
            "total_s": self.total_s,
            "per_step_us": self.per_step_us(),
            "offered_nodes": self.offered_nodes,
            "predicted_accepted": self.predicted_accepted,
            "observed_accepted": self.observed_accepted,
            # Steps that verified the root alone: the budget found nothing worth drafting,
            # or the request's drafting was paused because it did not pay (recap.first_use.budget).
            "undrafted_steps": sum(1 for t in self.tree_sizes if t == 1),
            "cost": self.cost,
            "routing": self.routing,
            "rows": self.rows,
            "passes": self.passes or self.steps,
            "kv_bytes": self.kv_bytes,
        }

"""Type stub of the native module recap._core (Rust, PyO3)."""

import os
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__version__: str

IntArray = npt.NDArray[np.int64] | npt.NDArray[np.int32] | Sequence[int]

def recap_defaults() -> dict[str, Any]:
    """Defaults and limits of every RECAP setting (the one source of truth)."""

def check_recap_config(
    *, k: int, budget: int, max_budget: int, max_depth: int, eta: Sequence[float],
    priors: tuple[float, float, float], fusion: str, suffix_len: int, context_capacity: int,
    memory_capacity: int,
) -> None: ...

def transpose_into(src: npt.NDArray[Any], dst: npt.NDArray[Any], threads: int = 1) -> None:
    """Writes src's transpose into dst (src [r, c], dst [c, r], C-contiguous uint16, uint32
    or uint64: a weight's bits) on up to `threads` threads."""

class PersistentMemory:
    def __init__(self, vocab_size: int, *, k: int = 8, capacity: int = 49152) -> None: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def k(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def evictions(self) -> int: ...
    def __len__(self) -> int: ...
    def bytes(self) -> int: ...
    def clear(self) -> None: ...
    def row(self, token: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]] | None: ...
    def save(self, path: str | os.PathLike[str], *, fingerprint: int = 0) -> None: ...
    @staticmethod
    def load(
        path: str | os.PathLike[str], *, vocab_size: int | None = None, k: int | None = None,
        fingerprint: int | None = None,
    ) -> PersistentMemory: ...
    @staticmethod
    def inspect(path: str | os.PathLike[str]) -> dict[str, int]: ...

class DraftTree:
    @property
    def tokens(self) -> npt.NDArray[np.int64]: ...
    @property
    def parents(self) -> npt.NDArray[np.int64]: ...
    @property
    def depths(self) -> npt.NDArray[np.int64]: ...
    @property
    def scores(self) -> npt.NDArray[np.float32]: ...
    @property
    def sources(self) -> npt.NDArray[np.uint8]: ...
    @property
    def mask(self) -> npt.NDArray[np.bool_]: ...
    def __len__(self) -> int: ...

class Calibration:
    """The automatic budget's learned state for the sessions opened with it."""
    def __init__(self) -> None: ...
    @property
    def is_set(self) -> bool: ...

class _SingleStream:
    """What one request stream does: a `Session`, or a `Drafter`'s default session."""
    def bytes_by_part(self) -> list[tuple[str, int]]: ...
    def set_cost(self, cost: Sequence[float] | None) -> None: ...
    def set_cost_points(self, points: Sequence[int], seconds: Sequence[float]) -> None: ...
    def cost_state(self) -> dict[str, object] | None: ...
    def propose_into(
        self, tokens: npt.NDArray[np.int64], parents: npt.NDArray[np.int64], depths: npt.NDArray[np.int64],
        positions: npt.NDArray[np.int64], block: npt.NDArray[np.float32], masked: float, position_base: int = 0,
    ) -> tuple[int, int]: ...
    def propose_ranked(self) -> npt.NDArray[np.float32]: ...
    def cut_into(
        self, nodes: int, tokens: npt.NDArray[np.int64], parents: npt.NDArray[np.int64],
        depths: npt.NDArray[np.int64], positions: npt.NDArray[np.int64], block: npt.NDArray[np.float32],
        masked: float, position_base: int = 0,
    ) -> tuple[int, int]: ...
    def observe_packed(
        self, packed: npt.NDArray[np.float32] | npt.NDArray[np.float64], k: int, forward_s: float | None = None,
        host_s: float | None = None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
    @property
    def last_selection(self) -> tuple[int, int, float] | None: ...
    def calibration(self) -> list[tuple[str, int, float, float, float]]: ...
    @property
    def max_nodes(self) -> int: ...
    @property
    def method(self) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def memory(self) -> PersistentMemory | None: ...
    @property
    def history(self) -> npt.NDArray[np.int64]: ...
    def begin(self, context: IntArray) -> None: ...
    def limit_new_tokens(self, tokens: int) -> None: ...
    def seed(self, topk_ids: npt.NDArray[np.int64], topk_probs: npt.NDArray[np.float32], start: int = 0) -> None: ...
    def propose(self) -> DraftTree: ...
    def observe(
        self, pred: IntArray, topk_ids: npt.NDArray[np.int64], topk_probs: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
    def bytes(self) -> int: ...

class Session(_SingleStream):
    """One request on a shared drafter (`Drafter.session()`)."""
    def finish(self) -> None: ...
    def __enter__(self) -> Session: ...
    def __exit__(self, *_exc: object) -> Literal[False]: ...

class Drafter(_SingleStream):
    """One drafter shared by every request; its single-stream methods use a default session."""
    @staticmethod
    def recap(
        vocab_size: int,
        *,
        k: int | None = None,
        budget: int | None = None,
        max_depth: int | None = None,
        eta: Sequence[float] | None = None,
        priors: tuple[float, float, float] | None = None,
        fusion: str | None = None,
        suffix_len: int | None = None,
        suffix_adaptive: bool = False,
        context_capacity: int | None = None,
        seed_context: bool = False,
        reset_memory: bool = False,
        frequency: bool = False,
        excluded: IntArray | None = None,
        memory: PersistentMemory | None = None,
    ) -> Drafter: ...
    @staticmethod
    def ar(vocab_size: int) -> Drafter: ...
    @staticmethod
    def pld(
        vocab_size: int, *, max_ngram: int = 2, num_tokens: int = 10, excluded: IntArray | None = None
    ) -> Drafter: ...
    @staticmethod
    def tr(
        vocab_size: int,
        *,
        levels: Sequence[int] | None = None,
        k: int = 8,
        excluded: IntArray | None = None,
        memory: PersistentMemory | None = None,
    ) -> Drafter: ...
    @staticmethod
    def sam(
        vocab_size: int,
        *,
        max_len: int = 60,
        fallback_tr: bool = False,
        threshold: int = 5,
        levels: Sequence[int] | None = None,
        k: int = 8,
        excluded: IntArray | None = None,
        memory: PersistentMemory | None = None,
    ) -> Drafter: ...
    @staticmethod
    def suffix(
        vocab_size: int,
        *,
        max_depth: int = 64,
        max_spec: int = 16,
        factor: float = 1.0,
        min_prob: float = 0.1,
        cross_request: bool = False,
        excluded: IntArray | None = None,
    ) -> Drafter: ...
    def session(self, *, memory: PersistentMemory | None = None,
                calibration: Calibration | None = None) -> Session: ...
    @property
    def own_calibration(self) -> Calibration: ...

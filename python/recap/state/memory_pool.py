"""Cross-request memory a multi-user service can trust: named scopes, whole-scope eviction
under a byte bound, and snapshots tied to the model they came from.

RECAP's persistent memory U (and Token Recycling's rows) learns from every request and
drafts for every later one, so one user's text would shape another's drafts, and acceptance
speed is observable. A `MemoryPool` keeps one `PersistentMemory` per scope:

    pool = recap.MemoryPool(max_bytes=512 << 20)
    dec = recap.Decoder(model, memory=pool)
    dec.generate(ids, max_new_tokens=256, memory_scope="tenant-a")

A request with a scope drafts from and writes to that scope's memory only; one without
uses the decoder's own memory, as before. When the pool holds more than ``max_bytes``, idle
scopes are dropped whole, least recently used first; a scope a request is using is never
dropped (the pool may then stay above its bound until the request ends).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from recap._core import Calibration, PersistentMemory, recap_defaults


@dataclass
class _Scope:
    memory: PersistentMemory
    in_use: int = 0
    last_used: float = 0.0
    # The automatic budget's calibration per decoder (it is model-specific), dropped with the scope.
    calibrations: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)


class MemoryPool:
    """Named memory scopes with one byte bound (see the module doc). Thread-safe."""

    def __init__(self, max_bytes: int, *, rows_per_scope: int | None = None) -> None:
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
            raise ValueError(f"max_bytes: expected an int >= 0, got {max_bytes!r}")
        rows = recap_defaults()["memory_capacity"] if rows_per_scope is None else rows_per_scope
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
            raise ValueError(f"rows_per_scope: expected an int >= 1, got {rows_per_scope!r}")
        self.max_bytes, self.rows_per_scope = max_bytes, rows
        self._scopes: OrderedDict[str, _Scope] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self.evictions = 0

    @staticmethod
    def _check_name(scope: object) -> str:
        if not isinstance(scope, str) or not scope:
            raise ValueError(f"memory_scope: expected a non-empty str, got {scope!r}")
        return scope

    @contextlib.contextmanager
    def use(self, scope: str, vocab_size: int, k: int) -> Iterator[PersistentMemory]:
        """The scope's memory (created empty if new) for the length of one request."""
        memory = self._acquire(scope, vocab_size, k)
        try:
            yield memory
        finally:
            self._release(scope)

    @contextlib.contextmanager
    def scope(self, scope: str, vocab_size: int, k: int, owner: object = None
              ) -> Iterator[tuple[PersistentMemory, Calibration]]:
        """The scope's memory and `owner`'s budget calibration for it, for one request."""
        with self.use(scope, vocab_size, k) as memory:
            with self._lock:  # the scope is in use, so it cannot be evicted meanwhile
                calibration = self._scopes[scope].calibrations.setdefault(self if owner is None else owner,
                                                                          Calibration())
            yield memory, calibration

    def _acquire(self, scope: str, vocab_size: int, k: int) -> PersistentMemory:
        self._check_name(scope)
        with self._lock:
            entry = self._scopes.get(scope)
            if entry is None:
                entry = _Scope(PersistentMemory(vocab_size, k=k, capacity=self.rows_per_scope))
                self._scopes[scope] = entry
            elif entry.memory.vocab_size != vocab_size or entry.memory.k != k:
                raise ValueError(
                    f"memory_scope {scope!r}: expected a memory for vocab_size {vocab_size} and k {k}, the pool "
                    f"holds one for vocab_size {entry.memory.vocab_size} and k {entry.memory.k}")
            entry.in_use += 1
            self._scopes.move_to_end(scope)
            return entry.memory

    def _release(self, scope: str) -> None:
        with self._lock:
            entry = self._scopes.get(scope)
            if entry is not None:
                entry.in_use -= 1
                entry.last_used = time.monotonic()
            self._evict()

    def _evict(self) -> None:
        """Drops idle scopes, least recently used first, until the pool fits its bound."""
        total = sum(e.memory.bytes() for e in self._scopes.values())
        for name in list(self._scopes):
            if total <= self.max_bytes:
                break
            entry = self._scopes[name]
            if entry.in_use == 0:
                total -= entry.memory.bytes()
                del self._scopes[name]
                self.evictions += 1

    # ---- inspection and persistence ----------------------------------------------------------
    def stats(self) -> dict[str, dict[str, int]]:
        """Per scope: bytes held, rows, requests using it now."""
        with self._lock:
            return {name: {"bytes": e.memory.bytes(), "rows": len(e.memory), "in_use": e.in_use}
                    for name, e in self._scopes.items()}

    def bytes(self) -> int:
        with self._lock:
            return sum(e.memory.bytes() for e in self._scopes.values())

    def __contains__(self, scope: str) -> bool:
        with self._lock:
            return scope in self._scopes

    def drop(self, scope: str) -> None:
        """Forgets a scope (a user who left); raises while a request uses it."""
        with self._lock:
            entry = self._scopes.get(scope)
            if entry is not None and entry.in_use:
                raise RuntimeError(f"memory_scope {scope!r} is in use by {entry.in_use} request(s)")
            self._scopes.pop(scope, None)

    def save(self, scope: str, path: str | os.PathLike, *, fingerprint: int = 0) -> None:
        """Snapshot of one scope (atomic; see `PersistentMemory.save`)."""
        with self._lock:
            entry = self._scopes.get(scope)
            if entry is None:
                raise KeyError(f"memory_scope {scope!r}: no such scope (scopes: {sorted(self._scopes)})")
            memory = entry.memory
        memory.save(os.fspath(path), fingerprint=fingerprint)

    def load(self, scope: str, path: str | os.PathLike, *, vocab_size: int | None = None, k: int | None = None,
             fingerprint: int | None = None) -> None:
        """Replaces (or creates) a scope from a snapshot, checked whole first; raises while a
        request uses the scope."""
        self._check_name(scope)
        memory = PersistentMemory.load(os.fspath(path), vocab_size=vocab_size, k=k, fingerprint=fingerprint)
        with self._lock:
            entry = self._scopes.get(scope)
            if entry is not None and entry.in_use:
                raise RuntimeError(f"memory_scope {scope!r} is in use by {entry.in_use} request(s)")
            self._scopes[scope] = _Scope(memory, last_used=time.monotonic())
            self._scopes.move_to_end(scope)
            self._evict()


def memory_fingerprint(model) -> int:
    """A 64-bit fingerprint of what a memory's rows depend on: the model's type, vocabulary
    size and shape, and a sample of its output embedding (so another checkpoint of the same
    architecture does not match). Snapshots carry it; loading checks it."""
    cfg = model.config
    text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    head = model.get_output_embeddings().weight
    described = {name: getattr(text, name, None) for name in
                 ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "bos_token_id", "eos_token_id", "pad_token_id")}
    described["head_shape"] = list(head.shape)
    rows = head.detach()[:: max(1, head.shape[0] // 64)][:64, :64].float().cpu()
    described["head_sample"] = [round(float(v), 4) for v in rows.sum(dim=1)]
    digest = hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).digest()
    return int.from_bytes(digest[:8], "little")

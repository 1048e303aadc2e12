"""Every drafter by name: RECAP, its ablations and the peers, all behind the same verifier.

A drafter is built once per `recap.Decoder` and keeps its cross-request state (RECAP's and
Token Recycling's persistent rows, the cross-request suffix trie) for the Decoder's life.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from recap._core import Drafter, PersistentMemory
from recap.decoding.config import RecapConfig

Factory = Callable[[int, RecapConfig, "PersistentMemory | None", tuple], Drafter]


@dataclass(frozen=True)
class DrafterSpec:
    name: str
    summary: str
    make: Factory
    #: Whether it keeps rows in a `PersistentMemory` (RECAP's U, Token Recycling's adjacency).
    uses_memory: bool
    #: Whether ``budget="auto"`` sizes its trees to the hardware (RECAP and its ablations).
    adapts_budget: bool = False
    #: Whether it keeps cross-request state outside a `PersistentMemory` (memory scopes
    #: cannot isolate it).
    cross_request: bool = False


def _recap(**changes) -> Factory:
    def make(vocab, config, memory, excluded):
        return replace(config, **changes).new_drafter(vocab, memory=memory, excluded=excluded)
    return make


def _tr(vocab, config, memory, excluded):
    return Drafter.tr(vocab, k=config.k, excluded=list(excluded), memory=memory)


def _sam_tr(vocab, config, memory, excluded):
    return Drafter.sam(vocab, fallback_tr=True, k=config.k, excluded=list(excluded), memory=memory)


_ABLATIONS: list[tuple[str, str, dict[str, Any]]] = [
    ("unigram", "U only (Token Recycling's key)", {"fusion": "unigram"}),
    ("backoff", "most specific row only", {"fusion": "backoff"}),
    ("uniform", "equal fusion weights", {"fusion": "uniform"}),
    ("prior", "priors without confidence", {"fusion": "prior"}),
    ("nosuffix", "no suffix graft", {"suffix_len": 0}),
    ("reset", "U reset per request", {"reset_memory": True}),
    ("paper", "the method as published: no frequency tree merged", {"frequency": False}),
    ("floor", "the frequency tree's proposal kept as a floor where it pays as a whole", {"frequency_floor": True}),
]

_SPECS = [
    DrafterSpec("recap", "RECAP: fused G/C/U memories, best-first tree, suffix graft, frequency tree",
                _recap(), True, True),
    *[DrafterSpec(f"recap_{name}", f"RECAP ablation: {summary}", _recap(**change), True, True)
      for name, summary, change in _ABLATIONS],
    DrafterSpec("ar", "plain greedy decoding through the same loop",
                lambda vocab, config, memory, excluded: Drafter.ar(vocab), False),
    DrafterSpec("pld", "prompt lookup, transformers' settings (n <= 2, 10 tokens)",
                lambda vocab, config, memory, excluded: Drafter.pld(vocab, excluded=list(excluded)), False),
    DrafterSpec("pld3", "prompt lookup, the original paper's n <= 3",
                lambda vocab, config, memory, excluded: Drafter.pld(vocab, max_ngram=3, excluded=list(excluded)),
                False),
    DrafterSpec("tr", "Token Recycling, static 80-node template", _tr, True),
    DrafterSpec("tr_bf", "Token Recycling rows, best-first at RECAP's budget",
                _recap(fusion="unigram", suffix_len=0), True),
    DrafterSpec("sam", "SAM-Decoding chains", lambda vocab, config, memory, excluded:
                Drafter.sam(vocab, excluded=list(excluded)), False),
    DrafterSpec("sam_tr", "SAM chain when the match is >= 5, else a Token Recycling tree", _sam_tr, True),
    DrafterSpec("suffix", "SuffixDecoding-style suffix tree over this request",
                lambda vocab, config, memory, excluded: Drafter.suffix(vocab, excluded=list(excluded)), False),
    DrafterSpec("suffix_x", "SuffixDecoding-style, plus a suffix tree over earlier outputs",
                lambda vocab, config, memory, excluded:
                Drafter.suffix(vocab, cross_request=True, excluded=list(excluded)), False, cross_request=True),
]

DRAFTERS: dict[str, DrafterSpec] = {s.name: s for s in _SPECS}


def spec(name: str) -> DrafterSpec:
    try:
        return DRAFTERS[name]
    except KeyError:
        raise ValueError(f"drafter: expected one of {sorted(DRAFTERS)}, got {name!r}") from None


def build(name: str, vocab_size: int, config: RecapConfig, memory: PersistentMemory | None = None,
          excluded: tuple[int, ...] = ()) -> Drafter:
    """The drafter `name`, sharing `memory` when it keeps one (a new one is made otherwise)."""
    s = spec(name)
    if s.uses_memory and memory is None:
        memory = config.new_memory(vocab_size)
    excluded = tuple(sorted(set(config.excluded) | set(excluded)))
    return s.make(vocab_size, config, memory if s.uses_memory else None, excluded)

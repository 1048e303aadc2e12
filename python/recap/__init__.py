"""recap: RECAP speculative decoding with a Rust core.

The host-side hot paths (memories, fusion, best-first tree search, suffix automaton,
packing, acceptance, update) live in the native module ``recap._core``; this package adds
the configuration and the model-facing loop.
"""

from recap import _moved
from recap._core import Drafter, DraftTree, PersistentMemory, __version__
from recap.decoding.config import RecapConfig
from recap.decoding.drafters import DRAFTERS
from recap.state.memory_pool import MemoryPool, memory_fingerprint

_moved.install()  # recap.config, recap.budget, ... still import (old pickles name them)


def __getattr__(name: str):
    # The torch-facing decoder is imported lazily: the core works without torch installed.
    if name == "Decoder":
        from recap.decoding.decoder import Decoder

        return Decoder
    if name == "ContinuousBatch":  # rows that join a running batch between steps
        from recap.decoding.continuous import ContinuousBatch

        return ContinuousBatch
    if name == "generate":  # model.generate(..., custom_generate=recap.generate)
        from recap.decoding.generation import generate

        return generate
    raise AttributeError(f"module 'recap' has no attribute {name!r}")

__all__ = ["DRAFTERS", "ContinuousBatch", "Decoder", "generate", "DraftTree", "Drafter", "MemoryPool",
           "PersistentMemory", "RecapConfig", "__version__", "memory_fingerprint"]

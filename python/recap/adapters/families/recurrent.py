"""Families refused outright: their layers keep a recurrent, state-space or convolution
state, so a tree pass would fold every branch into one state, and a rejected draft cannot be
rolled back out of it."""

from __future__ import annotations

from recap.adapters.base import ModelAdapter
from recap.adapters.capability import WHY_STATE

RECURRENT = {
    "mamba": "Mamba state-space layers", "mamba2": "Mamba-2 state-space layers",
    "falcon_mamba": "Mamba state-space layers", "jamba": "Mamba state-space layers (Jamba hybrid)",
    "falcon_h1": "Mamba-2 state-space layers (Falcon-H1 hybrid)", "bamba": "Mamba-2 state-space layers",
    "zamba": "Mamba state-space layers", "zamba2": "Mamba-2 state-space layers",
    "granitemoehybrid": "Mamba-2 state-space layers", "nemotron_h": "Mamba-2 state-space layers",
    "plamo2": "Mamba state-space layers", "rwkv": "RWKV recurrent layers", "xlstm": "xLSTM recurrent layers",
    "recurrent_gemma": "RG-LRU recurrent layers", "lfm2": "short convolution layers (LFM2)",
    "lfm2_moe": "short convolution layers (LFM2)", "lfm2_vl": "short convolution layers (LFM2)",
    "qwen3_next": "Gated DeltaNet linear-attention layers", "qwen3_5": "Gated DeltaNet linear-attention layers",
    "qwen3_5_moe": "Gated DeltaNet linear-attention layers", "minimax": "lightning (linear) attention layers",
    "kimi_linear": "linear-attention layers",
}




class Recurrent(ModelAdapter):
    model_types = tuple(RECURRENT)

    @classmethod
    def refusal(cls, model_type: str) -> str | None:
        return f"has {RECURRENT[model_type]}: {WHY_STATE}"

"""RECAP inside `model.generate`:

    model.generate(**inputs, custom_generate=recap.generate, do_sample=True, temperature=0.7)

transformers merges the generation config, builds the logits processors and stopping
criteria (stop strings, max_time, EOS lists), sends the prompt to the streamer, then calls
`recap.generate`, which decodes with a `recap.Decoder` kept with the model, one per
(``drafter``, ``recap_config``) pair, so the persistent memory stays warm across calls and
goes when the model goes. Any number of threads may call it on one model at once: each
request opens its own session on the shared decoder.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

import torch

from recap.decoding.config import RecapConfig
from recap.state.model_state import state_of

_LOCK = threading.Lock()


def decoder_for(model: torch.nn.Module, config: RecapConfig | None = None, drafter: str = "recap"):
    """The decoder `recap.generate` uses for `model` with this drafter and configuration
    (created on first use)."""
    from recap.decoding.decoder import Decoder

    if config is not None and not isinstance(config, RecapConfig):
        raise TypeError(f"recap_config: expected a recap.RecapConfig, got {type(config).__name__}")
    if not isinstance(drafter, str):
        raise TypeError(f"drafter: expected a drafter name (str), got {type(drafter).__name__}")
    config = config if config is not None else RecapConfig()
    state = state_of(model)
    key = (drafter, config)
    with _LOCK:  # two threads' first calls build one decoder
        dec = state.decoders.get(key)
        if dec is None:
            dec = state.decoders[key] = Decoder(model, config, drafter=drafter)
        return dec


def _streamer_given_to_generate(model: torch.nn.Module) -> Any:
    """The streamer the user gave `model.generate`. transformers (5.x) does not hand it to a
    callable `custom_generate` (it keeps only the callable's own keywords), though it has
    already put the prompt into it; it is read from that `generate` call's frame. When a
    transformers version passes it through, the `streamer` argument has it and this is not
    used."""
    frame = inspect.currentframe()
    try:
        for _ in range(8):  # recap.generate <- torch.no_grad's wrapper <- GenerationMixin.generate
            frame = frame.f_back if frame is not None else None
            if frame is None:
                return None
            if frame.f_code.co_name == "generate" and frame.f_locals.get("self") is model \
                    and "streamer" in frame.f_code.co_varnames:
                return frame.f_locals.get("streamer")
        return None
    finally:
        del frame


@torch.no_grad()
def generate(model: torch.nn.Module, input_ids: torch.Tensor, logits_processor=None, stopping_criteria=None,
             generation_config=None, synced_gpus: bool = False, streamer: Any = None, seed: int | None = None,
             recap_config: RecapConfig | None = None, drafter: str = "recap", memory_pool: Any = None,
             memory_scope: str | None = None, **model_kwargs: Any) -> torch.Tensor:
    """The `custom_generate` entry point (see the module docstring). Keywords given to
    `model.generate`: ``seed`` makes sampling reproducible by (seed, position);
    ``recap_config`` (a `recap.RecapConfig`) and ``drafter`` (a name from `recap.DRAFTERS`)
    choose the decoder; ``memory_pool`` (a `recap.MemoryPool`) and ``memory_scope`` keep the
    cross-request memory per scope."""
    from recap.decoding.request import from_transformers

    if synced_gpus:
        raise ValueError("recap.generate runs on one process; synced_gpus=True is not supported")
    if streamer is None:
        streamer = _streamer_given_to_generate(model)
    decoder = decoder_for(model, recap_config, drafter)
    request = from_transformers(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                streamer, seed, model_kwargs)
    return decoder.run(request, memory_scope=memory_scope, pool=memory_pool)

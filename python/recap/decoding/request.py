"""One generation request, validated: what `recap.Decoder.generate` and `recap.generate`
(transformers' `custom_generate`) both hand to the decoding loop.

Generation settings go through transformers' own `GenerationConfig` and logits-processor
and stopping-criteria factories, so every setting `generate` accepts means the same here;
what the loop cannot do (beams, several sequences per prompt, right padding, an assistant
model) raises a `ValueError` naming the argument, and a keyword that is neither a generation
setting nor a model input raises as `generate` does (a typo never passes silently).

A batch is input_ids [B, L] with the attention mask a tokenizer with ``padding_side="left"``
returns. Sampling takes one seed per row: ``seed=[s0, s1, ...]``, or one int ``s`` that gives
row i the seed ``s + i`` (row 0 of a batch is then the same request as at batch 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from recap.decoding.sampling import TokenChooser

UNSET: Any = object()  # eos_token_id not given: the generation config's (as generate does)
# Model kwargs that transformers' generate prepares for its own loop; the decoder makes its own.
PREPARED_BY_GENERATE = ("use_cache", "logits_to_keep", "position_ids", "cache_position", "cache", "past_key_values",
                        "output_attentions", "output_hidden_states", "return_dict_in_generate")


@dataclass
class Request:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    max_new: int
    eos: set[int]
    choosers: list[TokenChooser]  # one per row
    stopping: Any = None  # criteria beyond the length and EOS (stop strings, max_time, a user's own)
    streamer: Any = None
    streamer_has_prompt: bool = False
    model_inputs: dict = field(default_factory=dict)
    # What `generate(return_dict_in_generate=True, ...)` returns besides the sequences.
    return_dict: bool = False
    output_scores: bool = False
    output_logits: bool = False
    pad_token_id: int = 0  # what batched sequences hold after a row's end

    @property
    def chooser(self) -> TokenChooser:
        return self.choosers[0]

    @property
    def batch(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def padded(self) -> bool:
        """Decoded as a batch: several rows, or one row with left padding."""
        return self.batch > 1 or (self.attention_mask is not None and not bool(self.attention_mask.all()))

    @property
    def keeps_rows(self) -> bool:
        """Whether the loop keeps each committed token's logits (for scores or logits)."""
        return self.return_dict and (self.output_scores or self.output_logits)


def _check_input_ids(model, input_ids: Any, attention_mask, model_inputs: dict) -> tuple[torch.Tensor, Any]:
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids: expected a torch.Tensor shaped [batch, seq], got {type(input_ids).__name__}")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids: expected shape [batch, seq], got {tuple(input_ids.shape)}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids: expected at least one prompt of at least one token, got shape "
                         f"{tuple(input_ids.shape)}")
    device = model.get_input_embeddings().weight.device
    for name, value in [("input_ids", input_ids), *model_inputs.items()]:
        if isinstance(value, torch.Tensor) and value.device != device:
            raise ValueError(f"{name}: expected a tensor on the model's device {device}, got one on {value.device}")
    if attention_mask is not None:
        _check_left_padding(input_ids, attention_mask)
    elif input_ids.shape[0] > 1:
        attention_mask = torch.ones_like(input_ids)  # no mask: every row is a whole prompt
    return input_ids, attention_mask


def _check_left_padding(input_ids: torch.Tensor, mask: Any) -> None:
    """A mask of ones after leading zeros in every row (what padding_side="left" gives)."""
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(input_ids.shape):
        got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"attention_mask: expected a tensor shaped like input_ids {tuple(input_ids.shape)}, got {got}")
    m = mask.to(torch.long)
    if bool(((m != 0) & (m != 1)).any()):
        raise ValueError("attention_mask: expected 0 (padding) and 1 (token) only")
    for row in range(m.shape[0]):
        ones = int(m[row].sum())
        if ones == 0:
            raise ValueError(f"attention_mask: row {row} has no tokens (all padding)")
        if int(m[row, m.shape[1] - ones:].sum()) != ones:
            raise ValueError(f"attention_mask: row {row} is not left-padded; recap decodes batches with the padding "
                             "before each prompt (a tokenizer with padding_side='left'), got zeros after a token")


def row_seeds(seed: Any, rows: int) -> list[int | None]:
    """One seed per row: a list of `rows` ints as given, or one int s giving row i s + i."""
    if seed is None:
        return [None] * rows
    if isinstance(seed, (list, tuple)):
        if len(seed) != rows or not all(isinstance(s, int) and not isinstance(s, bool) for s in seed):
            raise ValueError(f"seed: expected one int per row ({rows}), got {seed!r}")
        return list(seed)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed: expected an int or a list of ints (one per row), got {type(seed).__name__}")
    return [seed + i for i in range(rows)]


def _choosers(processors, do_sample: bool, seed: Any, rows: int) -> list[TokenChooser]:
    return [TokenChooser(processors, do_sample, s) for s in row_seeds(seed, rows)]


def _check_batch(input_ids: torch.Tensor, streamer, gen) -> None:
    """What a batch cannot have: a streamer (one sequence, as generate's streamers), scores."""
    if input_ids.shape[0] == 1:
        return
    if streamer is not None:
        raise ValueError(f"streamer: streamers take one sequence; got a batch of {input_ids.shape[0]} prompts")
    for name in ("output_scores", "output_logits"):
        if getattr(gen, name, False):
            raise ValueError(f"{name}=True: recap returns per-token scores for one prompt at a time; got a batch "
                             f"of {input_ids.shape[0]} prompts")


def _pad_token(gen, eos: set[int]) -> int:
    pad = getattr(gen, "_pad_token_tensor", None)  # what generate pads with (set by _prepare_special_tokens)
    if pad is None:
        pad = getattr(gen, "pad_token_id", None)
    if isinstance(pad, torch.Tensor):
        pad = pad.reshape(-1)[0].item()
    if pad is None:
        pad = min(eos) if eos else 0  # generate pads with the (first) EOS id when no pad id is set
    return int(pad)


def _refuse_unsupported(gen) -> None:
    for name in ("output_attentions", "output_hidden_states"):
        if getattr(gen, name, False):
            raise ValueError(f"recap verifies draft trees in one pass per step; {name}=True (per-token "
                             "attentions or hidden states as generate returns them) is not supported; "
                             "output_scores and output_logits are")
    for name, ok in [("num_beams", gen.num_beams in (None, 1)),
                     ("num_return_sequences", gen.num_return_sequences in (None, 1)),
                     ("prompt_lookup_num_tokens", getattr(gen, "prompt_lookup_num_tokens", None) is None),
                     ("penalty_alpha", getattr(gen, "penalty_alpha", None) in (None, 0)),
                     ("num_beam_groups", getattr(gen, "num_beam_groups", 1) in (None, 1))]:
        if not ok:
            raise ValueError(f"recap decodes one sequence with its own drafts; {name}={getattr(gen, name, None)!r} "
                             "is not supported")


def _max_new(prompt_len: int, max_new_tokens, max_length, gen) -> int:
    if max_new_tokens is None and max_length is None:
        # As generate: the generation config's max_new_tokens, else its max_length, else 20 new tokens.
        max_new_tokens = getattr(gen, "max_new_tokens", None)
        max_length = None if max_new_tokens is not None else getattr(gen, "max_length", None)
        if max_new_tokens is None and max_length is None:
            max_new_tokens = 20
    if max_new_tokens is None:
        max_new_tokens = max_length - prompt_len
    elif max_length is not None:
        max_new_tokens = min(max_new_tokens, max_length - prompt_len)
    if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens: expected a positive int (after max_length), got {max_new_tokens!r}")
    return max_new_tokens


def eos_set(eos_token_id: Any) -> set[int]:
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.tolist()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(e) for e in eos_token_id}


def _beyond_length_and_eos(stopping):
    """The criteria the loop must ask per committed token; length and EOS it checks itself."""
    from transformers import StoppingCriteriaList
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    extra = StoppingCriteriaList([c for c in stopping if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))])
    return extra if len(extra) else None


def _processors_and_stopping(model, gen, input_ids, model_inputs, logits_processor, stopping_criteria, tokenizer):
    from transformers import LogitsProcessorList, StoppingCriteriaList

    device = input_ids.device
    model._prepare_special_tokens(gen, True, device=device)
    processors = model._get_logits_processor(
        generation_config=gen, input_ids_seq_length=input_ids.shape[1], encoder_input_ids=input_ids,
        prefix_allowed_tokens_fn=None, logits_processor=logits_processor or LogitsProcessorList(), device=device,
        model_kwargs=model_inputs)
    stopping = model._get_stopping_criteria(generation_config=gen,
                                            stopping_criteria=stopping_criteria or StoppingCriteriaList(),
                                            tokenizer=tokenizer)
    return processors, _beyond_length_and_eos(stopping)


def from_call(model, input_ids, attention_mask, *, max_new_tokens, max_length, eos_token_id, streamer,
              generation_config, logits_processor, stopping_criteria, seed, kwargs: dict) -> Request:
    """`recap.Decoder.generate(...)`: greedy unless `do_sample=True` (or a given generation
    config says so); other settings merge over the model's generation config, as in generate."""
    kwargs = dict(kwargs)
    tokenizer = kwargs.pop("tokenizer", None)
    gen, model_inputs = model._prepare_generation_config(generation_config, **kwargs)
    if "do_sample" not in kwargs and generation_config is None:
        gen.do_sample = False  # the Decoder is greedy unless asked (the model's config may say otherwise)
    _refuse_unsupported(gen)
    for name in ("use_cache",):
        model_inputs.pop(name, None)
    model._validate_model_kwargs(dict(model_inputs))
    input_ids, attention_mask = _check_input_ids(model, input_ids, attention_mask, model_inputs)
    prompt_len = input_ids.shape[1]
    source = generation_config if generation_config is not None else model.generation_config
    max_new = _max_new(prompt_len, max_new_tokens, max_length, source)
    eos = eos_set(gen.eos_token_id if eos_token_id is UNSET else eos_token_id)
    gen.max_length, gen.max_new_tokens, gen.eos_token_id = prompt_len + max_new, None, sorted(eos) or None
    _check_batch(input_ids, streamer, gen)
    processors, stopping = _processors_and_stopping(model, gen, input_ids, model_inputs, logits_processor,
                                                    stopping_criteria, tokenizer)
    return Request(input_ids, attention_mask, max_new, eos, _choosers(processors, gen.do_sample, seed, len(input_ids)),
                   stopping, streamer, False, model_inputs, *_outputs(gen), pad_token_id=_pad_token(gen, eos))


def from_transformers(model, input_ids, logits_processor, stopping_criteria, generation_config, streamer,
                      seed, model_kwargs: dict) -> Request:
    """`model.generate(..., custom_generate=recap.generate)`: transformers has merged the
    generation config, built the processors and stopping criteria and sent the prompt to the
    streamer; the loop takes them as they are."""
    gen = generation_config
    _refuse_unsupported(gen)
    model_kwargs = dict(model_kwargs)
    attention_mask = model_kwargs.pop("attention_mask", None)
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    if cache is not None and cache.get_seq_length() > 0:
        raise ValueError("recap.generate starts from the prompt; a filled cache (past_key_values) is not supported")
    for name in PREPARED_BY_GENERATE:
        model_kwargs.pop(name, None)
    input_ids, attention_mask = _check_input_ids(model, input_ids, attention_mask, model_kwargs)
    prompt_len = input_ids.shape[1]
    max_new = gen.max_length - prompt_len
    if max_new <= 0:
        raise ValueError(f"max_length: expected more than the prompt's {prompt_len} tokens, got {gen.max_length}")
    eos = eos_set(gen.eos_token_id)
    _check_batch(input_ids, streamer, gen)
    return Request(input_ids, attention_mask, max_new, eos,
                   _choosers(logits_processor, gen.do_sample, seed, len(input_ids)),
                   _beyond_length_and_eos(stopping_criteria), streamer, streamer is not None, model_kwargs,
                   *_outputs(gen), pad_token_id=_pad_token(gen, eos))


def _outputs(gen) -> tuple[bool, bool, bool]:
    return (bool(getattr(gen, "return_dict_in_generate", False)), bool(getattr(gen, "output_scores", False)),
            bool(getattr(gen, "output_logits", False)))

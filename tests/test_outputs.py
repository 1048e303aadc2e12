"""What `generate` gives besides the tokens, through `custom_generate=recap.generate` and
`Decoder.generate`: the streamer (transformers' own streamers, the iterator one from a
thread), and with `return_dict_in_generate=True` the scores and logits exactly as `generate`
returns them, plus the request's own statistics."""

import threading

import pytest
import recap
import torch
from tiny_models import llava_inputs, text_family
from transformers import TextIteratorStreamer, TextStreamer

PROMPT = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]])
GREEDY = dict(do_sample=False, max_new_tokens=14, eos_token_id=None, pad_token_id=0)


class Words:
    """A tokenizer for transformers' streamers: token t decodes to 'w<t> '."""

    def decode(self, ids, **_kw):
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        return "".join(f"w{int(t)} " for t in ids)


def words(ids) -> str:
    return Words().decode(ids)


def test_text_streamer_through_model_generate_prints_every_generated_token(capsys):
    model = text_family("Llama")
    want = model.generate(PROMPT, **GREEDY)
    capsys.readouterr()
    out = model.generate(PROMPT, custom_generate=recap.generate, streamer=TextStreamer(Words(), skip_prompt=True),
                         **GREEDY)
    assert torch.equal(out, want)
    printed = capsys.readouterr().out
    assert printed.strip() == words(want[0, PROMPT.shape[1]:]).strip()


def test_iterator_streamer_from_a_thread_as_chat_uis_use_it():
    model = text_family("Qwen2")
    want = model.generate(PROMPT, **GREEDY)
    streamer = TextIteratorStreamer(Words(), skip_prompt=True, timeout=60)
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault(
        "out", model.generate(PROMPT, custom_generate=recap.generate, streamer=streamer, **GREEDY)))
    worker.start()
    text = "".join(streamer)  # consumed while the other thread decodes
    worker.join()
    assert torch.equal(result["out"], want)
    assert text.strip() == words(want[0, PROMPT.shape[1]:]).strip()


def test_the_streamer_gets_the_prompt_once_and_then_each_commit():
    class Log:
        def __init__(self):
            self.calls = []

        def put(self, value):
            self.calls.append(value.reshape(-1).tolist())

        def end(self):
            self.calls.append("end")

    model = text_family("Llama")
    for call in ("custom_generate", "decoder"):
        log = Log()
        if call == "custom_generate":
            out = model.generate(PROMPT, custom_generate=recap.generate, streamer=log, **GREEDY)
        else:
            out = recap.Decoder(model).generate(PROMPT, streamer=log, max_new_tokens=14, eos_token_id=None)
        assert log.calls[0] == PROMPT[0].tolist() and log.calls[-1] == "end"
        assert sum(log.calls[1:-1], []) == out[0, PROMPT.shape[1]:].tolist()


def test_one_left_padded_prompt_streams_ends_and_scores_as_an_unpadded_one():
    """What a tokenizer returns for a single prompt with padding=True (as evaluation harnesses
    send it): the streamer gets the padded prompt, every generated token and end(); scores and
    logits are generate's."""
    class Log:
        def __init__(self):
            self.calls = []

        def put(self, value):
            self.calls.append(value.reshape(-1).tolist())

        def end(self):
            self.calls.append("end")

    model = text_family("Llama")
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), PROMPT], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(PROMPT)], dim=1)
    for call in ("custom_generate", "decoder"):
        kw = dict(GREEDY, return_dict_in_generate=True, output_scores=True, output_logits=True)
        if call == "custom_generate":  # generate's own processors, through its own path
            kw["repetition_penalty"] = 1.3
        want = model.generate(padded, attention_mask=mask, **kw)
        log = Log()
        if call == "custom_generate":
            got = model.generate(padded, attention_mask=mask, custom_generate=recap.generate, streamer=log, **kw)
        else:
            got = recap.Decoder(model).generate(padded, attention_mask=mask, streamer=log,
                                                **{k: v for k, v in kw.items() if k != "pad_token_id"})
        assert torch.equal(got.sequences, want.sequences), call
        assert log.calls[0] == padded[0].tolist() and log.calls[-1] == "end", call
        assert sum(log.calls[1:-1], []) == got.sequences[0, padded.shape[1]:].tolist(), call
        close(got.scores, want.scores)
        close(got.logits, want.logits)


def close(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype == torch.float32 and x.shape == y.shape
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family", ["Llama", "Qwen2", "Gemma", "Mistral"])
def test_greedy_scores_and_logits_equal_generates(family):
    model = text_family(family)
    kw = dict(GREEDY, return_dict_in_generate=True, output_scores=True, output_logits=True, repetition_penalty=1.3)
    want = model.generate(PROMPT, **kw)
    for got in (model.generate(PROMPT, custom_generate=recap.generate, **kw),
                recap.Decoder(model).generate(PROMPT, **{k: v for k, v in kw.items() if k != "pad_token_id"})):
        assert torch.equal(got.sequences, want.sequences)
        close(got.scores, want.scores)
        close(got.logits, want.logits)


def test_vision_language_scores_and_logits_equal_generates():
    model, inputs = llava_inputs([5, 6], [7, 8, 7, 8, 7, 8])
    kw = dict(GREEDY, return_dict_in_generate=True, output_scores=True, output_logits=True)
    want = model.generate(**inputs, **kw)
    got = model.generate(**inputs, custom_generate=recap.generate, **kw)
    assert torch.equal(got.sequences, want.sequences)
    close(got.scores, want.scores)
    close(got.logits, want.logits)


def test_sampled_scores_are_generates_scores_at_each_position_of_the_sampled_text():
    """Seeded sampling gives other tokens than generate's sampler; at each position of the
    sampled text, the scores equal generate's own (processed, before the draw) given the same
    preceding tokens."""
    model = text_family("Llama")
    settings = dict(do_sample=True, temperature=0.7, top_k=20, repetition_penalty=1.2, eos_token_id=None,
                    pad_token_id=0)
    got = model.generate(PROMPT, custom_generate=recap.generate, seed=11, max_new_tokens=10,
                         return_dict_in_generate=True, output_scores=True, output_logits=True, **settings)
    n = PROMPT.shape[1]
    for t in range(10):
        ref = model.generate(got.sequences[:, :n + t], max_new_tokens=1, return_dict_in_generate=True,
                             output_scores=True, output_logits=True, **settings)
        torch.testing.assert_close(got.scores[t], ref.scores[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got.logits[t], ref.logits[0], rtol=1e-6, atol=1e-6)


def test_the_returned_dict_carries_the_requests_statistics():
    model = text_family("Llama")
    got = model.generate(PROMPT, custom_generate=recap.generate, return_dict_in_generate=True, **GREEDY)
    stats = got.recap_stats
    assert got.scores is None and got.logits is None  # not asked for
    assert stats["new_tokens"] == got.sequences.shape[1] - PROMPT.shape[1] == 14
    assert sum(stats["accepted_lengths"].values()) == stats["steps"]
    # Every step commits its accepted nodes and one more: the first token came from the prefill.
    committed = sum((length + 1) * count for length, count in stats["accepted_lengths"].items())
    assert committed >= stats["new_tokens"] - 1 and stats["tau"] > 1.0  # the prompt repeats
    assert stats["total_s"] >= stats["prefill_s"]


@pytest.mark.parametrize("name", ["output_attentions", "output_hidden_states"])
def test_what_the_loop_cannot_return_raises_naming_it(name):
    model = text_family("Llama")
    with pytest.raises(ValueError, match=f"{name}=True"):
        model.generate(PROMPT, custom_generate=recap.generate, return_dict_in_generate=True, **{name: True},
                       **GREEDY)
    with pytest.raises(ValueError, match=f"{name}=True"):
        recap.Decoder(model).generate(PROMPT, return_dict_in_generate=True, max_new_tokens=4, **{name: True})

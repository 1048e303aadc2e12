"""recap.Decoder equals model.generate(do_sample=False) on every supported architecture."""

import pytest
import recap
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recap import RecapConfig
from tiny_models import V, llava_inputs, llava_next_inputs, qwen25_vl_inputs, text_model

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
configs = st.builds(
    RecapConfig,
    budget=st.one_of(st.integers(0, 40), st.just("auto")),
    max_budget=st.integers(0, 40),
    max_depth=st.integers(1, 8),
    fusion=st.sampled_from(["unigram", "backoff", "uniform", "prior", "prior_confidence"]),
    suffix_len=st.one_of(st.integers(0, 6), st.just("auto")),
)
# Prompts with repeats so the suffix automaton and memories have something to find.
# Ids 100-103 are the image/video placeholders and vision delimiters of the tiny VLMs.
plain_tokens = st.integers(3, V - 1).filter(lambda t: not 100 <= t <= 103)
prompts = st.lists(plain_tokens, min_size=1, max_size=12).flatmap(
    lambda base: st.lists(st.sampled_from(base), min_size=1, max_size=40)
)


def reference(model, inputs, max_new, eos):
    return model.generate(**inputs, do_sample=False, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=0)


# Both linear layouts, drawn explicitly: "auto" picks one by timing, which differs by machine.
layouts = st.sampled_from(["auto", "default", "transposed"])


def check(model, inputs, config, max_new, eos=None, layout="auto"):
    want = reference(model, inputs, max_new, eos)
    dec = recap.Decoder(model, config, linear_layout=layout)
    got = dec.generate(**inputs, max_new_tokens=max_new, eos_token_id=eos)
    assert got.tolist() == want.tolist()
    stats = dec.last_stats
    assert stats.new_tokens == want.shape[1] - inputs["input_ids"].shape[1]
    assert stats.steps <= max(stats.new_tokens - 1, 0)
    return dec


@pytest.mark.parametrize("arch", ["Llama", "Qwen2", "Mistral", "Gemma"])
@SETTINGS
@given(prompt=prompts, config=configs, max_new=st.integers(1, 48), eos=st.sampled_from([None, 5, 7]),
       layout=layouts)
def test_text_models_equal_greedy(arch, prompt, config, max_new, eos, layout):
    ids = torch.tensor([prompt])
    check(text_model(arch), dict(input_ids=ids, attention_mask=torch.ones_like(ids)), config, max_new, eos, layout)


@pytest.mark.parametrize("build", [qwen25_vl_inputs, llava_inputs, llava_next_inputs],
                         ids=["qwen2.5-vl", "llava", "llava-next"])
@SETTINGS
@given(prefix=st.lists(st.integers(3, 90), max_size=6), suffix=prompts, config=configs,
       max_new=st.integers(1, 40), layout=layouts)
def test_vision_language_models_equal_greedy(build, prefix, suffix, config, max_new, layout):
    model, inputs = build(prefix, suffix)
    dec = check(model, inputs, config, max_new, layout=layout)
    assert 100 in dec.adapter.excluded  # image placeholders are never drafted


def test_memory_persists_across_calls_and_can_be_shared():
    model = text_model("Llama")
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    fixed = RecapConfig(budget=63, suffix_len=4)  # tree sizes independent of timing
    first = recap.Decoder(model, fixed)
    first.generate(ids, max_new_tokens=20, eos_token_id=None)
    rows_after_first = len(first.memory)
    assert rows_after_first > 0
    second = recap.Decoder(model, fixed, memory=first.memory)
    second.generate(ids, max_new_tokens=20, eos_token_id=None)
    assert second.memory is first.memory
    # The second call starts with U already warm: it needs no more steps than the first.
    assert second.last_stats.steps <= first.last_stats.steps


def test_streamer_receives_prompt_then_every_committed_token():
    class Collect:
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.ended = True

    model = text_model("Llama")
    ids = torch.tensor([[9, 10, 11, 9, 10]])
    s = Collect()
    out = recap.Decoder(model).generate(ids, max_new_tokens=25, eos_token_id=None, streamer=s)
    assert s.ended and s.chunks[0] == ids[0].tolist()
    assert sum(s.chunks[1:], []) == out[0, ids.shape[1]:].tolist()


def test_max_length_is_respected_exactly():
    model = text_model("Llama")
    ids = torch.tensor([[3, 4, 5, 3, 4, 5]])
    out = recap.Decoder(model).generate(ids, max_length=17, eos_token_id=None)
    want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_length=17,
                          eos_token_id=None, pad_token_id=0)
    assert out.shape[1] == 17 and out.tolist() == want.tolist()


@pytest.mark.parametrize("gen_max_length", [None, 14])
def test_default_length_follows_the_generation_config(gen_max_length):
    model = text_model("Llama")
    ids = torch.tensor([[3, 4, 5, 3, 4, 5]])
    saved = model.generation_config.max_length
    model.generation_config.max_length = gen_max_length
    try:
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, eos_token_id=None,
                              pad_token_id=0)
        got = recap.Decoder(model).generate(ids, eos_token_id=None)
    finally:
        model.generation_config.max_length = saved
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"num_beams": 3}, ValueError, "num_beams=3 is not supported"),
        ({"max_new_token": 50}, ValueError, "not used by the model: \\['max_new_token'\\]"),
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens: expected a positive int"),
        ({"max_new_tokens": -2}, ValueError, "max_new_tokens"),
    ],
)
def test_bad_requests_raise_clear_errors(kwargs, error, fragment):
    dec = recap.Decoder(text_model("Llama"))
    with pytest.raises(error, match=fragment):
        dec.generate(torch.tensor([[1, 2, 3]]), **{"max_new_tokens": 5, **kwargs})


def test_bad_inputs_raise_clear_errors():
    model = text_model("Llama")
    dec = recap.Decoder(model)
    two = torch.tensor([[1, 2], [3, 4]])  # a batch without a mask: two whole prompts, as generate reads it
    assert torch.equal(dec.generate(two, max_new_tokens=4), model.generate(two, max_new_tokens=4, do_sample=False))
    with pytest.raises(ValueError, match="at least one prompt of at least one token"):
        dec.generate(torch.zeros((1, 0), dtype=torch.long), max_new_tokens=4)
    with pytest.raises(TypeError, match="expected a torch.Tensor"):
        dec.generate([1, 2, 3], max_new_tokens=4)
    with pytest.raises(ValueError, match="on the model's device"):
        dec.generate(torch.tensor([[1, 2]], device="meta"), max_new_tokens=4)


def test_construction_runs_no_forward_pass_and_first_use_prepares():
    import copy

    model = copy.deepcopy(text_model("Qwen2"))  # nothing measured or probed on it yet
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        dec = recap.Decoder(model)  # budget="auto", linear_layout="auto"
        assert calls == []
        ids = torch.tensor([[5, 6, 7, 5, 6, 7]])
        dec.generate(ids, max_new_tokens=4)
        # The probe's four passes (two of them, at 1 and 6 tokens, samples of the first cost
        # curve), the curve's context prefill and passes at 1, 2, 4 and 6 tokens (an untimed one
        # at 2 and 4, REPS samples of each size less the probe's), the prefill and at most
        # three steps:
        # the layout choice waits for a later request.
        from recap.first_use.budget import POINTS, REPS

        curve = 1 + 2 + REPS * 4 - 2
        first = len(calls)
        assert 6 + curve <= first <= 8 + curve and dec._cost.points == [1, 2, 4, 6]
        assert dec.cost.points == list(POINTS) and len(calls) > first + 4  # reading it makes the choice
    finally:
        handle.remove()


def test_only_drafters_that_learn_from_the_prompt_pay_for_its_rows():
    """The prompt's top-K rows seed persistent memories; a drafter without one (ar, pld,
    sam, suffix) prefills as generate does: the head at the last position only."""
    model = text_model("Llama")
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 9, 10]])
    head = model.get_output_embeddings()
    for drafter, rows in [("ar", 1), ("pld", 1), ("suffix", 1), ("recap", ids.shape[1]), ("tr", ids.shape[1])]:
        dec = recap.Decoder(model, RecapConfig(budget=8), drafter=drafter)
        dec.calibrate()  # first use (probe, layout, curve) out of the way
        dec.generate(ids, max_new_tokens=2)
        seen: list[int] = []

        def count(_m, args, _o, seen=seen):
            seen.append(args[0].reshape(-1, args[0].shape[-1]).shape[0])

        handle = head.register_forward_hook(count)
        try:
            dec.generate(ids, max_new_tokens=1)
        finally:
            handle.remove()
        assert sum(seen) == rows + (1 if rows > 1 else 0), (drafter, seen)  # the seed chunks and the last position

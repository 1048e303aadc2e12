"""Sampling and `custom_generate`: with a seed, every drafter at every budget commits the
same tokens as one-token sampling (`ar`); the sampled distribution matches transformers'
own `generate(do_sample=True)`; logits processors follow each node's own path; RECAP runs
inside `model.generate(custom_generate=recap.generate)` with its stopping criteria."""

import numpy as np
import pytest
import recap
import torch
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recap import RecapConfig
from recap.decoding.sampling import inverse_cdf, uniform
from tiny_models import TEXT_FAMILIES, VLM_FAMILIES, V, text_family

SETTINGS = settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
plain = st.integers(3, V - 1).filter(lambda t: not 100 <= t <= 103)
prompts = st.lists(plain, min_size=1, max_size=8).flatmap(
    lambda b: st.lists(st.sampled_from(b), min_size=1, max_size=24))
budgets = st.one_of(st.just("auto"), st.integers(0, 40))
sampling = st.fixed_dictionaries({}, optional={
    "temperature": st.sampled_from([0.3, 0.7, 1.0, 1.5]),
    "top_k": st.integers(2, 40),
    "top_p": st.sampled_from([0.5, 0.9, 0.97]),
    "min_p": st.sampled_from([0.01, 0.05]),
    "repetition_penalty": st.sampled_from([1.1, 1.3]),
    "no_repeat_ngram_size": st.integers(2, 3),
    "min_new_tokens": st.integers(1, 10),
})


def sample(model, inputs, drafter, budget, seed, max_new, settings_):
    dec = recap.Decoder(model, RecapConfig(budget=budget), drafter=drafter)
    out = dec.generate(**inputs, do_sample=True, seed=seed, max_new_tokens=max_new, **settings_)
    return out.tolist(), dec


def text_inputs(prompt):
    ids = torch.tensor([prompt])
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids))


@pytest.mark.parametrize("family", list(TEXT_FAMILIES))
@SETTINGS
@given(prompt=prompts, drafter=st.sampled_from(sorted(recap.DRAFTERS)), budget=budgets, seed=st.integers(0, 2**40),
       max_new=st.integers(1, 32), settings_=sampling)
def test_every_drafter_samples_the_same_tokens_as_ar_for_a_seed(family, prompt, drafter, budget, seed, max_new,
                                                                  settings_):
    model = text_family(family)
    want, _ = sample(model, text_inputs(prompt), "ar", 0, seed, max_new, settings_)
    got, _ = sample(model, text_inputs(prompt), drafter, budget, seed, max_new, settings_)
    assert got == want


@pytest.mark.parametrize("family", list(VLM_FAMILIES))
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(suffix=prompts, drafter=st.sampled_from(["recap", "pld", "tr", "suffix"]), budget=budgets,
       seed=st.integers(0, 2**40), settings_=sampling)
def test_vision_language_sampling_is_reproducible_across_drafters(family, suffix, drafter, budget, seed, settings_):
    model, inputs = VLM_FAMILIES[family]([5, 6], suffix)
    want, _ = sample(model, inputs, "ar", 0, seed, 24, settings_)
    got, _ = sample(model, inputs, drafter, budget, seed, 24, settings_)
    assert got == want


def test_sampled_tokens_follow_transformers_distribution():
    """First 3 tokens: recap.Decoder over seeds 0..N-1 against model.generate(do_sample=True)
    over torch seeds 0..N-1, same processors (temperature 1.3, top-k 6, repetition penalty
    1.2); N = 400 runs each, vocabulary 12; every position's total-variation distance < 0.12
    (about twice the expected sampling noise of two 400-sample histograms over 6 tokens),
    and the first token also against its exact processed distribution."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=12, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=1,
                                   pad_token_id=0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.float64).eval()
    ids = torch.tensor([[3, 4, 5, 3, 4]])
    kw = dict(temperature=1.3, top_k=6, repetition_penalty=1.2, max_new_tokens=3, eos_token_id=None)
    n = 400
    dec = recap.Decoder(model, RecapConfig(budget=8))
    ours = np.array([dec.generate(ids, do_sample=True, seed=s, **kw)[0, 5:].tolist() for s in range(n)])
    theirs = []
    for s in range(n):
        torch.manual_seed(s)
        theirs.append(model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, pad_token_id=0,
                                     **kw)[0, 5:].tolist())
    theirs = np.array(theirs)
    for pos in range(3):
        a = np.bincount(ours[:, pos], minlength=12) / n
        b = np.bincount(theirs[:, pos], minlength=12) / n
        assert 0.5 * np.abs(a - b).sum() < 0.12, (pos, a, b)
    procs = transformers.LogitsProcessorList([transformers.RepetitionPenaltyLogitsProcessor(1.2),
                                              transformers.TemperatureLogitsWarper(1.3),
                                              transformers.TopKLogitsWarper(6)])
    with torch.no_grad():
        scores = procs(ids, model(ids).logits[:, -1])
    exact = torch.softmax(scores[0], -1).numpy()
    first = np.bincount(ours[:, 0], minlength=12) / n
    assert 0.5 * np.abs(first - exact).sum() < 0.1, (first, exact)


def test_inverse_cdf_and_the_counter_uniform():
    assert uniform(7, 3) == uniform(7, 3) and uniform(7, 3) != uniform(7, 4) and uniform(8, 3) != uniform(7, 3)
    us = [uniform(1, t) for t in range(2000)]
    assert 0 <= min(us) and max(us) < 1 and abs(np.mean(us) - 0.5) < 0.03
    scores = torch.tensor([0.0, float("-inf"), 0.0, float("-inf")])
    assert inverse_cdf(scores, 0.0) == 0 and inverse_cdf(scores, 0.49) == 0 and inverse_cdf(scores, 0.51) == 2
    assert inverse_cdf(scores, 1.0 - 1e-16) == 2  # never a zero-probability token


def test_without_a_seed_torch_manual_seed_repeats_a_run():
    model = text_family("Llama")
    ids = torch.tensor([[5, 6, 7, 5, 6, 7]])
    runs = []
    for _ in range(2):
        torch.manual_seed(11)
        runs.append(recap.Decoder(model).generate(ids, do_sample=True, max_new_tokens=20, eos_token_id=None).tolist())
    assert runs[0] == runs[1]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=prompts, drafter=st.sampled_from(sorted(recap.DRAFTERS)), max_new=st.integers(1, 32),
       processors=st.fixed_dictionaries({}, optional={
           "repetition_penalty": st.sampled_from([1.2, 1.5]), "no_repeat_ngram_size": st.integers(2, 3),
           "min_new_tokens": st.integers(1, 8), "bad_words_ids": st.just([[9], [10, 11]]),
           "suppress_tokens": st.just([12, 13])}))
def test_greedy_with_processors_equals_generate(prompt, drafter, max_new, processors):
    model = text_family("Qwen2")
    ids = torch.tensor([prompt])
    want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                          eos_token_id=7, pad_token_id=0, **processors)
    got = recap.Decoder(model, drafter=drafter).generate(ids, max_new_tokens=max_new, eos_token_id=7, **processors)
    assert got.tolist() == want.tolist()


class StopAfterPair(transformers.StoppingCriteria):
    """Stops once the last two tokens are (a, b): a criterion on committed text."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __call__(self, input_ids, scores, **kwargs):
        return torch.tensor([input_ids.shape[1] >= 2 and input_ids[0, -2:].tolist() == [self.a, self.b]])


def test_custom_generate_equals_generate_and_honours_stopping_per_token():
    model = text_family("Llama")
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5]])
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=40, eos_token_id=None, pad_token_id=0)
    plain = model.generate(ids, **kw)
    assert model.generate(ids, custom_generate=recap.generate, **kw).tolist() == plain.tolist()
    a, b = plain[0, 20:22].tolist()  # a pair that shows up mid-output: the run must stop right after it
    stop = transformers.StoppingCriteriaList([StopAfterPair(a, b)])
    want = model.generate(ids, stopping_criteria=stop, **kw)
    got = model.generate(ids, custom_generate=recap.generate, stopping_criteria=stop, **kw)
    assert got.tolist() == want.tolist() and got.shape[1] <= 22
    direct = recap.Decoder(model).generate(ids, stopping_criteria=stop, max_new_tokens=40, eos_token_id=None)
    assert direct.tolist() == want.tolist()
    sampled = model.generate(ids, custom_generate=recap.generate, do_sample=True, temperature=0.8, seed=5, **kw)
    again = recap.Decoder(model, drafter="ar").generate(ids, do_sample=True, temperature=0.8, seed=5,
                                                        max_new_tokens=40, eos_token_id=None)
    assert sampled.tolist() == again.tolist()


def test_custom_generate_keeps_one_decoder_per_model_and_copies_start_fresh():
    import copy

    from recap.decoding.generation import decoder_for

    model = copy.deepcopy(text_family("Llama"))
    ids = torch.tensor([[5, 6, 7, 5, 6, 7]])
    model.generate(ids, custom_generate=recap.generate, max_new_tokens=8, pad_token_id=0)
    dec = decoder_for(model)
    assert decoder_for(model) is dec and len(dec.memory) > 0  # warm across calls
    assert decoder_for(copy.deepcopy(model)) is not dec


@pytest.mark.parametrize("kwargs, fragment", [
    ({"num_beams": 2}, "num_beams=2 is not supported"),
    ({"num_return_sequences": 2, "do_sample": True}, "num_return_sequences=2"),
    ({"max_new_token": 5}, "max_new_token"),
])
def test_what_cannot_be_done_raises_naming_the_argument(kwargs, fragment):
    model = text_family("Llama")
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match=fragment):
        model.generate(ids, custom_generate=recap.generate, pad_token_id=0, **kwargs)
    with pytest.raises(ValueError, match=fragment):
        recap.Decoder(model).generate(ids, **kwargs)


def test_right_padding_is_refused_in_model_generate_too():
    model = text_family("Llama")
    ids = torch.tensor([[5, 6, 0], [7, 8, 9]])
    with pytest.raises(ValueError, match="not left-padded"):
        model.generate(ids, attention_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]), custom_generate=recap.generate,
                       pad_token_id=0, max_new_tokens=4)

"""Model coverage: every text family equals greedy `generate` (Hypothesis, every drafter and
budget drawn), sliding-window families far past their window, refused families get the
reason, and models that break tree verification are caught by the conformance probe."""

import pytest
import recap
import torch
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recap import RecapConfig
from recap.adapters import UnsupportedModelError, adapter_for
from tiny_models import TEXT_FAMILIES, VLM_FAMILIES, WINDOW, V, text_family

SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
plain_tokens = st.integers(3, V - 1)
prompts = st.lists(plain_tokens.filter(lambda t: not 100 <= t <= 103), min_size=1, max_size=10).flatmap(
    lambda base: st.lists(st.sampled_from(base), min_size=1, max_size=30))
budgets = st.one_of(st.just("auto"), st.integers(0, 40))


def equal_to_generate(model, prompt, max_new, drafter="recap", config=None):
    ids = torch.tensor([prompt])
    want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                          eos_token_id=None, pad_token_id=0)
    dec = recap.Decoder(model, config or RecapConfig(), drafter=drafter)
    got = dec.generate(ids, max_new_tokens=max_new, eos_token_id=None)
    assert got.tolist() == want.tolist()
    return dec


@pytest.mark.parametrize("family", list(TEXT_FAMILIES))
@SETTINGS
@given(prompt=prompts, max_new=st.integers(1, 40), drafter=st.sampled_from(sorted(recap.DRAFTERS)), budget=budgets)
def test_text_families_equal_greedy(family, prompt, max_new, drafter, budget):
    equal_to_generate(text_family(family), prompt, max_new, drafter, RecapConfig(budget=budget))


@pytest.mark.parametrize("family", list(VLM_FAMILIES))
@SETTINGS
@given(prefix=st.lists(st.integers(3, 90), max_size=6), suffix=prompts, max_new=st.integers(1, 40),
       drafter=st.sampled_from(sorted(recap.DRAFTERS)), budget=budgets)
def test_vision_language_families_equal_greedy_with_real_images(family, prefix, suffix, max_new, drafter, budget):
    model, inputs = VLM_FAMILIES[family](prefix, suffix)
    want = model.generate(**inputs, do_sample=False, max_new_tokens=max_new, eos_token_id=None, pad_token_id=0)
    dec = recap.Decoder(model, RecapConfig(budget=budget), drafter=drafter)
    got = dec.generate(**inputs, max_new_tokens=max_new, eos_token_id=None)
    assert got.tolist() == want.tolist()
    assert 100 in dec.adapter.excluded  # image placeholders are never drafted


SLIDING = [f for f in TEXT_FAMILIES if adapter_for(text_family(f)).sliding_window is not None]


@pytest.mark.parametrize("family", SLIDING)
def test_sliding_window_families_stay_exact_far_past_the_window(family):
    dec = equal_to_generate(text_family(family), [5, 6, 7, 8, 9] * 3, 80)
    assert dec.adapter.sliding_window == WINDOW
    assert dec.last_stats.steps < 79  # drafts were accepted across the window's edge


def test_the_sliding_families_include_mixed_layer_types():
    mixed = [f for f in SLIDING if len(adapter_for(text_family(f)).mask_types) == 2]
    assert len(SLIDING) >= 8 and len(mixed) >= 6, (SLIDING, mixed)


def _tiny(cfg_name: str, model_name: str, **kw):
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_name)(**kw)
    return getattr(transformers, model_name)(cfg).eval()


REFUSED = {
    "Mamba": (lambda: _tiny("MambaConfig", "MambaForCausalLM", vocab_size=V, hidden_size=32, num_hidden_layers=2,
                            state_size=4), "Mamba state-space"),
    "Jamba": (lambda: _tiny("JambaConfig", "JambaForCausalLM", vocab_size=V, hidden_size=64, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=2,
                            attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                            use_mamba_kernels=False), "Jamba hybrid"),
    "Falcon-H1": (lambda: _tiny("FalconH1Config", "FalconH1ForCausalLM", vocab_size=V, hidden_size=64,
                                intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8),
                  "Falcon-H1 hybrid"),
    "LFM2": (lambda: _tiny("Lfm2Config", "Lfm2ForCausalLM", vocab_size=V, hidden_size=64, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           layer_types=["conv", "full_attention"]), "convolution"),
    "T5": (lambda: _tiny("T5Config", "T5ForConditionalGeneration", vocab_size=V, d_model=32, d_ff=64, num_layers=1,
                         num_heads=2, d_kv=16), "encoder-decoder"),
}


@pytest.mark.parametrize("family", list(REFUSED))
def test_models_that_cannot_be_tree_verified_are_refused_with_the_reason(family):
    build, reason = REFUSED[family]
    with pytest.raises(UnsupportedModelError, match=reason):
        recap.Decoder(build())


class IgnoresMask(transformers.LlamaForCausalLM):
    def forward(self, *args, attention_mask=None, **kwargs):
        return super().forward(*args, **kwargs)  # the model builds its own causal mask


class IgnoresPositions(transformers.LlamaForCausalLM):
    def forward(self, *args, position_ids=None, **kwargs):
        return super().forward(*args, **kwargs)  # positions follow the cache instead


@pytest.mark.parametrize("cls, reason", [(IgnoresMask, "ignores the 4D tree attention mask"),
                                         (IgnoresPositions, "ignores explicit position ids")])
def test_the_conformance_probe_names_what_a_model_gets_wrong(cls, reason):
    model = cls(text_family("Llama").config).to(torch.float64).eval()
    dec = recap.Decoder(model)  # cheap: the probe runs on first use
    with pytest.raises(UnsupportedModelError, match=reason):
        dec.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4)


def test_objects_without_a_language_model_head_are_refused():
    class Tiny(torch.nn.Module):
        pass

    with pytest.raises(TypeError, match="language-model head.*got a Tiny"):
        recap.Decoder(Tiny())


def test_the_readme_table_of_supported_models_is_current():
    from scripts import ROOT, load_script

    tool = load_script("tools/supported_models.py")
    readme = (ROOT / "README.md").read_text()
    assert tool.render(readme, tool.table()) == readme, "run: python tools/supported_models.py"

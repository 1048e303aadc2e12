"""First-use measurements kept across processes (recap.state.measurements)."""

import copy

import recap
import torch
from recap.first_use import budget
from recap.state import measurements
from tiny_models import text_family

LAYOUT = "default"


def test_a_second_process_takes_the_cost_curve_without_measuring(tmp_path, monkeypatch):
    # A named layout: with "auto" the layout probe's passes are the curve's points.
    monkeypatch.setenv("RECAP_CACHE", "1")
    monkeypatch.setenv("RECAP_CACHE_DIR", str(tmp_path))
    calls = []
    real = budget._measure
    monkeypatch.setattr(budget, "_measure", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = copy.deepcopy(text_family("Llama"))  # a copy starts with nothing measured in-process
    dec = recap.Decoder(model, linear_layout=LAYOUT)
    first = dec.calibrate()
    assert calls == [1] and not any(tmp_path.glob("cost-*.json"))  # not stored before decoding confirms it
    prompt = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    while dec.cost.confirmed_by == 0:  # the online curve carries over: its steps add up
        dec.generate(prompt, max_new_tokens=40, min_new_tokens=40)
    first = dec.cost
    assert any(tmp_path.glob("cost-*.json")) and first.confirmed_by >= budget.HEAL_AFTER
    again = copy.deepcopy(model)  # as a new process sees it: nothing kept with the model
    second = recap.Decoder(again, linear_layout=LAYOUT).calibrate()
    assert calls == [1] and second.points == first.points and second.seconds == first.seconds
    assert torch.equal(recap.Decoder(again, linear_layout=LAYOUT).generate(prompt, max_new_tokens=12),
                       again.generate(prompt, max_new_tokens=12, do_sample=False))
    recap.Decoder(copy.deepcopy(model), linear_layout=LAYOUT).calibrate(refresh=True)  # refresh measures again
    assert calls == [1, 1]
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.lm_head.weight.mul_(1.5)  # another checkpoint of the same shapes: its own entry
    recap.Decoder(other, linear_layout=LAYOUT).calibrate()
    assert calls == [1, 1, 1]
    assert measurements.clear() >= 2 and not any(tmp_path.glob("cost-*.json"))


def test_turned_off_nothing_is_read_or_written(tmp_path, monkeypatch):
    monkeypatch.setenv("RECAP_CACHE", "0")
    monkeypatch.setenv("RECAP_CACHE_DIR", str(tmp_path))
    recap.Decoder(copy.deepcopy(text_family("Qwen2"))).calibrate()
    assert not list(tmp_path.iterdir())
    measurements.store("x.json", 1)
    assert measurements.load("x.json") is None and not list(tmp_path.iterdir())


def test_an_unwritable_folder_is_skipped(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("RECAP_CACHE", "1")
    monkeypatch.setenv("RECAP_CACHE_DIR", str(blocked / "sub"))
    measurements.store("y.json", {"a": 1})  # no error
    assert measurements.load("y.json") is None


def test_a_later_process_runs_its_first_request_in_the_stored_layout(tmp_path, monkeypatch):
    import recap.first_use.layout_choice as layouts
    from recap.verify.linear_layout import DEFAULT, SWAPPED

    monkeypatch.setenv("RECAP_CACHE", "1")
    monkeypatch.setenv("RECAP_CACHE_DIR", str(tmp_path))
    timed = []
    monkeypatch.setattr(layouts, "_measure", lambda *a: timed.append(1) or SWAPPED)  # swapped measured faster
    model = copy.deepcopy(text_family("Llama"))
    prompt = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    want = model.generate(prompt, max_new_tokens=12, do_sample=False)
    dec = recap.Decoder(model)
    assert torch.equal(dec.generate(prompt, max_new_tokens=12), want)
    assert timed == [] and dec._plan == DEFAULT  # deferred: nothing stored to go by
    assert torch.equal(dec.generate(prompt, max_new_tokens=12), want)
    assert timed == [1] and any(tmp_path.glob("layout-*.json"))
    again = copy.deepcopy(model)  # as a new process sees it
    later = recap.Decoder(again)
    assert torch.equal(later.generate(prompt, max_new_tokens=12), want)
    assert timed == [1] and later._plan == SWAPPED  # the stored choice, from the first request


def test_a_layout_decision_stored_by_another_probe_is_taken_again(tmp_path, monkeypatch):
    import recap.first_use.layout_choice as layouts

    monkeypatch.setenv("RECAP_CACHE", "1")
    monkeypatch.setenv("RECAP_CACHE_DIR", str(tmp_path))
    model = copy.deepcopy(text_family("Qwen2"))
    measurements.store(measurements.key(model, "layout"), True)  # the name an earlier probe stored under
    measurements.store(measurements.key(model, "layout", ("probe", 1, 12)), True)  # a yes or no for the copy
    assert layouts.undecided(model, budget.model_key(model), "auto")
    measurements.store(layouts._stored_as(model), "fast")  # not a plan's name
    assert layouts.undecided(model, budget.model_key(model), "auto")
    measurements.store(layouts._stored_as(model), "transposed+swapped")
    assert not layouts.undecided(model, budget.model_key(model), "auto")

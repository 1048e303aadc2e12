"""benches/modeled_budget.py: the budget's choices charged a fixed cost curve are the same in
every run (what makes it a fair yardstick for controller changes on a noisy machine)."""

import json
import os

import numpy as np
import pytest
import torch
from recap.decoding import decoder as decoder_module
from recap.verify import seeding
from scripts import load_script


def load_bench():
    return load_script("benches/modeled_budget.py")


def assert_charged_the_curve(rows: list[dict], points: list[int], ms: list[float]) -> None:
    """Each row's speedup is plain decoding's passes over its own trees' passes, both priced
    by the modeled curve."""
    for r in rows:
        assert r["steps"] == len(r["tree_sizes"])
        spent = sum(np.interp(n, points, ms) for n in r["tree_sizes"])
        new_tokens = round(r["tau"] * r["steps"]) + 1
        assert r["speedup"] == pytest.approx((new_tokens - 1) * ms[0] / spent)


def test_two_tiny_runs_make_the_same_choices_and_report_them(tmp_path):
    bench = load_bench()
    decode, observe, share = decoder_module.decode, seeding.observe, seeding.head_share
    store, threads = os.environ.get("RECAP_CACHE"), torch.get_num_threads()
    assert bench.main(["--tiny", "--quiet", "--out", str(tmp_path / "a")]) == 0
    assert bench.main(["--tiny", "--quiet", "--out", str(tmp_path / "b")]) == 0
    a = json.loads((tmp_path / "a" / "modeled_budget.json").read_text())
    b = json.loads((tmp_path / "b" / "modeled_budget.json").read_text())
    assert [r["tree_sizes"] for r in a["rows"]] == [r["tree_sizes"] for r in b["rows"]]
    assert [r["speedup"] for r in a["rows"]] == [r["speedup"] for r in b["rows"]]
    assert_charged_the_curve(a["rows"], *bench.parse_curve(a["curve"]))
    drafted = sum(n > 1 for r in a["rows"] for n in r["tree_sizes"])
    assert drafted > 0  # the repeating prompts get drafts, so the choices are the budget's
    assert a["summary"]["all"]["prompts"] == len(a["rows"]) == 4
    assert (tmp_path / "a" / "modeled_budget.md").read_text().startswith("modeled curve")
    # The clock, the seeding share's correction, the store and the thread count are as they were.
    assert (decoder_module.decode, seeding.observe, seeding.head_share) == (decode, observe, share)
    assert (os.environ.get("RECAP_CACHE"), torch.get_num_threads()) == (store, threads)


def test_a_peer_is_charged_the_same_curve(tmp_path):
    """`--drafter sam`: SAM's chains, every pass charged the modeled curve like RECAP's."""
    bench = load_bench()
    assert bench.main(["--tiny", "--quiet", "--drafter", "sam", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "modeled_budget.json").read_text())["rows"]
    assert {r["drafter"] for r in rows} == {"sam"}
    assert_charged_the_curve(rows, *bench.parse_curve(bench.DEFAULT_CURVE))
    assert all(r["predicted"] == 0.0 for r in rows)  # no automatic budget behind a peer's trees
    # The repeating prompts hold SAM's chains: some steps verify more than the root.
    assert max(max(r["tree_sizes"]) for r in rows) > 1


@pytest.mark.parametrize("curve", ["1:10,x:3", "2:10,4:20", "1:10,4:0", "1:10,1:12"])
def test_a_malformed_curve_is_refused_with_what_was_expected(curve):
    with pytest.raises(ValueError, match="--curve: expected"):
        load_bench().parse_curve(curve)

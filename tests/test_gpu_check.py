"""benches/gpu_check.py, the prepared accelerator check, keeps working: its tiny CPU mode."""

import json

from scripts import load_script


def test_gpu_check_runs_in_its_tiny_cpu_mode(tmp_path):
    check = load_script("benches/gpu_check.py")
    out = tmp_path / "tiny.json"
    assert check.main(["--tiny", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [int(n) for n in report["cost_ms"]] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert report["new_tokens"] == 32
    # Its prompt repeats itself, so drafts are accepted: fewer passes than tokens.
    assert 0 < report["steps"] < report["new_tokens"] - 1 and report["tau"] > 1.0
    assert report["tree_vs_one_token_argmax_agreement"] == 1.0  # float64: a tree pass equals one-token passes
    assert sorted(int(b) for b in report["batches"]) == [1, 2, 4]
    for b, r in report["batches"].items():
        assert r["rows_equal"] == r["rows"] == int(b)  # float64: every batched row equals batched greedy's

"""benches/grouped_attention.py keeps working: its tiny mode, every pair the same bits."""

import json

from scripts import load_script


def test_grouped_attention_bench_runs_in_its_tiny_mode(tmp_path):
    bench = load_script("benches/grouped_attention.py")
    out = tmp_path / "rows.json"
    assert bench.main(["--tiny", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["context"], r["tokens"]) for r in rows] == [(16, 2), (16, 5), (64, 2), (64, 5)]
    assert all(r["same_bits"] for r in rows)

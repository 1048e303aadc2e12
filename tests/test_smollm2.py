"""The real SmolLM2-135M-Instruct (float32): identical output to plain greedy, tau > 1.5 on summarisation."""

import pytest
import recap
import torch
from recap.tools.prompts import load_prompts

try:
    from recap.tools.models import smollm2_path

    smollm2_path()
except (ModuleNotFoundError, FileNotFoundError) as e:  # ./dev.sh test installs it
    pytest.skip(str(e), allow_module_level=True)


@pytest.fixture(scope="module")
def smollm2():
    from recap.tools.models import load_smollm2

    return load_smollm2()


def test_the_kept_conversion_is_the_gguf_model_and_a_damaged_one_is_replaced(smollm2, monkeypatch, tmp_path):
    """The folder the first load writes holds the same weights and tokenizer as the GGUF file
    (the fixture loaded through it); a damaged folder is dropped and the GGUF file loads."""
    from recap.tools.models import converted_folder, load_smollm2

    model, tok = smollm2
    kept = converted_folder()
    assert kept is not None and (kept / "model.safetensors").exists()
    assert model.config.name_or_path == str(kept)
    monkeypatch.setenv("RECAP_MODEL_CACHE", "0")
    assert converted_folder() is None
    plain, plain_tok = load_smollm2()
    assert plain.config.name_or_path != str(kept)
    mine, theirs = model.state_dict(), plain.state_dict()
    assert sorted(mine) == sorted(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)
    text = "Summarise: the quick brown fox jumps over the lazy dog."
    assert encode(tok, text).tolist() == encode(plain_tok, text).tolist()
    assert tok.eos_token_id == plain_tok.eos_token_id
    monkeypatch.delenv("RECAP_MODEL_CACHE")
    monkeypatch.setenv("RECAP_MODEL_DIR", str(tmp_path))
    damaged = converted_folder()
    damaged.mkdir(parents=True)
    (damaged / "model.safetensors").write_bytes(b"not safetensors")
    again, _ = load_smollm2()
    assert not damaged.exists()  # dropped; the next load converts again
    assert torch.equal(again.lm_head.weight, plain.lm_head.weight)


def encode(tok, text):
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                  return_tensors="pt")
    return ids if isinstance(ids, torch.Tensor) else ids["input_ids"]


def test_chat_prompts_equal_greedy_and_summaries_reach_tau(smollm2):
    model, tok = smollm2
    dec = recap.Decoder(model, recap.RecapConfig(budget=16))
    prompts = load_prompts(per_set=1)
    assert {p.set for p in prompts} == {"mt_bench", "humaneval", "summarisation", "copy"}
    for p in prompts:
        ids = encode(tok, p.turns[0])
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=64)
        got = dec.generate(ids, max_new_tokens=64)
        assert got.tolist() == want.tolist(), p.id
        if p.set == "summarisation":
            assert dec.last_stats.tau > 1.5, dec.last_stats.as_dict()


def test_bench_command_runs_end_to_end_on_a_gguf_file(tmp_path, capsys):
    """`recap bench --model FILE.gguf` (the embedded model's own file): interleaved rounds, the
    one-line verdict first, the disturbance line, and the report on disk."""
    import json

    from recap.tools.cli import main
    from recap.tools.models import GGUF_NAME, smollm2_path

    gguf = str(smollm2_path() / GGUF_NAME)
    code = main(["bench", "--model", gguf, "--drafters", "recap@auto", "recap", "pld", "--sets", "summarisation",
                 "--per-set", "1", "--max-new-tokens", "8", "--out", str(tmp_path), "--quiet",
                 "--page", str(tmp_path / "page.md"), "--page-title", "Tiny run"])
    assert code == 0
    out = capsys.readouterr().out
    assert "recap@auto: " in out and "than greedy (interquartile" in out and "x 3 rounds" in out
    assert "Disturbance:" in out or "WARNING: these figures are unreliable" in out
    assert out.index("than greedy") < out.index("| drafter |")  # the verdict before the table
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["meta"]["rounds"] == 3 and report["meta"]["model"].startswith(gguf)
    assert {"ar_step_spread", "low_cpu_runs", "unreliable"} <= set(report["noise"])
    assert len([r for r in report["runs"] if r["label"] == "ar"]) == 3
    text = (tmp_path / "page.md").read_text()  # a page for docs/: what produced it, then what it measured
    assert text.startswith("# Tiny run") and "Written by `recap bench --model" in text and "| recap@auto |" in text
    assert "than greedy" in text and str(report["meta"]["commit"] or "unknown") in text


def test_bench_reports_agreement_in_reduced_precision(tmp_path):
    """--dtype bfloat16: the model runs in bfloat16, the report carries the dtype and an
    agreement figure per drafter, and differences from ar do not fail the command."""
    import json

    from recap.tools.cli import main

    code = main(["bench", "--drafters", "recap", "--dtype", "bfloat16", "--sets", "summarisation", "--per-set", "1",
                 "--max-new-tokens", "8", "--out", str(tmp_path), "--quiet"])
    assert code == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["meta"]["dtype"] == "bfloat16" and "bfloat16" in report["meta"]["model"]
    overall = report["summary"]["overall"]
    assert set(overall) == {"ar", "recap", "hf_pld"}
    assert all("first_divergence" in f and 0 <= f["mismatches"] <= f["prompts"] for f in overall.values())


def test_bench_saves_a_memory_and_starts_warm_from_it(tmp_path, capsys):
    import json

    from recap.tools.cli import main

    snap = tmp_path / "u.recapmem"
    assert main(["bench", "--drafters", "recap", "--no-anchor", "--sets", "summarisation", "--per-set", "1",
                 "--max-new-tokens", "8", "--out", str(tmp_path / "cold"), "--quiet", "--save-memory", str(snap)]) == 0
    rows = recap.PersistentMemory.inspect(str(snap))["rows"]
    assert rows > 0
    assert main(["bench", "--drafters", "recap", "--no-anchor", "--sets", "summarisation", "--per-set", "1",
                 "--skip", "1", "--max-new-tokens", "8", "--out", str(tmp_path / "warm"), "--quiet",
                 "--memory", str(snap)]) == 0
    assert f"'recap': {rows}" in capsys.readouterr().out
    meta = json.loads((tmp_path / "warm" / "bench.json").read_text())["meta"]
    assert meta["memory"] == str(snap) and meta["skip"] == 1


def test_bench_answers_only_the_first_turns_when_asked_and_reports_each_prompt(tmp_path):
    """--turns 1: MT-bench's second turns are not asked; bench.json carries each prompt's speedup."""
    import json

    from recap.tools.cli import main

    code = main(["bench", "--drafters", "recap", "--sets", "mt_bench", "--per-set", "1", "--turns", "1",
                 "--rounds", "1", "--max-new-tokens", "4", "--no-anchor", "--out", str(tmp_path), "--quiet"])
    assert code == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert {r["turn"] for r in report["runs"]} == {0}
    (prompt,) = report["per_prompt"]
    assert prompt.startswith("mt_bench/") and report["per_prompt"][prompt]["recap"]["speedup"] > 0
    assert "Per prompt" in (tmp_path / "bench.md").read_text()
    with pytest.raises(SystemExit):
        main(["bench", "--turns", "0"])

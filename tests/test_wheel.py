"""`pip install recap-rs` as a user does it: the abi3 wheel and the sdist are built with
maturin, the wheel is installed into a new virtual environment that does not see this
repository (its heavy dependencies borrowed from the test environment), and a short smoke
check runs there (the core, a drafter, and the decoder on a tiny random Llama equal to
`generate`)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest
import tomllib

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

SMOKE = textwrap.dedent("""
    import sys
    import recap, recap._core
    assert recap.__file__.startswith(sys.prefix), recap.__file__   # the installed wheel, not the repository
    import numpy as np
    d = recap.Drafter.recap(128, budget=8).session()
    d.begin(np.array([5, 6, 7, 5, 6], dtype=np.int64))
    assert len(d.propose()) >= 1
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg).to(torch.float64).eval()
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5]])
    want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16,
                          eos_token_id=None, pad_token_id=0)
    got = recap.Decoder(model, recap.RecapConfig(budget=8)).generate(ids, max_new_tokens=16, eos_token_id=None)
    assert got.tolist() == want.tolist(), (got.tolist(), want.tolist())
    print("smoke ok", recap.__version__)
""")


def run(cmd: list[str], cwd: Path, env: dict | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_wheel_installs_into_a_fresh_environment_and_decodes(tmp_path):
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "maturin", "build", "--release", "--out", str(dist)], ROOT)
    run([sys.executable, "-m", "maturin", "sdist", "--out", str(dist)], ROOT)
    wheels = list(dist.glob("recap_rs-*.whl"))
    sdists = list(dist.glob("recap_rs-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())
    wheel = wheels[0]
    assert "-abi3-" in wheel.name, wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("recap/_core") for n in names) and "recap/__main__.py" in names
    assert "recap/data/prompts.jsonl" in names and "recap/_core.pyi" in names
    sdist_names = tarfile.open(sdists[0]).getnames()
    for needed in ("pyproject.toml", "Cargo.toml", "rust/recap-core/src/lib.rs", "python/recap/decoding/decoder.py"):
        assert any(n.endswith(needed) for n in sdist_names), needed

    # The wheel declares what `pip install "recap-rs[torch]"` pulls in: the same requirements as
    # pyproject.toml (pip's own resolver is not what is under test here).
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = {line.split(":", 1)[1].strip() for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:")}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for need in project["dependencies"]:
        assert need in requires, (need, sorted(requires))
    for need in project["optional-dependencies"]["torch"]:
        assert any(r.startswith(need) and "extra == 'torch'" in r.replace('"', "'") for r in requires), (
            need, sorted(requires))

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    py = str(venv / "bin" / "python")
    run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", str(wheel)], tmp_path)
    # torch, transformers and numpy come from the test environment's site-packages, appended after the
    # new environment's own (a path line in a .pth file, so the editable install's own .pth there is
    # not read and the repository stays out of sight): a second multi-GB torch per run would fill the disk.
    site_new = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).strip()
    shared = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
    (Path(site_new) / "zz_test_deps.pth").write_text("".join(f"{d}\n" for d in shared))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    work = tmp_path / "elsewhere"
    work.mkdir()
    out = run([py, "-c", SMOKE], work, env)
    assert "smoke ok" in out
    help_text = run([py, "-m", "recap", "--help"], work, env)
    assert "bench" in help_text and "demo" in help_text

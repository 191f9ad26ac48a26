#!/usr/bin/env bash
# The drop-in against vLLM 0.33.0's own LookupKeyClient, called from Python, in one run
# (bench/python/drop_in_vs_vllm.py): builds `lookup-server` and the wheel of ./python
# with the release profile, installs the wheel into a venv of its own (the tests' venv
# keeps its debug build), downloads vLLM's wheel as scripts/python/test.sh does, and
# prints the script's JSON line. `cargo xtask bench --python` runs it.
#
# Environment: PYTHON (default python3), MOONCAKE_BENCH_VENV (default
# <CARGO_TARGET_DIR>/python-bench-venv), VLLM_WHEEL_DIR (default
# <repo>/target/vllm-wheel), CARGO_TARGET_DIR. Extra arguments go to the script.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
VENV="${MOONCAKE_BENCH_VENV:-$CARGO_TARGET_DIR/python-bench-venv}"
PYTHON="${PYTHON:-python3}"
WHEEL_DIR="${VLLM_WHEEL_DIR:-$ROOT/target/vllm-wheel}"

source "$ROOT/scripts/python/env.sh"

echo "== building lookup-server (release)" >&2
cargo build --quiet --release -p lookup-cli --bin lookup-server
echo "== pip install ./python (release profile; maturin builds the Rust extension, several" \
    "minutes on 2 cores the first time, pip shows no progress meanwhile)" >&2
started=$SECONDS
MATURIN_PEP517_ARGS="--profile release" "${PIP[@]}" install --quiet --force-reinstall --no-deps "$ROOT/python"
echo "== pip install ./python: done in $((SECONDS - started)) s" >&2

cd "$ROOT"
exec "$VENV/bin/python" bench/python/drop_in_vs_vllm.py \
    --lookup-server "$CARGO_TARGET_DIR/release/lookup-server" --wheel "$WHEEL" "$@"

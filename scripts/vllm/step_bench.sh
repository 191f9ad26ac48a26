#!/usr/bin/env bash
# What a scheduler step pays for its lookups in vLLM 0.33.0's own loop
# (scripts/vllm/step_bench.py): builds `lookup-server` and the wheel of ./python with the
# release profile, installs the wheel into the bench venv (scripts/python/bench.sh's),
# adds what vLLM's loaded scheduling modules import (msgspec, numpy, psutil, urllib3;
# scripts/vllm/fidelity/test.sh's pins), downloads vLLM's wheel as
# scripts/python/test.sh does, and prints the script's JSON line (its table goes to
# stderr). A full run (3 clients, 32/256/1,024 waiting, steady and burst, 0.1 and
# 0.5 ms) takes about 10 minutes on 2 cores.
#
# Environment: PYTHON (default python3), MOONCAKE_BENCH_VENV (default
# <CARGO_TARGET_DIR>/python-bench-venv), VLLM_WHEEL_DIR (default
# <repo>/target/vllm-wheel), CARGO_TARGET_DIR, SKIP_BUILD=1 (use what is installed).
# Extra arguments go to the script.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
VENV="${MOONCAKE_BENCH_VENV:-$CARGO_TARGET_DIR/python-bench-venv}"
PYTHON="${PYTHON:-python3}"
WHEEL_DIR="${VLLM_WHEEL_DIR:-$ROOT/target/vllm-wheel}"

source "$ROOT/scripts/python/env.sh"
"${PIP[@]}" install --quiet "msgspec==0.23.0" "numpy==2.4.6" "psutil==7.2.2" "urllib3==2.5.0"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
    echo "== building lookup-server (release)" >&2
    cargo build --quiet --release -p lookup-cli --bin lookup-server
    echo "== pip install ./python (release profile)" >&2
    MATURIN_PEP517_ARGS="--profile release" "${PIP[@]}" install --quiet --force-reinstall --no-deps "$ROOT/python"
fi

cd "$ROOT"
exec "$VENV/bin/python" scripts/vllm/step_bench.py \
    --lookup-server "$CARGO_TARGET_DIR/release/lookup-server" --wheel "$WHEEL" "$@"

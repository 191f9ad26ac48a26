#!/usr/bin/env bash
# Runs the vLLM 0.33 fidelity harness's tests (scripts/vllm/fidelity/test_*.py) against
# vLLM 0.33.0's own scheduler, read from its released wheel (downloaded once, without
# dependencies, into target/vllm-wheel by scripts/python/env.sh). Installs into the
# project venv what the loaded vLLM modules import: msgspec and numpy (the scheduler),
# psutil and urllib3 (vLLM's ZeroMQ helpers, for the Mooncake store connector's test;
# pyzmq comes from env.sh). All from PyPI, about 50 MB; no torch, no build. About 10 s
# once the venv and the wheel are there.
#
# Environment: PYTHON (default python3), VLLM_VENV (default <repo>/.venv),
# VLLM_WHEEL_DIR (default <repo>/target/vllm-wheel). Extra arguments go to pytest.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
WHEEL_DIR="${VLLM_WHEEL_DIR:-$ROOT/target/vllm-wheel}"

source "$ROOT/scripts/python/env.sh"
"${PIP[@]}" install --quiet "msgspec==0.23.0" "numpy==2.4.6" "psutil==7.2.2" "urllib3==2.5.0"

cd "$ROOT"
MOONCAKE_LOOKUP_VLLM_WHEEL="$WHEEL" exec "$VENV/bin/python" -m pytest -q scripts/vllm/fidelity "$@"

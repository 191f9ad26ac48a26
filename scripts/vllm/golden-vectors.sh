#!/usr/bin/env bash
# Regenerates crates/vllm-block-hash/tests/golden/vllm-0.33.0.json by running vLLM
# 0.33.0's own block-hash and store-key functions, taken from the released wheel.
#
# Only the needed functions are extracted from the wheel's sources (golden_vectors.py
# reads them with `ast`); vLLM itself is never imported (it needs torch). cbor2 (the
# one extra package vLLM's `sha256_cbor` needs) is installed into the project-local
# venv `.venv`, as scripts/mooncake/install.sh does for the Mooncake wheel.
#
# Environment: PYTHON (default python3), VLLM_VENV (default <repo>/.venv),
# VLLM_WHEEL_DIR (where the ~340 MB wheel is kept; default <repo>/target/vllm-wheel).
set -euo pipefail

VLLM_VERSION="0.33.0"
CBOR2="cbor2==6.2.1"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
WHEEL_DIR="${VLLM_WHEEL_DIR:-$ROOT/target/vllm-wheel}"
OUT="$ROOT/crates/vllm-block-hash/tests/golden/vllm-$VLLM_VERSION.json"

if [ ! -x "$VENV/bin/python" ]; then
    echo "== creating venv $VENV" >&2
    "$PYTHON" -m venv "$VENV"
fi
# Read the whole output first: `grep -q` closing the pipe early fails `pip` under pipefail.
SHOWN="$("$VENV/bin/python" -m pip show cbor2 2>/dev/null || true)"
if ! grep -q "^Version: ${CBOR2#cbor2==}\$" <<<"$SHOWN"; then
    echo "== installing $CBOR2 into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$CBOR2"
fi

WHEEL="$(ls "$WHEEL_DIR"/vllm-"$VLLM_VERSION"-*.whl 2>/dev/null | head -n 1 || true)"
if [ -z "$WHEEL" ]; then
    echo "== downloading vllm==$VLLM_VERSION (wheel only, no dependencies) into $WHEEL_DIR" >&2
    mkdir -p "$WHEEL_DIR"
    "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check \
        --no-deps --only-binary=:all: -d "$WHEEL_DIR" "vllm==$VLLM_VERSION"
    WHEEL="$(ls "$WHEEL_DIR"/vllm-"$VLLM_VERSION"-*.whl | head -n 1)"
fi

SRC="$(mktemp -d)"
trap 'rm -rf "$SRC"' EXIT
# The only sources read: hashing, block hashing, the connector's key code.
"$VENV/bin/python" - "$WHEEL" "$SRC" <<'PY'
import sys, zipfile
wanted = [
    "vllm/utils/hashing.py",
    "vllm/utils/math_utils.py",
    "vllm/v1/core/kv_cache_utils.py",
    "vllm/multimodal/utils.py",
    "vllm/v1/utils.py",
    "vllm/v1/kv_cache_layout.py",
    "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/data.py",
    "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/coordinator.py",
    "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py",
]
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in wanted:
        z.extract(name, sys.argv[2])
PY

mkdir -p "$(dirname "$OUT")"
"$VENV/bin/python" "$ROOT/scripts/vllm/golden_vectors.py" "$SRC" "$VLLM_VERSION" >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "$OUT"

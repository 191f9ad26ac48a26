# Sourced by scripts/python/test.sh and bench.sh: the venv (created if missing, with
# pytest and pyzmq) and vLLM 0.33.0's released wheel (downloaded once, without
# dependencies). Reads VENV, PYTHON, WHEEL_DIR; sets PIP (an array) and WHEEL.
VLLM_VERSION="0.33.0"
if [ ! -x "$VENV/bin/python" ]; then
    echo "== creating venv $VENV" >&2
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install --quiet "pytest>=8" "pyzmq==27.3.0"

WHEEL="$(ls "$WHEEL_DIR"/vllm-"$VLLM_VERSION"-*.whl 2>/dev/null | head -n 1 || true)"
if [ -z "$WHEEL" ]; then
    echo "== downloading vllm==$VLLM_VERSION (wheel only, no dependencies) into $WHEEL_DIR" >&2
    mkdir -p "$WHEEL_DIR"
    "${PIP[@]}" download --quiet --no-deps --only-binary=:all: -d "$WHEEL_DIR" "vllm==$VLLM_VERSION"
    WHEEL="$(ls "$WHEEL_DIR"/vllm-"$VLLM_VERSION"-*.whl | head -n 1)"
fi

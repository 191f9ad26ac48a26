#!/usr/bin/env bash
# Installs the real Mooncake master and Python client for the tests, idempotently:
# Debian's libibverbs1 (the wheel's only missing shared library; no RDMA hardware is
# used with protocol "tcp"), Debian's etcd-server (the masters' leader election in
# high-availability mode), the pinned PyPI wheel and pyzmq (the Python lookup server
# `cargo xtask calibrate` measures, and the interop tests' peer) into the
# project-local venv `.venv`, and the masters of the other releases users run
# (`spec/mooncake-master-rpc.md`, "Master releases") unpacked under
# `.venv/releases/<version>/`: 0.3.10 (`mooncake-transfer-engine-non-cuda`, with its own
# Python client) and 0.3.14 (`mooncake-transfer-engine-cuda13`, the only 0.3.14 build;
# its master runs without a GPU, its Python client needs libcuda and is not used).
# Prints the path of the pinned `mooncake_master` on its last line.
#
# Environment: PYTHON (default python3, must be CPython 3.11 for the wheel),
# MOONCAKE_VENV (default <repo>/.venv), MOONCAKE_RELEASES (default "0.3.10 0.3.14";
# empty for none).
set -euo pipefail

WHEEL="mooncake-transfer-engine-non-cuda==0.3.13.post1"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${MOONCAKE_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

# Installs a Debian package unless it is installed already; refreshes the package
# lists only when the first attempt fails (they may be missing or stale).
ensure_deb() {
    local status
    status="$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)"
    if [ "$status" != "install ok installed" ]; then
        echo "== installing $1 (Debian)" >&2
        export DEBIAN_FRONTEND=noninteractive
        if ! apt-get install -y -q "$1" >/dev/null 2>&1; then
            apt-get update -q >/dev/null
            apt-get install -y -q "$1" >/dev/null
        fi
    fi
}

ensure_deb libibverbs1
# etcd for the high-availability tests: the masters elect their leader in it, and the
# clients find the leader there (`spec/mooncake-master-rpc.md`, "High availability").
# The tests start their own etcd on loopback; the package's service is not used.
ensure_deb etcd-server
if ! command -v etcd >/dev/null; then
    echo "error: etcd not found on PATH after installing etcd-server" >&2
    exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "== creating venv $VENV" >&2
    "$PYTHON" -m venv "$VENV"
fi

# Read the whole output first: `grep -q` closing the pipe early fails `pip` under pipefail.
SHOWN="$("$VENV/bin/python" -m pip show mooncake-transfer-engine-non-cuda 2>/dev/null || true)"
if ! grep -q '^Version: 0\.3\.13\.post1$' <<<"$SHOWN"; then
    echo "== installing $WHEEL into $VENV (~46 MB)" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$WHEEL"
fi

PYZMQ="pyzmq==27.3.0"
if ! "$VENV/bin/python" -c 'import zmq, sys; sys.exit(zmq.__version__ != "27.3.0")' 2>/dev/null; then
    echo "== installing $PYZMQ into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$PYZMQ"
fi

MASTER="$VENV/bin/mooncake_master"
if [ ! -x "$MASTER" ]; then
    echo "error: $MASTER not found after installing $WHEEL" >&2
    exit 1
fi
# The import is the check that the shared libraries resolve.
"$VENV/bin/python" -c "from mooncake.store import MooncakeDistributedStore" >&2

# Other releases: the wheel downloaded (no dependencies, no install) and unpacked, so
# several versions sit side by side; run from the unpacked `mooncake/` folder, with
# the libraries the wheel bundles beside it in `*.libs/`.
wheel_of() {
    case "$1" in
        0.3.10) echo "mooncake-transfer-engine-non-cuda==0.3.10" ;;
        0.3.14) echo "mooncake-transfer-engine-cuda13==0.3.14" ;;
        *) echo "error: no wheel known for Mooncake $1" >&2; return 1 ;;
    esac
}
# Whether the master at $1 runs: `--version` exits 0 and names it. The 0.3.10 build
# now and then hangs in `--version` (seen once in 24 runs on a loaded machine), so each try
# is bounded and the check tries three times.
master_runs() {
    local try out
    for try in 1 2 3; do
        if out="$(timeout 20 "$1" --version 2>&1)" && [[ "$out" == *mooncake_master* ]]; then
            return 0
        fi
    done
    return 1
}

for VERSION in ${MOONCAKE_RELEASES-0.3.10 0.3.14}; do
    DIR="$VENV/releases/$VERSION"
    if [ ! -x "$DIR/mooncake/mooncake_master" ]; then
        SPEC="$(wheel_of "$VERSION")"
        echo "== fetching the $VERSION master ($SPEC) into $DIR" >&2
        TMP="$(mktemp -d)"
        "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check \
            --no-deps --python-version 3.11 --only-binary=:all: -d "$TMP" "$SPEC"
        rm -rf "$DIR"
        mkdir -p "$DIR"
        "$VENV/bin/python" -m zipfile -e "$TMP"/*.whl "$DIR"
        rm -rf "$TMP"
        chmod +x "$DIR/mooncake/mooncake_master"
    fi
    # The check that the master's shared libraries resolve.
    if ! master_runs "$DIR/mooncake/mooncake_master"; then
        echo "error: the $VERSION master at $DIR does not run:" >&2
        timeout 20 "$DIR/mooncake/mooncake_master" --version >&2 || true
        exit 1
    fi
    # 0.3.10's masters take only its own client's calls: its Python client runs from
    # the unpacked folder on PYTHONPATH (0.3.14's master takes the pinned client's).
    if [ "$VERSION" = 0.3.10 ]; then
        PYTHONPATH="$DIR" "$VENV/bin/python" -c \
            "import mooncake.store, sys; sys.exit(not mooncake.store.__file__.startswith('$DIR'))" >&2
    fi
done
echo "$MASTER"

#!/usr/bin/env bash
# Installs the real Mooncake master and Python client for the tests, idempotently:
# Debian's libibverbs1 (the wheel's only missing shared library; no RDMA hardware is
# used with protocol "tcp"), Debian's etcd-server (the masters' leader election in
# high-availability mode), the pinned PyPI wheel and pyzmq (the Python lookup server
# `cargo xtask calibrate` measures, and the interop tests' peer) into the
# project-local venv `.venv`. Prints the path of `mooncake_master` on its last line.
#
# Environment: PYTHON (default python3, must be CPython 3.11 for the wheel),
# MOONCAKE_VENV (default <repo>/.venv).
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
echo "$MASTER"

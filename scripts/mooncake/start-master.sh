#!/usr/bin/env bash
# Starts the real mooncake_master on loopback in the background and waits until its
# RPC port accepts connections (it takes ~0.1 s; gives up after 15 s).
#
# Usage: start-master.sh [RPC_PORT [METRICS_PORT]]     (free ports when omitted)
# Prints shell assignments to eval:
#   MOONCAKE_MASTER_PID=1234 MOONCAKE_MASTER_ADDR=127.0.0.1:PORT MOONCAKE_MASTER_LOG=FILE
# Stop it with `kill "$MOONCAKE_MASTER_PID"`.
#
# Environment: MOONCAKE_MASTER_BIN (default <repo>/.venv/bin/mooncake_master, from
# scripts/mooncake/install.sh; another release's is .venv/releases/<version>/mooncake/
# mooncake_master), MOONCAKE_MASTER_LOG (default: a new temp file).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="${MOONCAKE_MASTER_BIN:-$ROOT/.venv/bin/mooncake_master}"
if [ ! -x "$BIN" ]; then
    echo "error: mooncake_master not found at $BIN: run scripts/mooncake/install.sh" >&2
    exit 1
fi

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
RPC_PORT="${1:-$(free_port)}"
METRICS_PORT="${2:-$(free_port)}"
LOG="${MOONCAKE_MASTER_LOG:-$(mktemp -t mooncake-master.XXXXXX.log)}"

# Masters before 0.3.11 (e.g. .venv/releases/0.3.10) have no -metrics_host: their admin
# port binds every interface.
# (The whole help is read first: `grep -q` closing the pipe early fails it under pipefail.)
METRICS_HOST=()
HELP="$("$BIN" --helpfull 2>&1 || true)"
if grep -q -- '-metrics_host' <<<"$HELP"; then
    METRICS_HOST=(--metrics_host=127.0.0.1)
fi
"$BIN" --rpc_address=127.0.0.1 --rpc_port="$RPC_PORT" \
    "${METRICS_HOST[@]}" --metrics_port="$METRICS_PORT" \
    </dev/null >"$LOG" 2>&1 &
PID=$!

for _ in $(seq 1 750); do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "error: mooncake_master exited early; log $LOG:" >&2
        tail -n 20 "$LOG" >&2
        exit 1
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$RPC_PORT") 2>/dev/null; then
        echo "MOONCAKE_MASTER_PID=$PID MOONCAKE_MASTER_ADDR=127.0.0.1:$RPC_PORT MOONCAKE_MASTER_LOG=$LOG"
        exit 0
    fi
    sleep 0.02
done
kill "$PID" 2>/dev/null || true
echo "error: mooncake_master did not listen on 127.0.0.1:$RPC_PORT within 15 s; log $LOG" >&2
exit 1

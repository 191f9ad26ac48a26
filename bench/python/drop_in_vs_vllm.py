"""The drop-in (mooncake_lookup.LookupKeyClient) against vLLM 0.33.0's own
LookupKeyClient (from its wheel, python/tests/conftest.py), called from Python, in the
same run, against the same `lookup-server` (a separate process at vLLM's ipc path).

For each client:
- `submit`: the first `lookup(non_block=True)` of a request (starts it, answers None);
- `ready`: the `lookup(non_block=True)` call that returns the result;
  both timed with `time.perf_counter_ns()` around the one call, in a loop that admits
  `--arrivals-per-step` requests per step, polls the others once, then sleeps
  `--step-us` (a forward pass); p50 / p99 nearest rank (index round(q * (n - 1)));
- `lookups_per_s`: `--count` blocking `lookup(non_block=False)` calls one after the
  other (N=1), divided by their elapsed time.
Every answer is checked: `wrong` counts those that are not the preloaded hit.

Usage: drop_in_vs_vllm.py --lookup-server PATH --wheel VLLM_WHEEL [--count 5000]
Prints one JSON object.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "tests"))
from conftest import load_vllm_classes, vllm_config  # noqa: E402

import mooncake_lookup  # noqa: E402

BS = 16
HASHES = [bytes([i % 256]) * 32 for i in range(64)]
NUM_TOKENS = len(HASHES) * BS + 1
HIT = len(HASHES) * BS


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))] if values else 0


def probe_loop(client, prefix, count, per_step, step_us):
    submit, ready, waiting, wrong, next_id, done = [], [], [], 0, 0, 0
    clock = time.perf_counter_ns
    while done < count:
        still = []
        for rid in waiting:
            t0 = clock()
            got = client.lookup(rid, NUM_TOKENS, HASHES, non_block=True)
            dt = clock() - t0
            if got is None:
                still.append(rid)
            else:
                ready.append(dt)
                wrong += got.hit_length != HIT
                done += 1
        waiting = still
        for _ in range(per_step):
            if next_id >= count:
                break
            rid = f"{prefix}{next_id}"
            next_id += 1
            t0 = clock()
            got = client.lookup(rid, NUM_TOKENS, HASHES, non_block=True)
            submit.append(clock() - t0)
            if got is None:
                waiting.append(rid)
            else:
                wrong += got.hit_length != HIT
                done += 1
        time.sleep(step_us / 1e6)
    return {
        "submit_p50_ns": pct(submit, 0.5), "submit_p99_ns": pct(submit, 0.99),
        "ready_p50_ns": pct(ready, 0.5), "ready_p99_ns": pct(ready, 0.99),
        "ready_n": len(ready), "wrong": wrong,
    }


def throughput(client, prefix, count):
    wrong = 0
    start = time.perf_counter()
    for i in range(count):
        wrong += client.lookup(f"{prefix}{i}", NUM_TOKENS, HASHES).hit_length != HIT
    return {"lookups_per_s": round(count / (time.perf_counter() - start)), "wrong": wrong}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lookup-server", required=True)
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--arrivals-per-step", type=int, default=8)
    ap.add_argument("--step-us", type=float, default=1000.0)
    args = ap.parse_args()
    base = tempfile.mkdtemp()
    os.environ["VLLM_RPC_BASE_PATH"] = base
    vllm = load_vllm_classes(args.wheel)
    preload = os.path.join(base, "present.txt")
    with open(preload, "w") as f:
        f.writelines(h.hex() + "\n" for h in HASHES)
    server = subprocess.Popen(
        [args.lookup_server, "--base-path", base, "--hostname", socket.gethostname(),
         "--block-size", str(BS), "--preload", preload], stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()
        out = {}
        for name, make in (("vllm", vllm.LookupKeyClient), ("drop_in", mooncake_lookup.LookupKeyClient)):
            client = make(vllm_config(BS))
            throughput(client, "w", 200)  # warm-up
            row = throughput(client, "t", args.count)
            row.update(probe_loop(client, "p", args.count, args.arrivals_per_step, args.step_us))
            client.close()
            out[name] = row
        out["submit_p50_ratio"] = round(out["vllm"]["submit_p50_ns"] / max(1, out["drop_in"]["submit_p50_ns"]), 1)
        out["ready_p50_ratio"] = round(out["vllm"]["ready_p50_ns"] / max(1, out["drop_in"]["ready_p50_ns"]), 1)
        print(json.dumps(out))
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()

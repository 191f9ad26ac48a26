"""The drop-in (mooncake_lookup.LookupKeyClient) against vLLM 0.33.0's own
LookupKeyClient (from its wheel, python/tests/conftest.py), called from Python, in the
same run, against the same `lookup-server` (a separate process at vLLM's ipc path).

Every lookup is 64 block hashes of 32 bytes, num_tokens 64 x 16 + 1, all stored: every
answer must be 1,024 hit tokens (`wrong` counts the others). In each of `--reps`
repetitions, for vLLM's client then the drop-in:
- `n1_lookups_per_s`: `--count` blocking `lookup(non_block=False)` calls one after the
  other (N=1), divided by their elapsed time;
- `prefetch_lookups_per_s`: `--count` lookups in batches of `--batch` requests that
  arrive together: each is started (vLLM: its first `lookup(non_block=True)`; the
  drop-in: `prefetch`, `lookup_prefetch_limit` = the batch, `max_in_flight` 4), then all
  are polled with `lookup(non_block=True)` until every one has answered, sleeping
  `--poll-sleep-us` between two rounds of polls;
- `submit_*` / `ready_*`: the first `lookup(non_block=True)` of a request (starts it,
  answers None) and the call that returns the result, each timed with
  `time.perf_counter_ns()` around the one call, in a loop that admits
  `--arrivals-per-step` requests per step, polls the others once, then sleeps
  `--step-us` (a forward pass); p50 / p99 nearest rank (index round(q * (n - 1)));
  `timer_ns` is the median of an empty timed region, included in every figure. The
  drop-in runs the loop twice: as is, and under `defer_sends(True)` with one timed
  `flush()` per step after its submits (`deferred_*`, `deferred_flush_*`: the
  connector's mode, where a step's submits wake the I/O thread once, at its flush).

Floors, timed in the same loop shape (`--arrivals-per-step` calls per step, then the
step's sleep), in every repetition right before its clients (this machine's speed
moves between repetitions, so a call is read against the floor of its own
repetition): `floor_native_call_ns`, the p50 of the drop-in's cheapest native method
(`tracked_requests()`, no argument); `floor_hash_copy_ns`, the p50 of
`b"".join(HASHES)`, CPython's own C copy of the 64 hashes into one buffer: the least a
submit that reads the hashes spends on them. The settings give their medians over the
repetitions.

Usage: drop_in_vs_vllm.py --lookup-server PATH --wheel VLLM_WHEEL [--reps 5]
Prints one JSON object: {"settings": {...}, "reps": [{"vllm": row, "drop_in": row,
"floors": {...}}]}.
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


def probe_loop(client, prefix, count, per_step, step_us, flush=False):
    """The loop of the docstring; with `flush`, also one timed `client.flush()` per
    step after its submits (the drop-in under `defer_sends`: the step's submits handed
    to the I/O thread together, as the connector does in `build_connector_meta`)."""
    submit, ready, waiting, wrong, next_id, done, flushes = [], [], [], 0, 0, 0, []
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
        if flush:
            t0 = clock()
            client.flush()
            flushes.append(clock() - t0)
        time.sleep(step_us / 1e6)
    out = {
        "submit_p50_ns": pct(submit, 0.5), "submit_p99_ns": pct(submit, 0.99),
        "ready_p50_ns": pct(ready, 0.5), "ready_p99_ns": pct(ready, 0.99),
        "ready_n": len(ready), "wrong": wrong,
    }
    if flush:
        out.update(flush_p50_ns=pct(flushes, 0.5), flush_p99_ns=pct(flushes, 0.99))
    return out


def timer_ns():
    clock = time.perf_counter_ns
    spans = []
    for _ in range(10_000):
        t0 = clock()
        spans.append(clock() - t0)
    return pct(spans, 0.5)


def floors(client, per_step, steps, step_us):
    """The floors of the docstring: two loops shaped like `probe_loop`'s steps, each call
    written out (a callable passed in would add a Python frame to the timed region)."""
    clock, native = time.perf_counter_ns, client._native
    calls, copies = [], []
    for _ in range(steps):
        for _ in range(per_step):
            t0 = clock()
            native.tracked_requests()
            calls.append(clock() - t0)
        time.sleep(step_us / 1e6)
    for _ in range(steps):
        for _ in range(per_step):
            t0 = clock()
            b"".join(HASHES)
            copies.append(clock() - t0)
        time.sleep(step_us / 1e6)
    return {"floor_native_call_ns": pct(calls, 0.5), "floor_hash_copy_ns": pct(copies, 0.5)}


def prefetch_throughput(client, prefix, count, batch, start, poll_sleep_us):
    """`count` lookups in batches of `batch`: all started by `start(client, rid)`, then
    polled until every one answered, `poll_sleep_us` between two rounds of polls (a
    scheduler polls once per step; a busy loop would hold the GIL that vLLM's lookup
    thread needs)."""
    wrong, done = 0, 0
    t0 = time.perf_counter()
    while done < count:
        ids = [f"{prefix}{done + i}" for i in range(min(batch, count - done))]
        for rid in ids:
            start(client, rid)
        while ids:
            still = []
            for rid in ids:
                got = client.lookup(rid, NUM_TOKENS, HASHES, non_block=True)
                if got is None:
                    still.append(rid)
                else:
                    wrong += got.hit_length != HIT
                    done += 1
            ids = still
            if ids:
                time.sleep(poll_sleep_us / 1e6)
    return {"prefetch_lookups_per_s": round(count / (time.perf_counter() - t0)), "wrong": wrong}


def vllm_start(client, rid):
    """vLLM's client starts a lookup with its first non-blocking call."""
    got = client.lookup(rid, NUM_TOKENS, HASHES, non_block=True)
    assert got is None or got.hit_length == HIT


def drop_in_start(client, rid):
    client.prefetch(rid, NUM_TOKENS, HASHES)


def throughput(client, prefix, count):
    wrong = 0
    start = time.perf_counter()
    for i in range(count):
        wrong += client.lookup(f"{prefix}{i}", NUM_TOKENS, HASHES).hit_length != HIT
    return {"n1_lookups_per_s": round(count / (time.perf_counter() - start)), "wrong": wrong}


def measure(name, make, args, rep):
    """One repetition's row of client `name`."""
    wrong = 0
    # Every request has the same hashes: the drop-in must not share one RPC between
    # lookups in flight together (rule 16), or it would count lookups never asked.
    ours = {"lookup_share": False} if name == "drop_in" else {}
    client = make(vllm_config(BS, **ours))
    try:
        throughput(client, f"w{rep}-", args.warmup)
        row = throughput(client, f"t{rep}-", args.count)
        wrong += row.pop("wrong")
        probe = probe_loop(client, f"p{rep}-", args.probe_count, args.arrivals_per_step, args.step_us)
        wrong += probe.pop("wrong")
        row.update(probe)
        if name == "drop_in":
            # The connector's mode: a step's submits wait for its one flush.
            client.defer_sends(True)
            deferred = probe_loop(client, f"d{rep}-", args.probe_count,
                                  args.arrivals_per_step, args.step_us, flush=True)
            client.defer_sends(False)
            wrong += deferred.pop("wrong")
            row.update({f"deferred_{k}": v for k, v in deferred.items()})
    finally:
        client.close()
    extra = {"lookup_prefetch_limit": args.batch, "max_in_flight": 4, **ours}
    client = make(vllm_config(BS, **extra)) if name == "drop_in" else make(vllm_config(BS))
    try:
        start = drop_in_start if name == "drop_in" else vllm_start
        got = prefetch_throughput(
            client, f"f{rep}-", args.count, args.batch, start, args.poll_sleep_us)
        wrong += got.pop("wrong")
        row.update(got)
    finally:
        client.close()
    row["wrong"] = wrong
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lookup-server", required=True)
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--probe-count", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--arrivals-per-step", type=int, default=8)
    ap.add_argument("--step-us", type=float, default=1000.0)
    ap.add_argument("--poll-sleep-us", type=float, default=50.0)
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
        reps = []
        for rep in range(args.reps):
            client = mooncake_lookup.LookupKeyClient(vllm_config(BS))
            try:
                got = {"floors": floors(client, args.arrivals_per_step,
                                        max(1, args.probe_count // args.arrivals_per_step),
                                        args.step_us)}
            finally:
                client.close()
            got.update({
                name: measure(name, make, args, rep)
                for name, make in (("vllm", vllm.LookupKeyClient),
                                   ("drop_in", mooncake_lookup.LookupKeyClient))
            })
            reps.append(got)
        settings = {k: v for k, v in vars(args).items() if k not in ("lookup_server", "wheel")}
        settings.update({key: pct([r["floors"][key] for r in reps], 0.5)
                         for key in ("floor_native_call_ns", "floor_hash_copy_ns")})
        settings.update(timer_ns=timer_ns(), python=sys.version.split()[0], vllm="0.33.0",
                        blocks=len(HASHES), hash_len=32, block_size=BS)
        print(json.dumps({"settings": settings, "reps": reps}))
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()

"""The Python design of vLLM's asynchronous lookup (vLLM #45659), as a baseline.

Written from spec/wire.md alone: one worker thread (a ThreadPoolExecutor with one
worker), a dict of futures keyed by request id, and a pyzmq REQ socket that carries
one `tagged-blob` lookup at a time. `lookup(..., non_block=True)` submits the lookup
on the first call for a request id and answers None while the future is pending
("retry on a later step"); once the future is done it pops it and answers the hit
tokens (the first read consumes the result, as in #45659).

`cargo xtask bench` runs it in two modes and reads the one JSON object it prints on
stdout (one line):

- `--mode batch` (throughput): `--count` lookups in batches of `--batch` requests:
  each batch is submitted at once with `lookup(non_block=True)` (as arrivals would),
  then each result is waited for with `lookup(non_block=False)`, which blocks on the
  future. `lookups_per_s` is `count / elapsed_s`.
- `--mode probe` (caller cost): a scheduler-like loop. Each step admits
  `--arrivals-per-step` new requests (their first `lookup(non_block=True)` call
  submits the lookup), then calls `lookup(non_block=True)` once for every request
  that arrived in an earlier step and is not answered yet, then sleeps `--step-us`
  microseconds (the model's forward pass). Every call is timed with
  `time.perf_counter_ns()`; `calls` gives, per kind, the number of calls `n` and the
  nearest-rank percentiles `p50_ns` and `p99_ns` (index round(q * (n - 1)) of the
  sorted times, halves rounded up: the rule the Rust side uses too):
    - `submit`: the first call of a request (submits to the worker, answers None);
    - `pending`: a later call while the future is not done (answers None);
    - `ready`: the call that finds the future done (pops it, answers the hit);
    - `all`: the three pooled.
  `timer_ns` is the median of an empty timed region (two back-to-back
  `perf_counter_ns()` calls): included in every call time, not subtracted.

Every answer is checked against `--expect-hit`; `wrong` counts the others (a failed
RPC answers 0). Exit status 2 with a message on stderr when the endpoint is silent
for `--timeout-s` seconds.
"""

import argparse
import json
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import zmq


class AsyncLookupClient:
    """Scheduler-side lookup client with vLLM's async design (#45659)."""

    def __init__(self, endpoint: str, timeout_s: float):
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.REQ)
        # Linger 0: closing with an unanswered request must not hang the process.
        self._sock.setsockopt(zmq.LINGER, 0)
        # vLLM sets no timeout; the benchmark does, so that a dead server fails the run
        # instead of hanging it.
        self._sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
        self._sock.connect(endpoint)
        self._executor = ThreadPoolExecutor(max_workers=1)
        self._futures = {}

    def _rpc(self, num_tokens: int, hashes: bytes, hash_len: int) -> int:
        self._sock.send_multipart(
            [b"lookup", struct.pack(">I", num_tokens), struct.pack(">H", hash_len), hashes]
        )
        reply = self._sock.recv()
        if len(reply) < 4 or (len(reply) - 4) % 8 != 0:
            return 0
        return struct.unpack(">I", reply[:4])[0]

    def lookup(self, request_id, num_tokens: int, hashes: bytes, hash_len: int, non_block=True):
        fut = self._futures.get(request_id)
        if fut is None:
            fut = self._executor.submit(self._rpc, num_tokens, hashes, hash_len)
            self._futures[request_id] = fut
        if non_block and not fut.done():
            return None
        del self._futures[request_id]
        return fut.result()

    def close(self):
        self._executor.shutdown(wait=True)
        self._sock.close(0)
        self._ctx.term()


def percentile(sorted_values, q):
    """Nearest rank: the value at index round(q * (n - 1)), halves rounded up as Rust's
    f64::round does (Python's round() would round them to even); 0 when empty."""
    if not sorted_values:
        return 0
    i = min(len(sorted_values) - 1, int(q * (len(sorted_values) - 1) + 0.5))
    return sorted_values[i]


def summary(values):
    values = sorted(values)
    return {"n": len(values), "p50_ns": percentile(values, 0.5), "p99_ns": percentile(values, 0.99)}


def timer_overhead_ns(samples=10000):
    clock = time.perf_counter_ns
    times = []
    for _ in range(samples):
        t0 = clock()
        times.append(clock() - t0)
    times.sort()
    return percentile(times, 0.5)


def run_batch(client, args, payload, expect_hit):
    """Throughput: batches submitted at once, then each waited for."""
    wrong = 0
    next_id = 0
    start = time.perf_counter()
    while next_id < args.count:
        ids = range(next_id, min(args.count, next_id + args.batch))
        next_id += len(ids)
        pending = []
        for rid in ids:
            hit = client.lookup(rid, *payload, non_block=True)
            if hit is None:
                pending.append(rid)
            else:
                # Answered before the first check returned: consumed already.
                wrong += hit != expect_hit
        for rid in pending:
            hit = client.lookup(rid, *payload, non_block=False)
            wrong += hit != expect_hit
    elapsed = time.perf_counter() - start
    return elapsed, wrong, {}


def run_probe(client, args, payload, expect_hit):
    """Caller cost: a scheduler loop that polls with non_block=True once per step."""
    clock = time.perf_counter_ns
    times = {"submit": [], "pending": [], "ready": []}
    wrong = 0
    waiting = []  # request ids that arrived in an earlier step, not answered yet
    next_id = 0
    answered = 0
    start = time.perf_counter()
    while answered < args.count:
        still = []
        for rid in waiting:
            t0 = clock()
            hit = client.lookup(rid, *payload, non_block=True)
            dt = clock() - t0
            if hit is None:
                times["pending"].append(dt)
                still.append(rid)
            else:
                times["ready"].append(dt)
                wrong += hit != expect_hit
                answered += 1
        waiting = still
        for _ in range(args.arrivals_per_step):
            if next_id >= args.count:
                break
            rid = next_id
            next_id += 1
            t0 = clock()
            hit = client.lookup(rid, *payload, non_block=True)
            dt = clock() - t0
            times["submit"].append(dt)
            if hit is None:
                waiting.append(rid)
            else:
                wrong += hit != expect_hit
                answered += 1
        time.sleep(args.step_us / 1e6)
    elapsed = time.perf_counter() - start
    calls = {kind: summary(values) for kind, values in times.items()}
    calls["all"] = summary(times["submit"] + times["pending"] + times["ready"])
    return elapsed, wrong, calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", required=True, help="ipc://PATH or tcp://HOST:PORT")
    ap.add_argument("--mode", choices=["batch", "probe"], default="batch")
    ap.add_argument("--count", type=int, default=2000, help="lookups (requests) measured")
    ap.add_argument("--batch", type=int, default=64, help="batch mode: requests submitted at once")
    ap.add_argument("--arrivals-per-step", type=int, default=8, help="probe mode: new requests per step")
    ap.add_argument("--step-us", type=float, default=1000.0, help="probe mode: sleep per step (µs)")
    ap.add_argument("--warmup", type=int, default=100, help="lookups before measuring")
    ap.add_argument("--hashes", type=int, default=64, help="block hashes per lookup")
    ap.add_argument("--hash-len", type=int, default=32, help="bytes per hash")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per block")
    ap.add_argument("--expect-hit", type=int, default=None, help="hit tokens every lookup must get")
    ap.add_argument("--timeout-s", type=float, default=10.0, help="give up on a silent server")
    args = ap.parse_args()
    if args.count < 1 or args.batch < 1 or args.arrivals_per_step < 1:
        ap.error("--count, --batch and --arrivals-per-step must be at least 1")

    # Hash i is `hash_len` bytes of value i % 256: the same bytes as the Rust side.
    hashes = b"".join(bytes([i % 256]) * args.hash_len for i in range(args.hashes))
    num_tokens = args.hashes * args.block_size + 1
    payload = (num_tokens, hashes, args.hash_len if args.hashes else 0)
    expect_hit = args.expect_hit if args.expect_hit is not None else args.hashes * args.block_size

    client = AsyncLookupClient(args.endpoint, args.timeout_s)
    try:
        for i in range(args.warmup):
            client.lookup(("warmup", i), *payload, non_block=False)
        timer_ns = timer_overhead_ns()
        run = run_batch if args.mode == "batch" else run_probe
        elapsed, wrong, calls = run(client, args, payload, expect_hit)
    except zmq.Again:
        print(f"no reply from {args.endpoint} within {args.timeout_s} s", file=sys.stderr)
        sys.exit(2)
    finally:
        client.close()
    print(
        json.dumps(
            {
                "mode": args.mode,
                "count": args.count,
                "elapsed_s": elapsed,
                "lookups_per_s": args.count / elapsed,
                "wrong": wrong,
                "timer_ns": timer_ns,
                "calls": calls,
            }
        )
    )


if __name__ == "__main__":
    main()

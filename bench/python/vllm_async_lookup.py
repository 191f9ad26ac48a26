"""The Python design of vLLM's asynchronous lookup (vLLM #45659), as a baseline.

Written from spec/wire.md alone: one worker thread (a ThreadPoolExecutor with one
worker), a dict of futures keyed by request id, and a pyzmq REQ socket that carries
one `tagged-blob` lookup at a time. `lookup(..., non_block=True)` answers None while
the future is pending ("retry on a later step"), and pops the future once done.

Prints one JSON object on stdout:
  lookups_per_s      throughput of `count` lookups submitted at once, then polled
  probe_ns_p50/p99   caller time of one `lookup(non_block=True)` call (pending or done)
"""

import argparse
import json
import struct
import time
from concurrent.futures import ThreadPoolExecutor

import zmq


class AsyncLookupClient:
    """Scheduler-side lookup client with vLLM's async design."""

    def __init__(self, endpoint: str):
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.REQ)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._executor = ThreadPoolExecutor(max_workers=1)
        self._futures = {}

    def _rpc(self, num_tokens: int, hashes: list) -> int:
        hash_len = len(hashes[0]) if hashes else 0
        self._sock.send_multipart(
            [b"lookup", struct.pack(">I", num_tokens), struct.pack(">H", hash_len), b"".join(hashes)]
        )
        reply = self._sock.recv()
        if len(reply) < 4 or (len(reply) - 4) % 8 != 0:
            return 0
        return struct.unpack(">I", reply[:4])[0]

    def lookup(self, request_id: str, num_tokens: int, hashes: list, non_block: bool = True):
        fut = self._futures.get(request_id)
        if fut is None:
            fut = self._executor.submit(self._rpc, num_tokens, hashes)
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
    if not sorted_values:
        return 0
    i = min(len(sorted_values) - 1, int(round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--count", type=int, default=2000, help="lookups in the throughput run")
    ap.add_argument("--hashes", type=int, default=64, help="block hashes per lookup")
    ap.add_argument("--hash-len", type=int, default=32, help="bytes per hash")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per block")
    args = ap.parse_args()

    client = AsyncLookupClient(args.endpoint)
    hashes = [bytes([i % 256]) * args.hash_len for i in range(args.hashes)]
    num_tokens = args.hashes * args.block_size + 1

    # Warm up the connection.
    while client.lookup("warm", num_tokens, hashes, non_block=True) is None:
        time.sleep(0.0001)

    # Throughput: every request submitted at once (as arrivals would), then polled
    # the way a scheduler polls its waiting queue.
    probe_ns = []
    start = time.perf_counter()
    pending = set()
    for i in range(args.count):
        rid = f"r{i}"
        t0 = time.perf_counter_ns()
        r = client.lookup(rid, num_tokens, hashes, non_block=True)
        probe_ns.append(time.perf_counter_ns() - t0)
        if r is None:
            pending.add(rid)
    while pending:
        for rid in list(pending):
            t0 = time.perf_counter_ns()
            r = client.lookup(rid, num_tokens, hashes, non_block=True)
            probe_ns.append(time.perf_counter_ns() - t0)
            if r is not None:
                pending.discard(rid)
        if pending:
            time.sleep(0.0002)
    elapsed = time.perf_counter() - start
    client.close()
    probe_ns.sort()
    print(
        json.dumps(
            {
                "lookups_per_s": args.count / elapsed,
                "probe_ns_p50": percentile(probe_ns, 0.5),
                "probe_ns_p99": percentile(probe_ns, 0.99),
                "probes": len(probe_ns),
            }
        )
    )


if __name__ == "__main__":
    main()

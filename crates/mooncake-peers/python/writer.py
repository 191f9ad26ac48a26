#!/usr/bin/env python3
"""A Mooncake Store client that the Rust tests drive over stdin/stdout.

It writes blocks with the real Python client (`mooncake.store.MooncakeDistributedStore`)
and answers existence questions with its `batch_is_exist`, so the tests compare our
Rust client with the reference one on the same keys. It stays alive between
commands because the master drops a client's keys when that client closes.

Usage: writer.py MASTER_ADDR        (e.g. 127.0.0.1:50051; no etcd: P2PHANDSHAKE)

Commands, one per line, keys separated by spaces (keys never contain whitespace);
every command gets exactly one answer line:

  put KEY...          -> "ok N" (N keys stored, 1-byte values, one put_batch) | "err CODE"
  remove KEY...       -> "ok N" (forced: probing grants read leases) | "err CODE"
  exist KEY...        -> "exist R..." (batch_is_exist: 1 present, 0 absent, -1 error)
  bench N KEY...      -> "bench T..." (N timed batch_is_exist calls, nanoseconds each)
  quit                -> "bye", then exits
Anything else        -> "err unknown command"

It prints "ready" once the client is set up. The C++ library logs to stdout and
stderr; the protocol uses a private duplicate of the original stdout so that those
logs can never be mistaken for answers.
"""

import os
import sys
import time

# Keep the protocol channel private before the native library is loaded.
PROTO = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)

from mooncake.store import MooncakeDistributedStore  # noqa: E402

GLOBAL_SEGMENT_SIZE = 64 << 20  # bytes this client lends to the store
LOCAL_BUFFER_SIZE = 16 << 20  # bytes of local transfer buffer
VALUE = b"x"  # existence is all that is asked: the smallest value


def answer(line):
    PROTO.write(line + "\n")
    PROTO.flush()


def main():
    if len(sys.argv) != 2:
        print("usage: writer.py MASTER_ADDR", file=sys.stderr)
        return 2
    store = MooncakeDistributedStore()
    rc = store.setup(
        "127.0.0.1",
        "P2PHANDSHAKE",
        GLOBAL_SEGMENT_SIZE,
        LOCAL_BUFFER_SIZE,
        "tcp",
        "",
        sys.argv[1],
    )
    if rc != 0:
        answer(f"err setup {rc}")
        return 1
    answer("ready")
    for line in sys.stdin:
        words = line.split()
        if not words:
            answer("err empty command")
            continue
        cmd, args = words[0], words[1:]
        if cmd == "put":
            # One batched put per line, as vLLM's worker stores a request's blocks
            # (per-key puts cost the master ~13x the RPCs and compete with lookups).
            rc = store.put_batch(args, [VALUE] * len(args)) if args else 0
            answer(f"err {rc}" if rc != 0 else f"ok {len(args)}")
        elif cmd == "remove":
            failed = [rc for rc in (store.remove(k, True) for k in args) if rc != 0]
            answer(f"err {failed[0]}" if failed else f"ok {len(args)}")
        elif cmd == "exist":
            found = store.batch_is_exist(args) if args else []
            answer("exist " + " ".join(str(int(r)) for r in found))
        elif cmd == "bench":
            reps, keys = int(args[0]), args[1:]
            times = []
            for _ in range(reps):
                start = time.perf_counter_ns()
                store.batch_is_exist(keys)
                times.append(time.perf_counter_ns() - start)
            answer("bench " + " ".join(str(t) for t in times))
        elif cmd == "quit":
            answer("bye")
            break
        else:
            answer("err unknown command")
    # Closing unregisters the segment (1-2 s); a killed writer's keys vanish too.
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
